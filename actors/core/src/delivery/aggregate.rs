//! The pure core of one delivery (`delivery/{from}/{message_id}`): the
//! seed's error table, deadlines, the timetable, result confirmation and
//! target switching, as decide/apply.

use super::outcome::{final_status, AttemptOutcome};
use super::timetable::next_attempt_ms;
use crate::aggregate::{Aggregate, Decision};
use crate::policy::Policy;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{DeliveryStatus, RelayRef, Route, Status, Wire};
use relay_schemas::{AccountId, MessageId, RelayId, UnixMillis, UnixSecs};
use relay_schemas::{DeliveryHandling, ErrorCode, RelayError};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryEvent {
    /// Written with the sender's acceptance, in the same batch. The
    /// deadline and params are fixed here and never change.
    Accepted {
        from: AccountId,
        message_id: MessageId,
        to: AccountId,
        accepted_at: UnixSecs,
        deadline: UnixSecs,
        digest: String,
        params: Box<DeliverParams>,
        first_due_ms: UnixMillis,
    },
    /// The delivery targets the relays of this route revision from now on.
    RouteRefreshed {
        revision: u64,
        relays: Vec<RelayRef>,
    },
    /// An attempt at `targets` (relay ids; empty when no route was known).
    AttemptStarted {
        attempt: u32,
        targets: Vec<RelayId>,
        revision: u64,
    },
    /// The attempt did not deliver; the next one is due at `next_due_ms`.
    /// `may_switch`: the target refused explicitly with a route error, or
    /// surely never saw the request, so a higher route revision may be
    /// followed; `refresh_route`: fetch the route bypassing caches first.
    AttemptFailed {
        attempt: u32,
        error: RelayError,
        next_due_ms: UnixMillis,
        may_switch: bool,
        refresh_route: bool,
    },
    Finished {
        status: DeliveryStatus,
    },
}

impl DeliveryEvent {
    pub const VERSION: u32 = 1;

    /// Whether this event ends the delivery.
    pub fn ends(&self) -> bool {
        matches!(self, DeliveryEvent::Finished { .. })
    }

    pub fn event_type(&self) -> &'static str {
        match self {
            DeliveryEvent::Accepted { .. } => "accepted",
            DeliveryEvent::RouteRefreshed { .. } => "route_refreshed",
            DeliveryEvent::AttemptStarted { .. } => "attempt_started",
            DeliveryEvent::AttemptFailed { .. } => "attempt_failed",
            DeliveryEvent::Finished { .. } => "finished",
        }
    }
}

/// The relays a delivery currently targets, and the route revision that
/// named them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub revision: u64,
    pub relays: Vec<RelayRef>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeliveryState {
    pub from: AccountId,
    pub message_id: MessageId,
    pub to: AccountId,
    pub accepted_at: UnixSecs,
    pub deadline: UnixSecs,
    pub digest: String,
    pub params: Option<DeliverParams>,
    pub attempts: u32,
    pub target: Option<Target>,
    /// The attempt started and not yet answered, if any.
    pub in_flight: Option<u32>,
    pub next_due_ms: Option<UnixMillis>,
    pub may_switch: bool,
    pub refresh_route: bool,
    pub finished: Option<DeliveryStatus>,
}

impl DeliveryState {
    pub fn apply(&mut self, event: &DeliveryEvent) {
        match event {
            DeliveryEvent::Accepted { from, message_id, to, accepted_at, deadline, digest, params, first_due_ms } => {
                self.from = from.clone();
                self.message_id = message_id.clone();
                self.to = to.clone();
                self.accepted_at = *accepted_at;
                self.deadline = *deadline;
                self.digest = digest.clone();
                self.params = Some((**params).clone());
                self.next_due_ms = Some(*first_due_ms);
            }
            DeliveryEvent::RouteRefreshed { revision, relays } => {
                self.target = Some(Target { revision: *revision, relays: relays.clone() });
            }
            DeliveryEvent::AttemptStarted { attempt, .. } => {
                self.attempts = *attempt;
                self.in_flight = Some(*attempt);
            }
            DeliveryEvent::AttemptFailed { next_due_ms, may_switch, refresh_route, .. } => {
                self.in_flight = None;
                self.next_due_ms = Some(*next_due_ms);
                self.may_switch = *may_switch;
                self.refresh_route = *refresh_route;
            }
            DeliveryEvent::Finished { status } => {
                self.in_flight = None;
                self.next_due_ms = None;
                self.finished = Some(status.clone());
            }
        }
    }

    pub fn status(&self) -> DeliveryStatus {
        self.finished.clone().unwrap_or_else(|| DeliveryStatus::delivering(self.accepted_at.0))
    }

    fn deadline_ms(&self) -> UnixMillis {
        self.deadline.millis()
    }

    fn expired(&self) -> DeliveryEvent {
        DeliveryEvent::Finished {
            status: DeliveryStatus::failed(
                self.accepted_at.0,
                RelayError::new(ErrorCode::MessageExpired, "delivery deadline reached"),
            ),
        }
    }

