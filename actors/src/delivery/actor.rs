//! The delivery actor: lives for one step (an attempt and its outcome), then
//! stops; the supervisor's timer starts it again when the next attempt is
//! due. Persist before effect: the attempt is durable before the request
//! goes out, the outcome before the next timer is armed.

use super::core::{decide_due, decide_outcome, DeliveryEvent, DeliveryState};
use super::due_key;
use crate::account::{AccountCmd, Reply};
use crate::store::{Batch, Head, NewEvent, StoreError, Ticket};
use crate::supervisor::{internal, Supervisor};
use actix::prelude::*;
use relay_schemas::{DeliveryStatus, RelayError};
use std::time::Duration;
use tokio::sync::oneshot;

#[derive(Message)]
#[rtype(result = "()")]
pub struct Watch(pub oneshot::Sender<DeliveryStatus>);

pub struct DeliveryActor {
    sup: Supervisor,
    stream: String,
    head: Head,
    state: DeliveryState,
    /// The due-index entry currently stored for this delivery.
    indexed_due_ms: Option<u64>,
    last_ticket: Option<Ticket>,
    watchers: Vec<oneshot::Sender<DeliveryStatus>>,
}

impl DeliveryActor {
    pub fn load(sup: Supervisor, stream: &str, watch: Option<oneshot::Sender<DeliveryStatus>>) -> Result<Self, StoreError> {
        let mut state = DeliveryState::default();
        let mut head = Head::default();
        let mut indexed_due_ms = None;
        for ev in sup.store().read(stream, 0) {
            let ev = ev?;
            let event: DeliveryEvent = serde_json::from_str(ev.data.get()).map_err(|e| StoreError::Corrupt {
                stream: stream.to_owned(),
                seq: ev.seq,
                what: e.to_string(),
            })?;
            match &event {
                DeliveryEvent::Accepted { first_due_ms, .. } => indexed_due_ms = Some(*first_due_ms),
                DeliveryEvent::AttemptFailed { next_due_ms, .. } => indexed_due_ms = Some(*next_due_ms),
                _ => {}
            }
            state.apply(&event);
            head = ev.head();
        }
        Ok(DeliveryActor {
            sup,
            stream: stream.to_owned(),
            head,
            state,
            indexed_due_ms,
            last_ticket: None,
            watchers: watch.into_iter().collect(),
        })
    }

    fn persist(&mut self, events: Vec<DeliveryEvent>, extra: impl FnOnce(&mut Batch)) -> Result<(), RelayError> {
        let store = self.sup.store();
        let mut batch = store.batch();
        let at = self.sup.clock().now();
        let new: Result<Vec<_>, _> = events
            .iter()
            .map(|e| {
                Ok::<_, serde_json::Error>(NewEvent {
                    event_type: e.event_type().into(),
                    version: DeliveryEvent::VERSION,
                    at,
                    data: serde_json::to_vec(e)?,
                })
            })
            .collect();
        let head = batch.append(&self.stream, self.head, new.map_err(|e| internal(&e))?);
        extra(&mut batch);
        self.last_ticket = Some(store.commit(batch).map_err(|e| internal(&e))?);
        self.head = head;
        for e in &events {
            self.state.apply(e);
        }
        Ok(())
    }

