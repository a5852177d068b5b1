//! The delivery actor: lives for one step (an attempt and its outcome), then
//! stops; the scheduler's timer starts it again when the next attempt is
//! due. Each step is a command through the one loop (`Shell::run`); what
//! follows it (the attempt, the timer, the report of an end) is this
//! file's. Persist before effect: the attempt is durable before the request
//! goes out, the outcome before the next timer is armed.

use super::shared::{self, due_key, LocalFuture, Recorded, ReportOutcome, Settlement, Transport};
use crate::metrics::{DestinationLabels, Metrics};
use crate::routes::RouteBook;
use crate::shell::{EventSourced, Rides, Shell, Stream};
use crate::store::{Batch, Head, Store, StoreError, StoredEvent, Ticket};
use actix::prelude::*;
use relay_core::aggregate::Aggregate;
use relay_core::clock::SharedClock;
use relay_core::delivery::aggregate::{
    combine, other_home_to_ask, route_to_learn, DeliveryCmd, DeliveryCtx, DeliveryDecision, DeliveryEvent,
    DeliveryState, STEP_RETRY_MS,
};
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::delivery::route_lookup::RouteLookup;
use relay_core::policy::Policy;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::DeliveryStatus;
use relay_schemas::{RelayError, UnixMillis};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::sync::Semaphore;

/// The shared handles a delivery reads directly (cheap to clone).
#[derive(Clone)]
pub struct Env {
    pub store: Store,
    pub clock: SharedClock,
    pub policy: Arc<Policy>,
    pub routes: RouteBook,
    pub transport: Arc<dyn Transport>,
    pub metrics: Arc<Metrics>,
}

/// What a delivery asks of the rest of the relay: the accounts (local
/// recipients, the sender's record), route lookups, timers and the
/// per-destination slots. A narrow port, so deliveries never call back into
/// the service that starts them.
pub trait Ports: Send + Sync + 'static {
    /// `message.deliver` to local account `to`, answered at once: the
    /// outcome reaches the sender's client only after the sender's account
    /// has written it durably, a later commit that covers this receipt.
    /// (An account of a sibling shard is reached through the transport.)
    fn deliver_local(&self, to: &str, params: DeliverParams, digest: String) -> LocalFuture<AttemptOutcome>;
    /// Records an outcome in the sender `from`'s account (idempotent),
    /// answered once durable.
    fn report(&self, from: &str, outcome: ReportOutcome) -> LocalFuture<Result<Recorded, RelayError>>;
    /// The best route known for `account_id`; with `fresh`, the peers are
    /// asked first, bypassing the cache.
    fn lookup_route(&self, account_id: &str, fresh: bool) -> LocalFuture<RouteLookup>;
    /// Arms the timer of `stream`'s next attempt at `destinations` (relay
    /// ids; empty when no route is known): a destination heard from again
    /// makes it due at once.
    fn schedule_to(&self, stream: String, due_ms: UnixMillis, destinations: Vec<String>);
    /// Actor `addr` of `stream` is stopping: the next start of `stream`
    /// gets a new actor (it reads what this one wrote).
    fn stopping(&self, stream: &str, addr: &Addr<DeliveryActor>);
    /// The actor of `stream` has stopped.
    fn stopped(&self, stream: &str);
    /// The attempt slots of destination `relay_id`
    /// (`limits.max_in_flight_per_destination`).
    fn destination(&self, relay_id: &str) -> Arc<Semaphore>;
    /// Peer `relay_id` answered: its waiting deliveries may start now.
    fn peer_seen(&self, relay_id: &str);
    /// Whether the sender `from`'s account here records the message
    /// `target_accepted` while this delivery has not ended: its other home
    /// delivered it (learned by `timeline.replicate`).
    fn delivered_by_other_home(&self, from: &str, message_id: &str) -> bool;
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Watch(pub oneshot::Sender<DeliveryStatus>);

/// A delivery whose acceptance was just written, handed over in memory (no
/// re-read of what was just written).
#[derive(Debug)]
pub struct Start {
    pub stream: String,
    /// The delivery stream's head after the acceptance.
    pub head: Head,
    pub state: DeliveryState,
    pub indexed_due_ms: UnixMillis,
    /// The acceptance's commit: an attempt leaves only once it is durable.
    pub ticket: Ticket,
}