    /// Whether the next attempt should fetch the recipient's route from
    /// peers, bypassing the cache (after a route error, or with no target).
    pub fn wants_fresh_route(&self) -> bool {
        self.refresh_route || self.target.is_none()
    }

    /// The due time a delivery started at `now_ms` waits for instead of
    /// attempting: a stale timer started it early. One `woken` (its
    /// destination came back) goes now; the deadline is unchanged.
    pub fn not_yet_due(&self, now_ms: UnixMillis, woken: bool) -> Option<UnixMillis> {
        self.next_due_ms.filter(|due| *due > now_ms && !woken)
    }
}

/// How long after a step that could not be recorded (store trouble) the
/// delivery starts again, from the due index that still holds it.
pub const STEP_RETRY_MS: u64 = 1_000;

/// A route error may carry the recipient's newer route (`data.route`):
/// the route to keep, so the next attempt can follow it, when it is the
/// recipient's (`to`) and valid now.
pub fn route_to_learn(outcome: &AttemptOutcome, to: &str, now: UnixSecs, policy: &Policy) -> Option<Wire<Route>> {
    let route = outcome.error()?.data.as_ref()?.get("route")?;
    let route = Wire::<Route>::from_value(route).ok()?;
    let valid = route.check(now, policy.clock_tolerance, policy.max_object_bytes).is_ok();
    (route.account_id == to && valid).then_some(route)
}

/// An attempt is due; `route` is the recipient's best known route now.
/// Starts the attempt, or ends the delivery at its deadline. The first
/// route names the target; later the target switches only when the last
/// answer allowed it and the route has a higher revision. An attempt left
/// in flight by a crash is confirmed by a new attempt with the same
/// unchanged params to the same target.
fn due(s: &DeliveryState, now_ms: UnixMillis, route: Option<&Wire<Route>>) -> Vec<DeliveryEvent> {
    if s.finished.is_some() {
        return vec![];
    }
    if now_ms >= s.deadline_ms() {
        return vec![s.expired()];
    }
    let mut events = vec![];
    let switch = match (&s.target, route) {
        (None, Some(_)) => true,
        (Some(t), Some(r)) => s.may_switch && r.revision > t.revision,
        _ => false,
    };
    let mut target = s.target.clone();
    if let (true, Some(r)) = (switch, route) {
        let t = Target { revision: r.revision, relays: r.relays.clone() };
        events.push(DeliveryEvent::RouteRefreshed { revision: t.revision, relays: t.relays.clone() });
        target = Some(t);
    }
    let (targets, revision) = match &target {
        Some(t) => (t.relays.iter().map(|r| RelayId::new(&*r.id)).collect(), t.revision),
        None => (vec![], 0),
    };
    events.push(DeliveryEvent::AttemptStarted { attempt: s.attempts + 1, targets, revision });
    events
}

/// A delivery's first event: its params, fixed times and first due time.
fn accepted(
    params: Box<DeliverParams>,
    digest: String,
    (accepted_at, deadline): (UnixSecs, UnixSecs),
    first_due_ms: UnixMillis,
) -> DeliveryEvent {
    let env = &params.envelope;
    DeliveryEvent::Accepted {
        from: AccountId::from(&env.from),
        message_id: MessageId::from(&env.message_id),
        to: AccountId::from(&env.to),
        accepted_at,
        deadline,
        digest,
        params,
        first_due_ms,
    }
}

/// What an acceptance writes of its delivery.
#[derive(Debug)]
pub struct Begun {
    /// `Accepted`, then (with the route known) the first attempt, and its
    /// outcome when it was already made in this process.
    pub events: Vec<DeliveryEvent>,
    /// The state those events fold into.
    pub state: DeliveryState,
    /// The due-index entry to write: the next attempt, or none when the
    /// delivery already ended.
    pub due_ms: Option<UnixMillis>,
}

/// A message accepted at `now_ms` (its status says `accepted_at`; its
/// deadline is fixed here): the delivery begins. The route known at
/// acceptance is the first attempt's target, and that attempt rides in the
/// acceptance's commit; `first` is its outcome when the process manager
/// made it before writing (a local recipient whose attempt did not end at
/// once). Without a route the first attempt is due now and resolves one.
fn acceptance(
    params: &DeliverParams,
    digest: &str,
    times: (UnixSecs, UnixSecs),
    route: Option<&Wire<Route>>,
    first: Option<&AttemptOutcome>,
    ctx: DeliveryCtx,
) -> Vec<DeliveryEvent> {
    let now_ms = ctx.now_ms;
    let accepted = accepted(Box::new(params.clone()), digest.to_owned(), times, now_ms);
    let mut state = DeliveryState::default();
    state.apply(&accepted);
    let mut events = vec![accepted];
    let mut take = |state: &mut DeliveryState, new: Vec<DeliveryEvent>| {
        new.iter().for_each(|e| state.apply(e));
        events.extend(new);
    };
    if let Some(route) = route {
        let attempt = due(&state, now_ms, Some(route));
        // Past its deadline already: due now, where it ends by the timetable.
        if !attempt.iter().any(DeliveryEvent::ends) {
            take(&mut state, attempt);
            if let Some(outcome) = first {
                let after = outcome_of(&state, state.attempts, outcome.clone(), now_ms, ctx.policy);
                take(&mut state, after);
            }
        }
    }
    events
}

