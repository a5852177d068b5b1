//! Realtime notifications to connected devices (PROTOCOL §3, §4).
//!
//! The transport registers each authenticated connection here with a
//! bounded queue. Accounts publish after their writes are durable. Publishing
//! never waits: a connection whose queue is full is closed with
//! [`Push::Close`] reason `slow consumer`, and its device catches up with
//! `message.timeline.sync` from its cursor when it reconnects — the timeline,
//! not the queue, is the source of truth, so nothing is lost.

use relay_schemas::methods::notifications::{self, DeliveryChanged, TimelineChanged};
use relay_schemas::objects::DeliveryStatus;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;

/// What a connection's writer receives.
#[derive(Clone, Debug, PartialEq)]
pub enum Push {
    /// A notification frame `{"method","params"}`.
    Notify { method: &'static str, params: Value },
    /// Close the connection with this reason.
    Close { reason: String },
}

impl Push {
    pub fn timeline_changed(account_id: &str, sequence: u64) -> Self {
        let params = TimelineChanged { account_id: account_id.to_owned(), sequence };
        Push::Notify { method: notifications::TIMELINE_CHANGED, params: params_value(&params) }
    }

    /// The sequence a `message.timeline.changed` push announces.
    pub fn timeline_sequence(&self) -> Option<u64> {
        match self {
            Push::Notify { method, params } if *method == notifications::TIMELINE_CHANGED => {
                params["sequence"].as_u64()
            }
            _ => None,
        }
    }

    pub fn delivery_changed(message_id: &str, status: &DeliveryStatus) -> Self {
        let params =
            DeliveryChanged { message_id: message_id.to_owned(), status: status.status, error: status.error.clone() };
        Push::Notify { method: notifications::DELIVERY_CHANGED, params: params_value(&params) }
    }
}

/// The latest timeline sequence a connection has announced to its device.
/// A connection registers for pushes before it reads the device's backlog
/// (so that no record falls between the two): a record appended in between
/// is announced by the backlog and again by a push queued behind it, which
/// tells the device nothing new. Pushes of one account come in sequence
/// order (the account's outbox), and a device told of N syncs through N:
/// a push at or below the last announced is never news.
#[derive(Debug, Default)]
pub struct Announced(Option<u64>);

impl Announced {
    /// Whether `push` is news to the device; a timeline change that is,
    /// is remembered.
    pub fn news(&mut self, push: &Push) -> bool {
        match push.timeline_sequence() {
            Some(seq) if self.0.is_some_and(|last| seq <= last) => false,
            Some(seq) => {
                self.0 = Some(seq);
                true
            }
            None => true,
        }
    }
}

/// Notification params as a JSON value (members sorted, as the frame
/// writer has always sent them). They are plain data: this cannot fail.
fn params_value<T: serde::Serialize>(params: &T) -> Value {
    serde_json::to_value(params).unwrap_or(Value::Null)
}

/// A registered connection's handle, returned by [`Notifier::attach`].
pub struct Attached {
    pub id: u64,
    pub rx: mpsc::Receiver<Push>,
}

struct Conn {
    id: u64,
    device_id: String,
    tx: mpsc::Sender<Push>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Connected devices by account. Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    conns: Arc<Mutex<HashMap<String, Vec<Conn>>>>,
    next_id: Arc<AtomicU64>,
    queue: usize,
}

impl Notifier {
    /// `queue`: how many pushes may wait for one slow connection.
    pub fn new(queue: usize) -> Self {
        Notifier { conns: Default::default(), next_id: Default::default(), queue: queue.max(1) }
    }

    pub fn attach(&self, account_id: &str, device_id: &str) -> Attached {
        let (tx, rx) = mpsc::channel(self.queue);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.conns).entry(account_id.to_owned()).or_default().push(Conn {
            id,
            device_id: device_id.to_owned(),
            tx,
        });
        Attached { id, rx }
    }

    pub fn detach(&self, account_id: &str, id: u64) {
        let mut conns = lock(&self.conns);
        if let Some(list) = conns.get_mut(account_id) {
            list.retain(|c| c.id != id);
            if list.is_empty() {
                conns.remove(account_id);
            }
        }
    }

    /// Whether `device_id` of `account_id` has an open, attached connection.
    pub fn is_connected(&self, account_id: &str, device_id: &str) -> bool {
        lock(&self.conns).get(account_id).is_some_and(|list| list.iter().any(|c| c.device_id == device_id))
    }

    /// Connected devices of all accounts.
    pub fn connections(&self) -> usize {
        lock(&self.conns).values().map(Vec::len).sum()
    }

