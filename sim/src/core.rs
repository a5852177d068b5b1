//! The one seam between the simulator and relay-core: every rule the sim
//! runs is called here, in the shape the sim needs. When the cores change
//! shape (one aggregate for accounts and deliveries), this file changes
//! and the world does not.

use crate::relay::SimReads;
use relay_core::account::method::message_deliver;
use relay_core::account::session::Challenges;
use relay_core::account::{self as acct, AccountState, Ctx};
use relay_core::aggregate::Aggregate;
use relay_core::delivery::aggregate::{self as delivery, DeliveryCmd, DeliveryCtx};
use relay_core::delivery::timetable::slot_offset_ms;
use relay_core::policy::Policy;
use relay_core::retention;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{DeliveryStatus, MessageEnvelope, Route, Wire};
use relay_schemas::{RelayError, UnixMillis, UnixSecs};

pub use relay_core::account::{AccountCmd, AccountEvent, Decision, Effect, Reply};
pub use relay_core::delivery::aggregate::DeliveryState;
pub use relay_core::delivery::aggregate::{Begun, DeliveryEvent};
pub use relay_core::delivery::outcome::AttemptOutcome;
pub use relay_core::retention::LedgerSweep;

/// An account command, as the account actor decides it: `state` at this
/// relay, its reads, this relay's clock (seconds) and policy. The sim's
/// commands carry no settlement of their own (`S = ()`): a finished
/// delivery's events ride in the same group as the account's.
pub fn decide(
    state: &AccountState,
    cmd: &AccountCmd<()>,
    reads: &SimReads,
    now: UnixSecs,
    policy: &Policy,
) -> Result<Decision, RelayError> {
    // No command the sim sends draws randomness or a session challenge.
    acct::decide(state, &mut Challenges::default(), cmd, reads, Ctx::new(now, policy))
}

/// PROTOCOL §5 *Who may deliver*, as the `message.deliver` handler asks
/// it before the recipient's account decides.
pub fn may_deliver(
    params: &DeliverParams,
    known: Option<&Wire<Route>>,
    caller: &str,
    now: UnixSecs,
    policy: &Policy,
) -> Result<(), RelayError> {
    message_deliver::may_deliver(params.sender_route.as_ref(), known, caller, &params.envelope, Ctx::new(now, policy))
}

/// Where an account this relay does not hold lives now (the handler's
/// answer before any account decides).
pub fn not_served_here(known: Option<&Wire<Route>>) -> RelayError {
    acct::not_served_here(known)
}

/// The digest a receipt is keyed on (the destination computes it from the
/// body; the same bytes).
pub fn deliver_digest(p: &DeliverParams) -> String {
    message_deliver::deliver_digest(p).expect("params the sim built canonicalize")
}

/// The status the send process settles a local first attempt with, if it
/// ended the delivery.
pub fn final_status(outcome: &AttemptOutcome, accepted_at: u64) -> Option<DeliveryStatus> {
    relay_core::delivery::outcome::final_status(outcome, UnixSecs(accepted_at))
}

/// What the retention sweep does with the message in `event` at `now`:
/// nothing yet (`None`), or remove its traces leaving its ledger entry as
/// said. relay-core's `traces`, `is_past` and `ledger_sweep`.
pub fn sweep(account_id: &str, event: &AccountEvent, now: UnixSecs, policy: &Policy) -> Option<LedgerSweep> {
    let t = retention::traces(account_id, event)?;
    retention::is_past(t.retention_until, now).then(|| retention::ledger_sweep(&t, now, policy))
}

/// The envelope's sending device is one the account revoked at or before
/// its `created_at` (a later envelope of a revoked device).
pub fn revoked_before(state: &AccountState, env: &MessageEnvelope) -> bool {
    state.revocations().get(&env.from_device_id).is_some_and(|r| r.revoked_at <= env.created_at)
}

/// The delivery's events for `cmd`, as its actor decides them.
fn delivery_decide(s: &DeliveryState, cmd: &DeliveryCmd, now_ms: UnixMillis, policy: &Policy) -> Vec<DeliveryEvent> {
    let decided = s.decide(cmd, DeliveryCtx { now_ms, policy });
    decided.expect("a begun delivery takes every command but a second beginning").events
}

pub fn due(s: &DeliveryState, now_ms: UnixMillis, route: &Wire<Route>, policy: &Policy) -> Vec<DeliveryEvent> {
    delivery_decide(s, &DeliveryCmd::Due { route: Some(route) }, now_ms, policy)
}

/// One outcome for the answers of every relay of the target (a timeout
/// for a missing one).
pub fn combine(answers: Vec<AttemptOutcome>) -> AttemptOutcome {
    delivery::combine(answers)
}

/// The answer to attempt `attempt`; one to an attempt already settled
/// (a late answer) must decide nothing.
pub fn outcome(
    s: &DeliveryState,
    attempt: u32,
    answer: AttemptOutcome,
    now_ms: UnixMillis,
    policy: &Policy,
) -> Vec<DeliveryEvent> {
    delivery_decide(s, &DeliveryCmd::Outcome { attempt, outcome: &answer }, now_ms, policy)
}

/// The sender's other home to ask before this attempt, if any.
pub fn other_home(s: &DeliveryState, sender_route: &Wire<Route>, own: &str) -> Option<String> {
    delivery::other_home_to_ask(s, Some(sender_route), own).map(|r| r.id)
}

pub fn peer_confirmed(s: &DeliveryState, now_ms: UnixMillis, policy: &Policy) -> Vec<DeliveryEvent> {
    delivery_decide(s, &DeliveryCmd::PeerConfirmed, now_ms, policy)
}

/// Timetable slots of `s` strictly between `after_ms` and its deadline.
pub fn slots_between(s: &DeliveryState, after_ms: u64, policy: &Policy) -> usize {
    (0..)
        .map(|k| s.accepted_at.millis().0 + slot_offset_ms(policy, k))
        .take_while(|at| *at < s.deadline.millis().0)
        .filter(|at| *at > after_ms)
        .count()
}