/// A message the sender's other home accepted and attempted first (SHiNE:
/// the sender's server hands the send to the second server after its own
/// attempt): this relay delivers it too, by its own state with the
/// original `accepted_at` and deadline, from the timetable's next slot
/// after now. Past the deadline it is due now, and ends by the timetable.
fn forwarded(
    params: &DeliverParams,
    digest: &str,
    (accepted_at, deadline): (UnixSecs, UnixSecs),
    ctx: DeliveryCtx,
) -> DeliveryEvent {
    let now_ms = ctx.now_ms;
    let first_due_ms =
        next_attempt_ms(ctx.policy, accepted_at.millis(), now_ms, UnixMillis(0), deadline.millis()).unwrap_or(now_ms);
    accepted(Box::new(params.clone()), digest.to_owned(), (accepted_at, deadline), first_due_ms)
}

/// A delivery begun by `cmd` ([`DeliveryCmd::Accept`] or
/// [`DeliveryCmd::Forward`]): its first events, the state they fold into,
/// and its due-index entry (none once it ended).
pub fn begin(cmd: &DeliveryCmd, ctx: DeliveryCtx) -> Result<Begun, RelayError> {
    let mut state = DeliveryState::default();
    let events = state.decide(cmd, ctx)?.events;
    events.iter().for_each(|e| state.apply(e));
    let due_ms = state.finished.is_none().then(|| state.next_due_ms.unwrap_or(ctx.now_ms));
    Ok(Begun { events, state, due_ms })
}

/// One outcome for an attempt at every relay of the route (1 or 2, tried in
/// parallel): the first acceptance wins; otherwise the outcome that most
/// constrains what happens next. An unknown result outranks a final
/// rejection by the other relay: that relay may hold the message, so the
/// delivery must confirm with it rather than end `failed`.
pub fn combine(outcomes: Vec<AttemptOutcome>) -> AttemptOutcome {
    fn rank(o: &AttemptOutcome) -> u8 {
        match o {
            AttemptOutcome::Answered(s) if s.status == Status::TargetAccepted => 0,
            AttemptOutcome::Unknown(_) => 1,
            AttemptOutcome::Answered(_) => 1,
            AttemptOutcome::Rejected(e) if e.code.delivery_handling() == DeliveryHandling::End => 2,
            AttemptOutcome::Unrecognized(_) => 3,
            AttemptOutcome::Rejected(e) if e.code.delivery_handling() == DeliveryHandling::Retry => 4,
            AttemptOutcome::Rejected(_) => 5,
            AttemptOutcome::NotAttempted(_) => 6,
        }
    }
    outcomes.into_iter().min_by_key(rank).unwrap_or_else(|| {
        AttemptOutcome::NotAttempted(RelayError::new(ErrorCode::RouteNotFound, "no route known for the recipient"))
    })
}

/// The answer to attempt `attempt`, by the seed's error table. Late answers
/// (to an older attempt, or after the end) change nothing.
fn outcome_of(
    s: &DeliveryState,
    attempt: u32,
    outcome: AttemptOutcome,
    now_ms: UnixMillis,
    policy: &Policy,
) -> Vec<DeliveryEvent> {
    if s.finished.is_some() || s.in_flight != Some(attempt) {
        return vec![];
    }
    if let Some(status) = final_status(&outcome, s.accepted_at) {
        return vec![DeliveryEvent::Finished { status }];
    }
    let (error, may_switch, refresh_route) = match outcome {
        AttemptOutcome::Answered(st) => {
            (RelayError::new(ErrorCode::BadGateway, format!("target answered status {:?}", st.status)), false, false)
        }
        AttemptOutcome::Rejected(e) if e.code.delivery_handling() == DeliveryHandling::RefreshRouteAndRetry => {
            (e, true, true)
        }
        // (Final rejections and unrecognized answers ended above.)
        AttemptOutcome::Rejected(e) | AttemptOutcome::Unrecognized(e) | AttemptOutcome::Unknown(e) => (e, false, false),
        // Never seen by the target: re-read the route, and follow a higher
        // revision if there is one.
        AttemptOutcome::NotAttempted(e) => (e, true, true),
    };
    let not_before_ms =
        match (error.code, error.data.as_ref().and_then(|d| d.get("retry_after")).and_then(|v| v.as_u64())) {
            (ErrorCode::RateLimited, Some(secs)) => now_ms.plus(secs.saturating_mul(1000)),
            _ => UnixMillis(0),
        };
    match next_attempt_ms(policy, s.accepted_at.millis(), now_ms, not_before_ms, s.deadline_ms()) {
        Some(next_due_ms) => {
            vec![DeliveryEvent::AttemptFailed { attempt, error, next_due_ms, may_switch, refresh_route }]
        }
        None => vec![s.expired()],
    }
}