pub struct DeliveryActor {
    env: Env,
    ports: Arc<dyn Ports>,
    /// The delivery's stream and state.
    es: EventSourced<DeliveryState>,
    /// The due-index entry currently stored for this delivery.
    indexed_due_ms: Option<UnixMillis>,
    watchers: Vec<oneshot::Sender<DeliveryStatus>>,
    /// Started because its destination came back, not because it is due.
    woken: bool,
    /// The attempt in flight was written with the acceptance and has not
    /// gone out yet.
    attempt_ready: bool,
}

impl DeliveryActor {
    /// The actor of a delivery just accepted: when the acceptance carried
    /// the first attempt (its route was known), that attempt goes out as
    /// soon as the acceptance is durable.
    pub fn resume(
        env: Env,
        ports: Arc<dyn Ports>,
        start: Start,
        watch: Option<oneshot::Sender<DeliveryStatus>>,
    ) -> Self {
        DeliveryActor {
            env,
            ports,
            attempt_ready: start.state.in_flight.is_some(),
            es: EventSourced {
                last_ticket: Some(start.ticket),
                ..EventSourced::at(start.stream, start.state, start.head)
            },
            indexed_due_ms: Some(start.indexed_due_ms),
            watchers: watch.into_iter().collect(),
            woken: false,
        }
    }

    pub fn load(
        env: Env,
        ports: Arc<dyn Ports>,
        stream: &str,
        watch: Option<oneshot::Sender<DeliveryStatus>>,
        woken: bool,
    ) -> Result<Self, StoreError> {
        // No snapshots: a delivery's stream is a handful of events.
        let mut es = EventSourced::at(stream.to_owned(), DeliveryState::default(), Head::default());
        let mut indexed_due_ms = None;
        es.replay(&env.store, |event| match event {
            DeliveryEvent::Accepted { first_due_ms, .. } => indexed_due_ms = Some(*first_due_ms),
            DeliveryEvent::AttemptFailed { next_due_ms, .. } => indexed_due_ms = Some(*next_due_ms),
            _ => {}
        })?;
        Ok(DeliveryActor {
            env,
            ports,
            es,
            indexed_due_ms,
            watchers: watch.into_iter().collect(),
            woken,
            attempt_ready: false,
        })
    }

    /// The delivery's last events, written by its sender's account in the
    /// commit that moved the stream to `head`: folded in here.
    fn written_by_account(&mut self, head: Head, events: &[DeliveryEvent]) {
        self.es.head = head;
        for e in events {
            self.es.state.fold(e);
            if let DeliveryEvent::Finished { status } = e {
                self.log_finished(status);
            }
        }
    }

    /// The other relays this delivery targets now (empty: no route known).
    fn destinations(&self) -> Vec<String> {
        let own = &self.env.policy.relay_id;
        let relays = self.es.state.target.iter().flat_map(|t| t.relays.iter());
        relays.filter(|r| &r.id != own).map(|r| r.id.clone()).collect()
    }

    /// The relays of the current target, comma-separated (`-` before one is known).
    fn target_ids(&self) -> String {
        match &self.es.state.target {
            Some(t) => t.relays.iter().map(|r| r.id.as_str()).collect::<Vec<_>>().join(","),
            None => "-".into(),
        }
    }

    /// One line per delivery at its end: INFO when accepted, WARN when failed.
    fn log_finished(&self, status: &DeliveryStatus) {
        let s = &self.es.state;
        let elapsed_s = self.env.clock.now().since(s.accepted_at);
        let ids = shared::Ids { from: &s.from, message_id: &s.message_id, to: &s.to };
        shared::finished(&self.env.metrics, ids, &self.target_ids(), s.attempts, elapsed_s, status);
    }