    fn durable(&self) -> impl std::future::Future<Output = Result<(), RelayError>> + 'static {
        let wait = self.last_ticket.map(|t| self.sup.store().durable(t));
        async move {
            match wait {
                Some(w) => w.await.map_err(|e| RelayError::unavailable(e.to_string())),
                None => Ok(()),
            }
        }
    }

    fn tell_watchers(&mut self) {
        let status = self.state.status();
        for w in self.watchers.drain(..) {
            let _ = w.send(status.clone());
        }
    }

    /// A step could not be recorded (store trouble): try again later from
    /// the index, which still holds this delivery.
    fn retry_later(&mut self, ctx: &mut Context<Self>, why: &RelayError) {
        tracing::warn!(stream = %self.stream, error = %why, "delivery step failed; retrying later");
        self.sup.schedule(self.stream.clone(), self.sup.clock().now_ms() + 1000);
        self.tell_watchers();
        ctx.stop();
    }

    fn step_due(&mut self, ctx: &mut Context<Self>) {
        if self.state.params.is_none() {
            tracing::error!(stream = %self.stream, "delivery without acceptance; dropping index entry");
            self.remove_index(ctx);
            return;
        }
        if self.state.finished.is_some() {
            return self.report(ctx);
        }
        let now = self.sup.clock().now_ms();
        let events = decide_due(&self.state, now, &self.sup.policy().relay_id);
        if let Err(e) = self.persist(events, |_| {}) {
            return self.retry_later(ctx, &e);
        }
        if self.state.finished.is_some() {
            return self.report(ctx);
        }
        let attempt = self.state.attempts;
        let params = self.state.params.clone().expect("checked above");
        let digest = self.state.digest.clone();
        let to = self.state.to.clone();
        let sup = self.sup.clone();
        let timeout = Duration::from_millis(sup.policy().attempt_timeout_ms);
        let durable = self.durable();
        let attempt_fut = async move {
            durable.await?;
            match tokio::time::timeout(timeout, sup.deliver_local(&to, params, digest)).await {
                Ok(r) => r,
                Err(_) => Err(RelayError::unavailable("delivery attempt timed out")),
            }
        };
        ctx.wait(attempt_fut.into_actor(self).map(move |outcome, act, ctx| act.step_outcome(attempt, outcome, ctx)));
    }

    fn step_outcome(&mut self, attempt: u32, outcome: Result<DeliveryStatus, RelayError>, ctx: &mut Context<Self>) {
        let now = self.sup.clock().now_ms();
        let events = decide_outcome(&self.state, attempt, outcome, now, &self.sup.policy());
        let next_due = events.iter().find_map(|e| match e {
            DeliveryEvent::AttemptFailed { next_due_ms, .. } => Some(*next_due_ms),
            _ => None,
        });
        let (old, stream) = (self.indexed_due_ms, self.stream.clone());
        let result = self.persist(events, |batch| {
            if let Some(next) = next_due {
                if let Some(old) = old {
                    batch.kv_remove(&due_key(old, &stream));
                }
                batch.kv_put(&due_key(next, &stream), b"");
            }
        });
        if let Err(e) = result {
            return self.retry_later(ctx, &e);
        }
        if let Some(next) = next_due {
            self.indexed_due_ms = Some(next);
            let durable = self.durable();
            let (sup, stream) = (self.sup.clone(), self.stream.clone());
            ctx.wait(durable.into_actor(self).map(move |_, act, ctx| {
                sup.schedule(stream, next);
                act.tell_watchers();
                ctx.stop();
            }));
        } else if self.state.finished.is_some() {
            self.report(ctx);
        } else {
            self.tell_watchers();
            ctx.stop();
        }
    }

    /// Terminal: tell the sender's account (idempotent), then drop the index
    /// entry. A crash in between re-reports on restart.
    fn report(&mut self, ctx: &mut Context<Self>) {
        let status = self.state.status();
        let (sup, from, message_id) = (self.sup.clone(), self.state.from.clone(), self.state.message_id.clone());
        let durable = self.durable();
        let fut = async move {
            durable.await?;
            match sup.ask(&from, AccountCmd::RecordDelivery { message_id, status }).await? {
                Reply::Status(_) => Ok(()),
                _ => Err(RelayError::internal("unexpected reply")),
            }
        };
        ctx.wait(fut.into_actor(self).map(|res, act, ctx| match res {
            Ok(()) => act.remove_index(ctx),
            Err(e) => act.retry_later(ctx, &e),
        }));
    }

    fn remove_index(&mut self, ctx: &mut Context<Self>) {
        if let Some(due) = self.indexed_due_ms.take() {
            let store = self.sup.store();
            let mut batch = store.batch();
            batch.kv_remove(&due_key(due, &self.stream));
            if let Err(e) = store.commit(batch) {
                tracing::warn!(stream = %self.stream, error = %e, "cannot drop due index entry");
            }
        }
        self.tell_watchers();
        ctx.stop();
    }
}

impl Actor for DeliveryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.step_due(ctx);
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.tell_watchers();
        self.sup.delivery_stopped(&self.stream);
    }
}

impl Handler<Watch> for DeliveryActor {
    type Result = ();
    fn handle(&mut self, msg: Watch, _ctx: &mut Self::Context) {
        self.watchers.push(msg.0);
    }
}