/// Before an attempt after the second, the sender's other home relay is
/// asked whether it has delivered the message already (SHiNE: a user's two
/// servers exchange delivery results read-only); a `target_accepted` there
/// ends this delivery ([`DeliveryCmd::PeerConfirmed`]). Which relay to ask: the
/// other one of a sender route naming this relay and one more.
pub fn other_home_to_ask(s: &DeliveryState, sender_route: Option<&Route>, own_relay_id: &str) -> Option<RelayRef> {
    let names_us = |r: &&Route| r.relays.iter().any(|x| x.id == own_relay_id);
    let route = sender_route.filter(|r| s.attempts >= 2 && r.relays.len() == 2 && names_us(r))?;
    route.relays.iter().find(|r| r.id != own_relay_id).cloned()
}

/// The sender's other home relay reports the message `target_accepted`
/// (SHiNE schedule): this relay's delivery ends the same way.
fn peer_confirmed(s: &DeliveryState) -> Vec<DeliveryEvent> {
    if s.finished.is_some() {
        return vec![];
    }
    vec![DeliveryEvent::Finished { status: DeliveryStatus::target_accepted(s.accepted_at.0) }]
}

/// Every command a delivery takes.
#[derive(Debug)]
pub enum DeliveryCmd<'a> {
    /// The sender's account accepted the message: the delivery begins
    /// (on a fresh state), its first attempt riding in the acceptance when
    /// `route` is known, with `first`, its outcome, when the process
    /// manager already made it here.
    Accept {
        params: &'a DeliverParams,
        digest: &'a str,
        accepted_at: UnixSecs,
        deadline: UnixSecs,
        route: Option<&'a Wire<Route>>,
        first: Option<&'a AttemptOutcome>,
    },
    /// A delivery taken on for the sender's other home (on a fresh state).
    Forward { params: &'a DeliverParams, digest: &'a str, accepted_at: UnixSecs, deadline: UnixSecs },
    /// An attempt is due; `route` is the recipient's best known route now.
    Due { route: Option<&'a Wire<Route>> },
    /// The answer to attempt `attempt`, by the seed's error table.
    Outcome { attempt: u32, outcome: &'a AttemptOutcome },
    /// The sender's other home reports the message `target_accepted`.
    PeerConfirmed,
}

/// The time and policy a delivery decides under (milliseconds: the
/// timetable's unit).
#[derive(Clone, Copy)]
pub struct DeliveryCtx<'a> {
    pub now_ms: UnixMillis,
    pub policy: &'a Policy,
}

/// What a delivery command decided: events only. A delivery answers nobody
/// (its outcome reaches the sender's account through the process manager);
/// what its shell does next follows from the state.
pub type DeliveryDecision = Decision<DeliveryEvent, (), ()>;