    fn durable(&self) -> impl std::future::Future<Output = Result<(), RelayError>> + 'static {
        self.es.durable(&self.env.store)
    }

    fn tell_watchers(&mut self) {
        let status = self.es.state.status();
        for w in self.watchers.drain(..) {
            let _ = w.send(status.clone());
        }
    }

    /// The sender's other home delivered it: the delivery ends (written
    /// by the sender's account).
    fn confirmed_by_peer(&mut self, ctx: &mut Context<Self>) {
        match self.run(&DeliveryCmd::PeerConfirmed) {
            Ok(Step::Ends(events)) => self.finish(events, ctx),
            Ok(Step::Written { .. }) => self.retry_later(ctx, &RelayError::internal("finish without a final status")),
            Err(e) => self.retry_later(ctx, &e),
        }
    }

    /// A step could not be recorded (store trouble): try again later from
    /// the index, which still holds this delivery.
    fn retry_later(&mut self, ctx: &mut Context<Self>, why: &RelayError) {
        tracing::warn!(stream = %self.es.stream, error = %why, "delivery step failed; retrying later");
        self.stop_until(self.env.clock.now_ms().plus(STEP_RETRY_MS), ctx);
    }

    /// Stops; the scheduler starts the delivery again at `due_ms`. This
    /// actor leaves the running set first: a timer already due may fire on
    /// the scheduler's thread before this one has stopped (the first
    /// attempt's actor runs on the thread that accepted the send), and must then start
    /// a new actor, not find this stopping one and be dropped.
    fn stop_until(&mut self, due_ms: UnixMillis, ctx: &mut Context<Self>) {
        self.ports.stopping(&self.es.stream, &ctx.address());
        self.ports.schedule_to(self.es.stream.clone(), due_ms, self.destinations());
        self.tell_watchers();
        ctx.stop();
    }

    fn step_due(&mut self, ctx: &mut Context<Self>) {
        if self.es.state.params.is_none() {
            tracing::error!(stream = %self.es.stream, "delivery without acceptance; dropping index entry");
            self.remove_index(ctx);
            return;
        }
        if self.es.state.finished.is_some() {
            return self.report(ctx);
        }
        // Woken before its time by a stale timer: wait for the real due
        // time. (Woken because its destination came back: go now.)
        if let Some(due) = self.es.state.not_yet_due(self.env.clock.now_ms(), self.woken) {
            return self.stop_until(due, ctx);
        }
        // Before the route and the attempt: the sender's other home relay
        // may already have delivered it. Known here (its result came by
        // replication): end now; else ask it (attempts after the second).
        if self.ports.delivered_by_other_home(&self.es.state.from, &self.es.state.message_id) {
            return self.confirmed_by_peer(ctx);
        }
        let (transport, ports) = (self.env.transport.clone(), self.ports.clone());
        let sender_route = self.env.routes.get(&self.es.state.from).ok().flatten();
        let own = &self.env.policy.relay_id;
        let other_home = other_home_to_ask(&self.es.state, sender_route.as_deref(), own);
        let (from, message_id, to) =
            (self.es.state.from.clone(), self.es.state.message_id.clone(), self.es.state.to.clone());
        let fresh = self.es.state.wants_fresh_route();
        // `None`: the other home relay reports it `target_accepted`.
        let prepare = async move {
            if let Some(relay) = other_home {
                let st = transport.peer_status(&relay, &from, &message_id).await;
                if st.is_some_and(|st| st.status == relay_schemas::objects::Status::TargetAccepted) {
                    return None;
                }
            }
            Some(ports.lookup_route(&to, fresh).await)
        };
        ctx.wait(prepare.into_actor(self).map(|lookup, act, ctx| {
            let Some(lookup) = lookup else {
                return act.confirmed_by_peer(ctx);
            };
            act.start_attempt(lookup, ctx)
        }));
    }

    fn start_attempt(&mut self, lookup: RouteLookup, ctx: &mut Context<Self>) {
        // With no route, the attempt goes nowhere and fails saying why.
        let no_route = lookup.no_route_error();
        let route = lookup.route();
        match self.run(&DeliveryCmd::Due { route: route.as_ref() }) {
            Ok(Step::Ends(events)) => self.finish(events, ctx),
            Ok(Step::Written { .. }) => self.send_attempt(no_route, ctx),
            Err(e) => self.retry_later(ctx, &e),
        }
    }

    /// Sends the attempt in flight (written, maybe not yet durable);
    /// `no_route`: why there is no target, if there is none.
    fn send_attempt(&mut self, no_route: Option<RelayError>, ctx: &mut Context<Self>) {
        self.attempt_ready = false;
        let attempt = self.es.state.attempts;
        tracing::debug!(from = %self.es.state.from, message_id = %self.es.state.message_id, attempt,
            target = %self.target_ids(), "delivery attempt");
        let Some(mut params) = self.es.state.params.clone() else {
            return self.retry_later(ctx, &RelayError::internal("delivery without acceptance"));
        };
        if params.sender_route.is_none() {
            // Accepted before deliveries carried the sender's route: the
            // sender's route now is the best evidence a destination can get.
            params.sender_route = self.env.routes.get(&self.es.state.from).ok().flatten();
        }
        let relays = self.es.state.target.as_ref().map(|t| t.relays.clone()).unwrap_or_default();
        let (env, ports, digest, to) =
            (self.env.clone(), self.ports.clone(), self.es.state.digest.clone(), self.es.state.to.clone());
        let own = env.policy.relay_id.clone();
        let timeout = Duration::from_millis(env.policy.attempt_timeout_ms);
        // A request leaving the process waits until the attempt is on disk.
        // A local attempt need not: its effect (the recipient's record) is
        // answered only once durable, and flushes cover every earlier commit.
        let remote = relays.iter().any(|r| r.id != own) || env.transport.in_sibling_shard(&to);
        let durable = remote.then(|| self.durable());
        let attempt_fut = async move {
            if let Some(Err(e)) = match durable {
                Some(d) => Some(d.await),
                None => None,
            } {
                return AttemptOutcome::NotAttempted(e);
            }
            if let (true, Some(e)) = (relays.is_empty(), no_route) {
                return AttemptOutcome::NotAttempted(e);
            }
            if remote {
                crate::crash::point("deliver.before_send", || env.store.durable(env.store.committed())).await;
            }
            // Every relay of the route at once; the first acceptance wins.
            let tries = relays.iter().map(|relay| {
                let one: LocalFuture<AttemptOutcome> = if relay.id == own {
                    ports.deliver_local(&to, params.clone(), digest.clone())
                } else {
                    env.transport.deliver(relay, &params)
                };
                // Slots and metric labels for configured peers only: any
                // relay id can appear in a signed route.
                let remote = (relay.id != own && env.transport.is_peer(&relay.id))
                    .then(|| (ports.destination(&relay.id), relay.id.clone()));
                let metrics = env.metrics.clone();
                async move {
                    // A bounded number of attempts per destination: a dead
                    // relay ties up its own slots, never the others'.
                    let mut _slot = None;
                    if let Some((slots, id)) = &remote {
                        match tokio::time::timeout(timeout, slots.clone().acquire_owned()).await {
                            Ok(Ok(permit)) => _slot = Some(permit),
                            _ => {
                                let why = format!("too many delivery attempts in flight to {id}");
                                return AttemptOutcome::NotAttempted(RelayError::unavailable(why));
                            }
                        }
                    }
                    let gauge = remote.as_ref().map(|(_, id)| {
                        metrics.attempts_in_flight.get_or_create(&DestinationLabels { destination: id.clone() }).clone()
                    });
                    gauge.iter().for_each(|g| {
                        g.inc();
                    });
                    let outcome = match tokio::time::timeout(timeout, one).await {
                        Ok(o) => o,
                        Err(_) => AttemptOutcome::Unknown(RelayError::unavailable("delivery attempt timed out")),
                    };
                    gauge.iter().for_each(|g| {
                        g.dec();
                    });
                    outcome
                }
            });
            let outcome = combine(futures_util::future::join_all(tries).await);
            if remote {
                crate::crash::point("deliver.before_outcome", || env.store.durable(env.store.committed())).await;
            }
            outcome
        };
        ctx.wait(attempt_fut.into_actor(self).map(move |outcome, act, ctx| act.step_outcome(attempt, outcome, ctx)));
    }

    fn step_outcome(&mut self, attempt: u32, outcome: AttemptOutcome, ctx: &mut Context<Self>) {
        self.learn_route(&outcome);
        // A destination that answered is up: its other waiting deliveries
        // need not wait for their slots.
        if let ([relay], AttemptOutcome::Answered(_) | AttemptOutcome::Rejected(_)) =
            (self.destinations().as_slice(), &outcome)
        {
            self.ports.peer_seen(relay);
        }
        shared::count_attempt(&self.env.metrics, &outcome);
        match self.run(&DeliveryCmd::Outcome { attempt, outcome: &outcome }) {
            Ok(Step::Ends(events)) => self.finish(events, ctx),
            // Failed for now: the next attempt's timer is armed once that is durable.
            Ok(Step::Written { next_due: Some(next) }) => {
                let durable = self.durable();
                ctx.wait(durable.into_actor(self).map(move |_, act, ctx| act.stop_until(next, ctx)));
            }
            Ok(Step::Written { next_due: None }) => {
                self.tell_watchers();
                ctx.stop();
            }
            Err(e) => self.retry_later(ctx, &e),
        }
    }

    /// The delivery ends with `events`: they, the sender's status (and its
    /// ledger entry) and the due-index removal are one commit, made by the
    /// sender's account, the only writer of its stream. Not recorded (store
    /// trouble, the account busy): the index still holds the delivery and
    /// it tries again later; an attempt made again is answered by the
    /// target's idempotent receipt.
    fn finish(&mut self, events: Vec<DeliveryEvent>, ctx: &mut Context<Self>) {
        let Some(status) = events.iter().find_map(|e| match e {
            DeliveryEvent::Finished { status } => Some(status.clone()),
            _ => None,
        }) else {
            return self.retry_later(ctx, &RelayError::internal("finish without a final status"));
        };
        let encoded = match EventSourced::<DeliveryState>::encode(&events, self.env.clock.now()) {
            Ok(e) => e,
            Err(e) => return self.retry_later(ctx, &e),
        };
        let settlement = Settlement {
            stream: self.es.stream.clone(),
            head: self.es.head,
            events: encoded,
            remove_due: self.indexed_due_ms.map(|due| due_key(due, &self.es.stream)),
        };
        let outcome =
            ReportOutcome { message_id: self.es.state.message_id.clone(), status, settlement: Some(settlement) };
        let fut = self.ports.report(&self.es.state.from, outcome);
        ctx.wait(fut.into_actor(self).map(move |res, act, ctx| match res {
            Ok(Recorded { head: Some(head), .. }) => {
                act.written_by_account(head, &events);
                if act.indexed_due_ms.take().is_some() {
                    act.env.metrics.deliveries_in_flight.dec();
                }
                act.tell_watchers();
                ctx.stop();
            }
            Ok(other) => act.retry_later(ctx, &RelayError::internal(format!("unexpected reply {other:?}"))),
            Err(e) => act.retry_later(ctx, &e),
        }));
    }

    /// Keeps the route a route error carried, when the core's
    /// [`route_to_learn`] takes it.
    fn learn_route(&self, outcome: &AttemptOutcome) {
        let to = &self.es.state.to;
        if let Some(route) = route_to_learn(outcome, to, self.env.clock.now(), &self.env.policy) {
            if let Err(e) = self.env.routes.offer(&route) {
                tracing::warn!(stream = %self.es.stream, error = %e, "cannot keep route from data.route");
            }
        }
    }

    /// Found ended but still indexed (written by a version that reported in
    /// a separate commit): tell the sender's account (idempotent), then drop
    /// the index entry. A crash in between re-reports on restart.
    fn report(&mut self, ctx: &mut Context<Self>) {
        let outcome = ReportOutcome {
            message_id: self.es.state.message_id.clone(),
            status: self.es.state.status(),
            settlement: None,
        };
        // No wait for `Finished` here: it was read back from a store an
        // earlier run wrote (this version writes it in the account's commit).
        let fut = self.ports.report(&self.es.state.from, outcome);
        ctx.wait(fut.into_actor(self).map(|res, act, ctx| match res {
            Ok(_) => act.remove_index(ctx),
            Err(e) => act.retry_later(ctx, &e),
        }));
    }

    fn remove_index(&mut self, ctx: &mut Context<Self>) {
        if let Some(due) = self.indexed_due_ms.take() {
            self.env.metrics.deliveries_in_flight.dec();
            let mut batch = self.env.store.batch();
            batch.kv_remove(&due_key(due, &self.es.stream));
            if let Err(e) = self.env.store.commit(batch) {
                tracing::warn!(stream = %self.es.stream, error = %e, "cannot drop due index entry");
            }
        }
        self.tell_watchers();
        ctx.stop();
    }
}

