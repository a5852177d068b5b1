//! `push.subscribe`, `push.unsubscribe` and gone subscriptions (PROTOCOL §9).

use super::*;

fn push_params(n: u8) -> relay_schemas::methods::PushSubscribeParams {
    parse(&json!({
        "endpoint": format!("https://push.example/sub/{n}"),
        "keys": {"p256dh": relay_schemas::encoding::b64_encode(&[4u8; 65]), "auth": relay_schemas::encoding::b64_encode(&[n; 16])}
    }))
}

fn subscribed(device: &str, n: u8) -> AccountEvent {
    let s = given_alice([]);
    decide::push_subscribe(&s, device, &push_params(n)).unwrap().remove(0)
}

#[test]
fn push_subscribe_binds_to_the_session_device_and_a_new_one_replaces_it() {
    let s = given_alice([subscribed("phone", 1)]);
    assert_eq!(s.push["phone"].endpoint, "https://push.example/sub/1");
    assert!(decide::push_subscribe(&s, "phone", &push_params(1)).unwrap().is_empty(), "same subscription: no-op");
    let s = given_alice([subscribed("phone", 1), subscribed("phone", 2)]);
    assert_eq!(s.push["phone"].endpoint, "https://push.example/sub/2");
    assert_eq!(s.push.len(), 1);
}

#[test]
fn push_unsubscribe_removes_it_and_revoking_the_device_does_too() {
    let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2)]);
    let events = decide::push_unsubscribe(&s, "phone");
    let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2), events[0].clone()]);
    assert!(!s.push.contains_key("phone"));
    assert!(decide::push_unsubscribe(&s, "phone").is_empty(), "nothing left to remove");
    let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2), device_revoked(&alice(), "laptop")]);
    assert!(!s.push.contains_key("laptop"), "a revoked device's subscription leaves with it");
    assert!(s.push.contains_key("phone"));
}

#[test]
fn a_gone_endpoint_drops_only_the_subscription_it_belongs_to() {
    let s = given_alice([subscribed("phone", 1), subscribed("phone", 2)]);
    assert!(decide::push_gone(&s, "phone", "https://push.example/sub/1").is_empty(), "resubscribed since");
    let events = decide::push_gone(&s, "phone", "https://push.example/sub/2");
    assert!(matches!(&events[..], [AccountEvent::PushUnsubscribed { reason, .. }] if reason == "gone"));
}

#[test]
fn push_goes_only_to_subscribed_visible_devices_without_a_websocket() {
    let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2)]);
    let targets = |visible: &[&str], sender: Option<&str>, connected: &[&str]| -> Vec<String> {
        let visible: Vec<String> = visible.iter().map(|v| v.to_string()).collect();
        decide::push_targets(&s, &visible, sender, |d| connected.contains(&d), UnixSecs(NOW))
            .into_iter()
            .map(|(d, _)| d.to_owned())
            .collect()
    };
    assert_eq!(targets(&["phone", "laptop"], None, &[]), ["laptop", "phone"]);
    assert_eq!(targets(&["phone"], None, &[]), ["phone"], "laptop may not read the record");
    assert_eq!(targets(&["phone", "laptop"], None, &["phone"]), ["laptop"], "phone has a socket open");
    assert_eq!(targets(&["phone", "laptop"], Some("laptop"), &[]), ["phone"], "the sending device knows");
    assert!(targets(&["tablet"], None, &[]).is_empty(), "no subscription");
    let s = given_alice([subscribed("phone", 1), device_revoked(&alice(), "laptop"), subscribed("laptop", 2)]);
    let visible = vec!["laptop".to_string()];
    assert!(
        decide::push_targets(&s, &visible, None, |_| false, UnixSecs(NOW)).is_empty(),
        "revoked devices get nothing"
    );
}

/// A push sink that records what it is offered: (device, sequence, endpoint).
#[derive(Default)]
struct Offers(std::sync::Mutex<Vec<(String, u64, String)>>);

impl crate::push::PushSink for Offers {
    fn offer(&self, job: crate::push::PushJob) {
        self.0.lock().unwrap().push((job.device_id, job.sequence, job.subscription.endpoint));
    }
}

/// The record's pushes go to the subscriptions its devices had when it was
/// written: a `push.subscribe` handled between the record's write and its
/// notification (sent once the write is durable) gets no push for it.
#[actix_rt::test]
async fn a_subscription_made_after_a_record_was_written_gets_no_push_for_it() {
    use crate::account::{stream_id, AccountCmd};
    use crate::delivery::NoPeers;
    use crate::store::{Head, NewEvent, Store};
    use crate::{ManualClock, Supervisor};
    use std::sync::Arc;

    let store = Store::temporary().unwrap();
    let events: Vec<NewEvent> = alice_history()
        .iter()
        .map(|e| NewEvent::new(e.event_type(), AccountEvent::VERSION, UnixSecs(NOW), e).unwrap())
        .collect();
    let mut batch = store.batch();
    batch.append(&stream_id(&alice().id), Head::default(), events);
    store.commit_durable_blocking(batch).unwrap();
    let sup = Supervisor::new(store, POLICY.clone(), ManualClock::at_ms(NOW * 1000), Arc::new(NoPeers));
    let offers = Arc::new(Offers::default());
    sup.set_push_sink(offers.clone());
    let id = alice().id;
    // Phone → Alice herself, readable by the laptop (the sending phone gets no push).
    let self_send = |n: u32| {
        let v = alice_to_self(n, &["phone", "laptop"]);
        AccountCmd::MessageSend { device: "phone".into(), params: parse(&v), digest: digest(&v), route: None }
    };
    let subscribe = AccountCmd::PushSubscribe { device: "laptop".into(), params: push_params(1) };

    // Both asked before either is answered: the actor handles the subscription
    // while record 1's reply and notification wait for durability.
    let (sent, subscribed) = futures_util::future::join(sup.ask(&id, self_send(1)), sup.ask(&id, subscribe)).await;
    sent.unwrap();
    subscribed.unwrap();
    // A later record, written with the subscription in place, is pushed.
    sup.ask(&id, self_send(2)).await.unwrap();
    // Its notification is published before this command is handled.
    sup.ask(&id, AccountCmd::AccountDevicesGet).await.unwrap();
    let endpoint = "https://push.example/sub/1".to_string();
    assert_eq!(*offers.0.lock().unwrap(), [("laptop".to_string(), 2, endpoint)]);
}