impl<'a> Aggregate<DeliveryCmd<'_>, DeliveryCtx<'a>> for DeliveryState {
    type Event = DeliveryEvent;
    type Reply = ();
    type Effect = ();

    fn decide(&self, cmd: &DeliveryCmd<'_>, ctx: DeliveryCtx<'a>) -> Result<DeliveryDecision, RelayError> {
        let events = match cmd {
            DeliveryCmd::Accept { .. } | DeliveryCmd::Forward { .. } if self.params.is_some() => {
                return Err(RelayError::internal("a delivery begins once"));
            }
            DeliveryCmd::Accept { params, digest, accepted_at, deadline, route, first } => {
                acceptance(params, digest, (*accepted_at, *deadline), *route, *first, ctx)
            }
            DeliveryCmd::Forward { params, digest, accepted_at, deadline } => {
                vec![forwarded(params, digest, (*accepted_at, *deadline), ctx)]
            }
            DeliveryCmd::Due { route } => due(self, ctx.now_ms, *route),
            DeliveryCmd::Outcome { attempt, outcome } => {
                outcome_of(self, *attempt, (*outcome).clone(), ctx.now_ms, ctx.policy)
            }
            DeliveryCmd::PeerConfirmed => peer_confirmed(self),
        };
        Ok(Decision::write(events, ()))
    }

    fn apply(&mut self, event: &DeliveryEvent) {
        DeliveryState::apply(self, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::client::Account;

    fn params() -> DeliverParams {
        serde_json::from_str(
            r#"{"envelope":{"message_id":"m","from":"a","from_device_id":"d","to":"b","created_at":1,"ciphertext":"AA","signature":"s"},
                "recipient_boxes":[{"device_id":"d","box":"AA"}],
                "sender_device_certificate":{"account_id":"a","account_key":"k","device_id":"d","device_key":"k","box_key":"k","issued_at":1,"signature":"s"}}"#,
        )
        .unwrap()
    }

    fn route(revision: u64, relays: &[&str]) -> Wire<Route> {
        let relays: Vec<(&str, &str)> = relays.iter().map(|r| (*r, "http://127.0.0.1:1")).collect();
        Wire::from_value(&Account::from_seed([5; 32]).route(revision, &relays, 1)).unwrap()
    }

    /// given(accepted at t=1000 s, deadline +90 min)
    fn accepted() -> DeliveryState {
        let mut s = DeliveryState::default();
        s.apply(&DeliveryEvent::Accepted {
            from: "a".into(),
            message_id: "m".into(),
            to: "b".into(),
            accepted_at: UnixSecs(1000),
            deadline: UnixSecs(1000 + 5400),
            digest: "d".into(),
            params: Box::new(params()),
            first_due_ms: UnixMillis(1_000_000),
        });
        s
    }

    #[test]
    fn a_delivery_started_before_its_due_time_waits_for_it_unless_its_destination_came_back() {
        let s = accepted();
        assert_eq!(s.not_yet_due(UnixMillis(999_999), false), Some(UnixMillis(1_000_000)));
        assert_eq!(s.not_yet_due(UnixMillis(1_000_000), false), None, "due: attempt now");
        assert_eq!(s.not_yet_due(UnixMillis(999_999), true), None, "woken: attempt now");
    }

    #[test]
    fn a_route_carried_by_a_route_error_is_kept_only_when_it_is_the_recipients_and_valid() {
        let r = route(2, &["relay-c"]);
        let policy = Policy::with_relay_id("r");
        let stale = |data: serde_json::Value| {
            AttemptOutcome::Rejected(RelayError::new(ErrorCode::RouteStale, "moved").with_data(data))
        };
        let outcome = stale(serde_json::json!({ "route": r }));
        let now = UnixSecs(1000);
        assert_eq!(route_to_learn(&outcome, &r.account_id, now, &policy).map(|l| l.revision), Some(2));
        assert!(route_to_learn(&outcome, "someone-else", now, &policy).is_none(), "another account's");
        let mut forged = serde_json::to_value(&r).unwrap();
        forged["revision"] = 3.into();
        let forged = stale(serde_json::json!({ "route": forged }));
        assert!(route_to_learn(&forged, &r.account_id, now, &policy).is_none(), "a bad signature");
        let bare = AttemptOutcome::Rejected(RelayError::new(ErrorCode::RouteStale, "moved"));
        assert!(route_to_learn(&bare, &r.account_id, now, &policy).is_none(), "no route carried");
    }

    fn apply_all(s: &mut DeliveryState, evs: &[DeliveryEvent]) {
        evs.iter().for_each(|e| s.apply(e));
    }

    /// when(due) with `r` as the best known route.
    fn start_with(s: &mut DeliveryState, now_ms: u64, r: &Wire<Route>) -> u32 {
        let ev = when_due(s, UnixMillis(now_ms), Some(r));
        assert!(matches!(ev.last(), Some(DeliveryEvent::AttemptStarted { .. })), "{ev:?}");
        apply_all(s, &ev);
        s.attempts
    }

    fn start(s: &mut DeliveryState, now_ms: u64) -> u32 {
        start_with(s, now_ms, &route(1, &["relay-b"]))
    }

    /// when(outcome) then apply the decided events.
    fn step(s: &mut DeliveryState, attempt: u32, outcome: AttemptOutcome, now_ms: u64, p: &Policy) {
        let ev = when_outcome(s, attempt, outcome, UnixMillis(now_ms), p);
        apply_all(s, &ev);
    }

    fn rejected(code: ErrorCode) -> AttemptOutcome {
        AttemptOutcome::Rejected(RelayError::new(code, "x"))
    }

    fn targets(s: &DeliveryState) -> Vec<String> {
        s.target.as_ref().unwrap().relays.iter().map(|r| r.id.clone()).collect()
    }

    /// An acceptance at t=1000 s with a 90-minute deadline.
    fn begin(route: Option<&Wire<Route>>, first: Option<AttemptOutcome>) -> Begun {
        let p = Policy::with_relay_id("r");
        when_accepted(&params(), (1000, 1000 + 5400), route, first.as_ref(), 1_000_000, &p)
    }

    /// when(Accept) on a fresh delivery: what the acceptance begins.
    fn when_accepted(
        params: &DeliverParams,
        (accepted_at, deadline): (u64, u64),
        route: Option<&Wire<Route>>,
        first: Option<&AttemptOutcome>,
        now_ms: u64,
        policy: &Policy,
    ) -> Begun {
        let (accepted_at, deadline) = (UnixSecs(accepted_at), UnixSecs(deadline));
        let cmd = DeliveryCmd::Accept { params, digest: "d", accepted_at, deadline, route, first };
        super::begin(&cmd, DeliveryCtx { now_ms: UnixMillis(now_ms), policy }).unwrap()
    }

    /// when(Due) with `route` the best known route.
    fn when_due(s: &DeliveryState, now_ms: UnixMillis, route: Option<&Wire<Route>>) -> Vec<DeliveryEvent> {
        let policy = Policy::with_relay_id("r");
        s.decide(&DeliveryCmd::Due { route }, DeliveryCtx { now_ms, policy: &policy }).unwrap().events
    }

    /// when(Outcome) of attempt `attempt`.
    fn when_outcome(
        s: &DeliveryState,
        attempt: u32,
        outcome: AttemptOutcome,
        now_ms: UnixMillis,
        policy: &Policy,
    ) -> Vec<DeliveryEvent> {
        s.decide(&DeliveryCmd::Outcome { attempt, outcome: &outcome }, DeliveryCtx { now_ms, policy }).unwrap().events
    }

    /// when(PeerConfirmed).
    fn when_peer_confirmed(s: &DeliveryState) -> Vec<DeliveryEvent> {
        let policy = Policy::with_relay_id("r");
        s.decide(&DeliveryCmd::PeerConfirmed, DeliveryCtx { now_ms: UnixMillis(0), policy: &policy }).unwrap().events
    }

    #[test]
    fn an_acceptance_with_a_known_route_carries_its_first_attempt_in_flight() {
        let b = begin(Some(&route(1, &["relay-b"])), None);
        assert!(
            matches!(
                &b.events[..],
                [
                    DeliveryEvent::Accepted { first_due_ms: UnixMillis(1_000_000), .. },
                    DeliveryEvent::RouteRefreshed { revision: 1, .. },
                    DeliveryEvent::AttemptStarted { attempt: 1, .. },
                ]
            ),
            "{:?}",
            b.events
        );
        assert_eq!((b.state.in_flight, b.due_ms), (Some(1), Some(UnixMillis(1_000_000))));
        assert_eq!(b.state.deadline_ms(), UnixMillis(6_400_000), "the deadline is fixed at acceptance");
    }

    #[test]
    fn an_acceptance_without_a_route_is_due_at_once_with_nothing_in_flight() {
        let b = begin(None, None);
        assert!(matches!(&b.events[..], [DeliveryEvent::Accepted { .. }]), "{:?}", b.events);
        assert_eq!((b.state.in_flight, b.due_ms), (None, Some(UnixMillis(1_000_000))));
    }

    #[test]
    fn a_first_attempt_that_failed_for_now_is_due_at_the_timetables_next_slot() {
        let b = begin(Some(&route(1, &["r"])), Some(rejected(ErrorCode::TemporarilyUnavailable)));
        assert!(matches!(b.events.last(), Some(DeliveryEvent::AttemptFailed { attempt: 1, .. })), "{:?}", b.events);
        assert_eq!(b.due_ms, Some(UnixMillis(1_030_000)), "30 s after acceptance");
        assert_eq!(b.state.status().status, Status::Delivering);
    }

    #[test]
    fn a_first_attempt_that_ended_leaves_nothing_due() {
        let b = begin(Some(&route(1, &["r"])), Some(rejected(ErrorCode::Forbidden)));
        assert!(matches!(b.events.last(), Some(DeliveryEvent::Finished { .. })), "{:?}", b.events);
        assert_eq!(b.due_ms, None);
        assert_eq!(b.state.status().status, Status::Failed);
    }

    #[test]
    fn the_senders_other_home_is_asked_before_attempts_after_the_second() {
        let two = route(1, &["r", "relay-b"]);
        let mut s = accepted();
        let ask = |s: &DeliveryState, r: &Wire<Route>| other_home_to_ask(s, Some(r), "r").map(|r| r.id);
        assert_eq!(ask(&s, &two), None, "not before the first attempt");
        start(&mut s, 1_000_000);
        assert_eq!(ask(&s, &two), None, "not before the second");
        start(&mut s, 1_030_000);
        assert_eq!(ask(&s, &two), Some("relay-b".to_string()));
        assert_eq!(ask(&s, &route(1, &["r"])), None, "a sender with one home has no other");
        assert_eq!(ask(&s, &route(1, &["x", "relay-b"])), None, "a route not naming this relay");
        assert_eq!(other_home_to_ask(&s, None, "r"), None);
    }

    #[test]
    fn target_accepted_is_terminal_with_the_source_accepted_at() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        step(&mut s, n, AttemptOutcome::Answered(DeliveryStatus::target_accepted(77)), 1_000_100, &p);
        assert_eq!(s.status(), DeliveryStatus::target_accepted(1000));
    }

    #[test]
    fn retryable_codes_keep_delivering_and_schedule_the_next_slot() {
        let p = Policy::with_relay_id("r");
        for code in
            [ErrorCode::InternalError, ErrorCode::BadGateway, ErrorCode::TemporarilyUnavailable, ErrorCode::RateLimited]
        {
            let mut s = accepted();
            let n = start(&mut s, 1_000_000);
            let ev = when_outcome(&s, n, rejected(code), UnixMillis(1_000_100), &p);
            assert!(
                matches!(
                    ev[..],
                    [DeliveryEvent::AttemptFailed {
                        next_due_ms: UnixMillis(1_030_000),
                        may_switch: false,
                        refresh_route: false,
                        ..
                    }]
                ),
                "{code}: {ev:?}"
            );
            apply_all(&mut s, &ev);
            assert_eq!(s.status().status, Status::Delivering);
        }
    }

    #[test]
    fn route_errors_refresh_the_route_bypassing_caches_and_retry() {
        let p = Policy::with_relay_id("r");
        for code in [
            ErrorCode::RouteStale,
            ErrorCode::TargetNotLocal,
            ErrorCode::RouteNotFound,
            ErrorCode::NotFound,
            ErrorCode::InvalidState,
        ] {
            let mut s = accepted();
            let n = start(&mut s, 1_000_000);
            step(&mut s, n, rejected(code), 1_000_100, &p);
            assert_eq!(s.status().status, Status::Delivering, "{code}");
            assert!(s.wants_fresh_route() && s.may_switch, "{code}");
        }
    }

    #[test]
    fn defined_errors_end_the_delivery_with_that_error() {
        let p = Policy::with_relay_id("r");
        for code in [
            ErrorCode::DeviceUnknown,
            ErrorCode::ClockSkew,
            ErrorCode::Forbidden,
            ErrorCode::InvalidParams,
            ErrorCode::InvalidSignature,
            ErrorCode::StateConflict,
            ErrorCode::PayloadTooLarge,
            ErrorCode::MessageExpired,
            ErrorCode::Unauthorized,
        ] {
            let mut s = accepted();
            let n = start(&mut s, 1_000_000);
            step(&mut s, n, rejected(code), 1_000_100, &p);
            let st = s.status();
            assert_eq!(st.status, Status::Failed);
            assert_eq!(st.error.unwrap().code, code);
        }
    }

    #[test]
    fn unrecognized_remote_code_ends_with_bad_gateway() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let e = RelayError::from_remote("no_such_code", "?", None);
        step(&mut s, n, AttemptOutcome::Unrecognized(e), 1_000_100, &p);
        assert_eq!(s.status().status, Status::Failed);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::BadGateway);
    }

    #[test]
    fn deadline_reached_before_completion_fails_with_message_expired() {
        let mut s = accepted();
        let ev = when_due(&s, UnixMillis((1000 + 5400) * 1000), Some(&route(1, &["relay-b"])));
        apply_all(&mut s, &ev);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn last_attempt_failing_with_no_slot_left_fails_with_message_expired() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000 + 3_600_000);
        step(&mut s, n, rejected(ErrorCode::TemporarilyUnavailable), 1_000_000 + 3_600_500, &p);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn terminal_state_never_changes_and_late_responses_are_ignored() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        step(&mut s, n, rejected(ErrorCode::DeviceUnknown), 1_000_100, &p);
        let before = s.status();
        let late = AttemptOutcome::Answered(DeliveryStatus::target_accepted(5));
        assert!(when_outcome(&s, n, late, UnixMillis(1_000_200), &p).is_empty());
        assert!(when_due(&s, UnixMillis(1_000_300), Some(&route(1, &["relay-b"]))).is_empty());
        assert!(when_peer_confirmed(&s).is_empty());
        assert_eq!(s.status(), before);
    }

    #[test]
    fn answer_to_an_older_attempt_is_ignored() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let first = start(&mut s, 1_000_000);
        step(&mut s, first, rejected(ErrorCode::InternalError), 1_000_100, &p);
        let _second = start(&mut s, 1_030_000);
        let late = AttemptOutcome::Answered(DeliveryStatus::target_accepted(5));
        assert!(when_outcome(&s, first, late, UnixMillis(1_030_100), &p).is_empty());
    }

    #[test]
    fn rate_limited_retry_after_delays_the_next_attempt() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let e = RelayError::new(ErrorCode::RateLimited, "wait").with_data(serde_json::json!({"retry_after": 120}));
        let ev = when_outcome(&s, n, AttemptOutcome::Rejected(e), UnixMillis(1_000_000), &p);
        assert!(matches!(ev[..], [DeliveryEvent::AttemptFailed { next_due_ms: UnixMillis(1_120_000), .. }]), "{ev:?}");
    }

    #[test]
    fn rate_limited_wait_past_the_deadline_ends_with_message_expired() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let e = RelayError::new(ErrorCode::RateLimited, "wait").with_data(serde_json::json!({"retry_after": 99999}));
        step(&mut s, n, AttemptOutcome::Rejected(e), 1_000_000, &p);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn retries_retain_the_original_params_unchanged() {
        // The envelope as the sender signed it: member order and spacing
        // that a re-serialization would change.
        let original = r#"{ "to":"b", "from":"a","message_id":"m", "from_device_id":"d","created_at":1,"ciphertext":"AA","signature":"s"}"#;
        let v = serde_json::to_value(params()).unwrap();
        let (boxes, cert) = (&v["recipient_boxes"], &v["sender_device_certificate"]);
        let text = format!(r#"{{"envelope":{original},"recipient_boxes":{boxes},"sender_device_certificate":{cert}}}"#);
        let p: DeliverParams = serde_json::from_str(&text).unwrap();
        assert_eq!(p.envelope.raw().get(), original);
        // Stored and read back as events, through attempts, a failure and a
        // newer route: what the next attempt sends is still those bytes.
        let policy = Policy::with_relay_id("r");
        let begun = when_accepted(&p, (1000, 6400), Some(&route(1, &["x"])), None, 1_000_000, &policy);
        let mut events = begun.events;
        let mut s = begun.state;
        let failed = when_outcome(&s, 1, rejected(ErrorCode::RouteStale), UnixMillis(1_000_100), &policy);
        apply_all(&mut s, &failed);
        events.extend(failed);
        events.extend(when_due(&s, UnixMillis(1_030_000), Some(&route(2, &["y"]))));
        let stored: Vec<String> = events.iter().map(|e| serde_json::to_string(e).unwrap()).collect();
        let mut replayed = DeliveryState::default();
        for e in &stored {
            replayed.apply(&serde_json::from_str(e).unwrap());
        }
        assert_eq!(replayed.attempts, 2);
        assert_eq!(targets(&replayed), vec!["y"]);
        assert_eq!(replayed.params.as_ref().unwrap().envelope.raw().get(), original);
    }

    #[test]
    fn unknown_result_is_confirmed_with_the_same_target_even_if_a_newer_route_exists() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start_with(&mut s, 1_000_000, &route(1, &["relay-b"]));
        step(&mut s, n, AttemptOutcome::Unknown(RelayError::unavailable("timeout")), 1_000_100, &p);
        start_with(&mut s, 1_030_000, &route(2, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-b"]);
    }

    #[test]
    fn explicit_route_error_switches_only_to_a_higher_revision() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start_with(&mut s, 1_000_000, &route(3, &["relay-b"]));
        step(&mut s, n, rejected(ErrorCode::RouteStale), 1_000_100, &p);
        // A route of the same or a lower revision does not move the target.
        let n = start_with(&mut s, 1_030_000, &route(2, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-b"]);
        step(&mut s, n, rejected(ErrorCode::TargetNotLocal), 1_030_100, &p);
        start_with(&mut s, 1_300_000, &route(4, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-c"]);
    }

    #[test]
    fn receipt_known_not_attempted_may_switch_to_a_higher_revision() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start_with(&mut s, 1_000_000, &route(1, &["relay-b"]));
        step(&mut s, n, AttemptOutcome::NotAttempted(RelayError::unavailable("refused")), 1_000_100, &p);
        start_with(&mut s, 1_030_000, &route(2, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-c"]);
    }

    #[test]
    fn retryable_error_keeps_the_target() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start_with(&mut s, 1_000_000, &route(1, &["relay-b"]));
        step(&mut s, n, rejected(ErrorCode::InternalError), 1_000_100, &p);
        start_with(&mut s, 1_030_000, &route(2, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-b"]);
    }

    #[test]
    fn no_route_known_is_an_attempt_without_target_that_retries() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let ev = when_due(&s, UnixMillis(1_000_000), None);
        assert!(matches!(&ev[..], [DeliveryEvent::AttemptStarted { targets, .. }] if targets.is_empty()));
        apply_all(&mut s, &ev);
        step(&mut s, 1, combine(vec![]), 1_000_100, &p);
        assert_eq!(s.status().status, Status::Delivering);
        assert!(s.wants_fresh_route());
    }

    #[test]
    fn with_two_relays_the_first_acceptance_wins() {
        let accepted = AttemptOutcome::Answered(DeliveryStatus::target_accepted(1));
        let down = AttemptOutcome::Unknown(RelayError::unavailable("timeout"));
        assert!(matches!(combine(vec![down.clone(), accepted.clone()]), AttemptOutcome::Answered(_)));
        assert!(matches!(combine(vec![rejected(ErrorCode::DeviceUnknown), accepted]), AttemptOutcome::Answered(_)));
        // No acceptance: an unknown result keeps the same targets (confirmation),
        // even against a final rejection by the other relay.
        assert!(matches!(combine(vec![rejected(ErrorCode::RouteStale), down.clone()]), AttemptOutcome::Unknown(_)));
        assert!(matches!(combine(vec![rejected(ErrorCode::DeviceUnknown), down]), AttemptOutcome::Unknown(_)));
        let refused = AttemptOutcome::NotAttempted(RelayError::unavailable("refused"));
        assert!(matches!(combine(vec![rejected(ErrorCode::DeviceUnknown), refused]), AttemptOutcome::Rejected(_)));
    }

    #[test]
    fn peer_confirmation_ends_the_delivery_target_accepted() {
        let mut s = accepted();
        let ev = when_peer_confirmed(&s);
        apply_all(&mut s, &ev);
        assert_eq!(s.status(), DeliveryStatus::target_accepted(1000));
    }
}