/// What the loop made of a delivery's step.
pub(crate) enum Step {
    /// Written here; `next_due`: the next attempt's time, when the step
    /// failed one for now.
    Written { next_due: Option<UnixMillis> },
    /// The delivery ends with these events, which its sender's account
    /// writes in the commit that records the final status.
    Ends(Vec<DeliveryEvent>),
}

/// The due-index entry a failed attempt moves to its next time, in the
/// step's commit.
pub(crate) struct DueMove {
    stream: String,
    old: Option<UnixMillis>,
    next: Option<UnixMillis>,
}

impl Rides for DueMove {
    /// The next due time written.
    type Written = Option<UnixMillis>;

    fn is_empty(&self) -> bool {
        self.next.is_none()
    }

    fn write(self, batch: &mut Batch) -> Option<UnixMillis> {
        let next = self.next?;
        if let Some(old) = self.old {
            batch.kv_remove(&due_key(old, &self.stream));
        }
        batch.kv_put(&due_key(next, &self.stream), b"");
        Some(next)
    }
}

/// The delivery in the one loop: its steps are commands (`Due`, `Outcome`,
/// `PeerConfirmed`); a failed attempt moves its due entry in the same
/// commit; an end is handed to the sender's account, the only writer of
/// the commit that records it. What follows a step (the attempt, the
/// timer, the report) is the actor's, on what the loop answers.
impl Shell for DeliveryActor {
    type State = DeliveryState;
    type Cmd<'c> = DeliveryCmd<'c>;
    type Reply = ();
    type Effect = ();
    type Projected = ();
    type Rides<'c> = DueMove;
    type Written = Option<UnixMillis>;
    type Out = Step;