    /// Sends `push` to the account's connections whose device `to` accepts;
    /// a full queue closes that connection instead of waiting.
    fn publish(&self, account_id: &str, to: impl Fn(&str) -> bool, push: &Push) {
        let mut conns = lock(&self.conns);
        let Some(list) = conns.get_mut(account_id) else { return };
        list.retain(|c| {
            if !to(&c.device_id) {
                return true;
            }
            match c.tx.try_send(push.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // The writer reads the queue in order, so this lands after
                    // what is queued; a writer that is stuck is dropped below.
                    let reason = "slow consumer: reconnect and sync from your cursor".to_owned();
                    tracing::info!(account = account_id, device = %c.device_id, "closing slow connection");
                    let _ = c.tx.try_send(Push::Close { reason });
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// A record was appended (and is durable); `visible` are the devices that
    /// may read it.
    pub fn timeline_changed(&self, account_id: &str, sequence: u64, visible: &[String]) {
        let push = Push::timeline_changed(account_id, sequence);
        self.publish(account_id, |d| visible.iter().any(|v| v == d), &push);
    }

    /// A sent message's delivery status changed: every connected device of
    /// the sending account hears it.
    pub fn delivery_changed(&self, account_id: &str, message_id: &str, status: &DeliveryStatus) {
        self.publish(account_id, |_| true, &Push::delivery_changed(message_id, status));
    }

    /// Ends the connections of a device (revoked) with `reason`.
    pub fn disconnect(&self, account_id: &str, device_id: &str, reason: &str) {
        let mut conns = lock(&self.conns);
        if let Some(list) = conns.get_mut(account_id) {
            list.retain(|c| {
                if c.device_id != device_id {
                    return true;
                }
                // A full queue cannot take the close: dropping the sender ends
                // the writer all the same.
                let _ = c.tx.try_send(Push::Close { reason: reason.to_owned() });
                false
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_announced_with_the_backlog_is_not_announced_again_by_its_queued_push() {
        let n = Notifier::new(8);
        let mut phone = n.attach("acct", "phone");
        // Record 3 lands after the registration, before the backlog is read.
        n.timeline_changed("acct", 3, &["phone".into()]);
        let backlog = Push::timeline_changed("acct", 3);
        let mut announced = Announced::default();
        assert!(announced.news(&backlog));
        assert!(!announced.news(&phone.rx.try_recv().unwrap()), "record 3 again");
        n.timeline_changed("acct", 4, &["phone".into()]);
        assert!(announced.news(&phone.rx.try_recv().unwrap()), "record 4 is news");
        assert!(!announced.news(&Push::timeline_changed("acct", 2)));
        // Other notifications are never held back.
        let status = Push::delivery_changed("m-1", &DeliveryStatus::delivering(1));
        assert!(announced.news(&status) && announced.news(&status));
    }

    #[test]
    fn timeline_notification_reaches_only_devices_in_the_visible_set() {
        let n = Notifier::new(8);
        let mut phone = n.attach("acct", "phone");
        let mut laptop = n.attach("acct", "laptop");
        n.timeline_changed("acct", 7, &["phone".into()]);
        assert_eq!(phone.rx.try_recv().unwrap(), Push::timeline_changed("acct", 7));
        assert!(laptop.rx.try_recv().is_err());
    }

    #[test]
    fn delivery_notification_reaches_every_device_of_the_sender() {
        let n = Notifier::new(8);
        let mut phone = n.attach("acct", "phone");
        let mut laptop = n.attach("acct", "laptop");
        let st = DeliveryStatus::target_accepted(5);
        n.delivery_changed("acct", "m", &st);
        assert_eq!(phone.rx.try_recv().unwrap(), Push::delivery_changed("m", &st));
        assert_eq!(laptop.rx.try_recv().unwrap(), Push::delivery_changed("m", &st));
    }

    #[test]
    fn notification_frames_keep_their_wire_bytes() {
        let text = |p: Push| match p {
            Push::Notify { method, params } => format!("{method} {params}"),
            Push::Close { .. } => unreachable!(),
        };
        assert_eq!(
            text(Push::timeline_changed("acct", 7)),
            r#"message.timeline.changed {"account_id":"acct","sequence":7}"#
        );
        assert_eq!(
            text(Push::delivery_changed("m", &DeliveryStatus::target_accepted(5))),
            r#"message.delivery.changed {"message_id":"m","status":"target_accepted"}"#
        );
        let failed = DeliveryStatus::failed(5, relay_schemas::RelayError::not_found("gone"));
        assert_eq!(
            text(Push::delivery_changed("m", &failed)),
            r#"message.delivery.changed {"error":{"code":"not_found","message":"gone"},"message_id":"m","status":"failed"}"#
        );
    }

    #[test]
    fn full_queue_closes_the_slow_connection_without_touching_the_others() {
        let n = Notifier::new(2);
        let mut slow = n.attach("acct", "slow");
        let mut fast = n.attach("acct", "fast");
        let all = ["slow".to_string(), "fast".to_string()];
        for seq in 1..=5 {
            n.timeline_changed("acct", seq, &all);
            assert_eq!(fast.rx.try_recv().unwrap(), Push::timeline_changed("acct", seq));
        }
        assert_eq!(n.connections(), 1, "the slow connection was dropped");
        assert_eq!(slow.rx.try_recv().unwrap(), Push::timeline_changed("acct", 1));
        assert_eq!(slow.rx.try_recv().unwrap(), Push::timeline_changed("acct", 2));
        assert!(slow.rx.try_recv().is_err(), "its sender is gone: the writer ends");
    }

    #[test]
    fn disconnect_ends_only_the_revoked_devices_connections() {
        let n = Notifier::new(8);
        let mut phone = n.attach("acct", "phone");
        let _laptop = n.attach("acct", "laptop");
        n.disconnect("acct", "phone", "device revoked");
        assert_eq!(phone.rx.try_recv().unwrap(), Push::Close { reason: "device revoked".into() });
        assert_eq!(n.connections(), 1);
    }
}
