//! The one seam between the simulator and relay-core: every rule the sim
//! runs is called here, in the shape the sim needs. When the cores change
//! shape (one aggregate for accounts and deliveries), this file changes
//! and the world does not.

use relay_core::account::decide::Ctx;
use relay_core::account::replica::sent_times;
use relay_core::delivery::core::{self as delivery, Begun};
use relay_core::delivery::timetable::slot_offset_ms;
use relay_core::Policy;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::Route;
use relay_schemas::{UnixMillis, UnixSecs, Wire};

pub use relay_core::delivery::core::DeliveryEvent;
pub use relay_core::delivery::{AttemptOutcome, DeliveryState};

/// A `message.send` accepted at `now_ms` (the relay's clock): its times by
/// the account core's rule, its delivery begun with the route known now
/// and, for a recipient served here alone, the outcome of the receipt made
/// first. Returns the deadline with what to write.
pub fn accept(
    params: DeliverParams,
    digest: String,
    created_at: u64,
    now_ms: UnixMillis,
    route: &Wire<Route>,
    first: Option<AttemptOutcome>,
    policy: &Policy,
) -> (u64, Begun) {
    let now = now_ms.secs();
    let (accepted_at, deadline, _) = sent_times(created_at, now.0, Ctx::new(now, policy));
    let times = (UnixSecs(accepted_at), UnixSecs(deadline));
    (accepted_at, delivery::decide_acceptance(Box::new(params), digest, times, Some(route), first, now_ms, policy))
}

/// A sent message learned from the sender's other home: its times
/// recomputed here, never taken from the page.
pub fn forwarded(
    params: Box<DeliverParams>,
    digest: String,
    (created_at, accepted_at): (u64, u64),
    now_ms: UnixMillis,
    policy: &Policy,
) -> (u64, Begun) {
    let now = now_ms.secs();
    let (accepted_at, deadline, _) = sent_times(created_at, accepted_at, Ctx::new(now, policy));
    let times = (UnixSecs(accepted_at), UnixSecs(deadline));
    (accepted_at, delivery::decide_forwarded(params, digest, times, now_ms, policy))
}

/// Whether the send process delivers before it writes the acceptance.
pub fn local_first(route: &Wire<Route>, own: &str) -> bool {
    delivery::delivered_here_first(Some(route), own)
}

pub fn due(s: &DeliveryState, now_ms: UnixMillis, route: &Wire<Route>) -> Vec<DeliveryEvent> {
    delivery::decide_due(s, now_ms, Some(route))
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
    delivery::decide_outcome(s, attempt, answer, now_ms, policy)
}

/// The sender's other home to ask before this attempt, if any.
pub fn other_home(s: &DeliveryState, sender_route: &Wire<Route>, own: &str) -> Option<String> {
    delivery::other_home_to_ask(s, Some(sender_route), own).map(|r| r.id)
}

pub fn peer_confirmed(s: &DeliveryState) -> Vec<DeliveryEvent> {
    delivery::decide_peer_confirmed(s)
}

/// Timetable slots of `s` strictly between `after_ms` and its deadline.
pub fn slots_between(s: &DeliveryState, after_ms: u64, policy: &Policy) -> usize {
    (0..)
        .map(|k| s.accepted_at.millis().0 + slot_offset_ms(policy, k))
        .take_while(|at| *at < s.deadline.millis().0)
        .filter(|at| *at > after_ms)
        .count()
}