    fn es(&mut self) -> &mut EventSourced<DeliveryState> {
        &mut self.es
    }

    fn store(&self) -> Store {
        self.env.store.clone()
    }

    fn now_ms(&self) -> UnixMillis {
        self.env.clock.now_ms()
    }

    fn decide(&mut self, cmd: &DeliveryCmd<'_>, now_ms: UnixMillis) -> Result<DeliveryDecision, RelayError> {
        self.es.state.decide(cmd, DeliveryCtx { now_ms, policy: &self.env.policy })
    }

    fn hand_off(&mut self, events: Vec<DeliveryEvent>) -> Result<Vec<DeliveryEvent>, Step> {
        if events.iter().any(DeliveryEvent::ends) {
            return Err(Step::Ends(events));
        }
        Ok(events)
    }

    fn rides(
        &mut self,
        _: &DeliveryCmd<'_>,
        events: &[DeliveryEvent],
        _: &[()],
        _: UnixMillis,
    ) -> Result<DueMove, RelayError> {
        let next = events.iter().find_map(|e| match e {
            DeliveryEvent::AttemptFailed { next_due_ms, .. } => Some(*next_due_ms),
            _ => None,
        });
        Ok(DueMove { stream: self.es.stream.clone(), old: self.indexed_due_ms, next })
    }

    fn project(&mut self, _: &mut Batch, _: &[DeliveryEvent]) -> Result<(), RelayError> {
        Ok(())
    }

    fn carry_out(&mut self, (): (), _: Vec<()>, next_due: Option<UnixMillis>) -> Result<Step, RelayError> {
        if next_due.is_some() {
            self.indexed_due_ms = next_due;
        }
        Ok(Step::Written { next_due })
    }
}

impl Stream for DeliveryState {
    type Event = DeliveryEvent;
    const VERSION: u32 = DeliveryEvent::VERSION;

    fn event_type(event: &DeliveryEvent) -> &'static str {
        event.event_type()
    }

    fn decode(event: &StoredEvent) -> Result<DeliveryEvent, StoreError> {
        crate::upcast::delivery_event(event)
    }

    fn fold(&mut self, event: &DeliveryEvent) {
        self.apply(event);
    }
}

impl Actor for DeliveryActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if self.attempt_ready {
            self.send_attempt(None, ctx)
        } else {
            self.step_due(ctx)
        }
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.tell_watchers();
        self.ports.stopped(&self.es.stream);
    }
}

impl Handler<Watch> for DeliveryActor {
    type Result = ();
    fn handle(&mut self, msg: Watch, _ctx: &mut Self::Context) {
        self.watchers.push(msg.0);
    }
}
