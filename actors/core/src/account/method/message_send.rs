//! `message.send` (PROTOCOL §4): the source accepts a message from the
//! session's device ([`send`]) and begins its delivery. Three commands:
//!
//! - `MessageSend` decides; to an account served here alone it writes
//!   nothing and answers [`Reply::Accept`], as the process manager
//!   delivers first;
//! - `Settle` writes that acceptance with the final status the local
//!   delivery gave at once ([`settle`]);
//! - `Accept` writes it with its delivery (and the outcome of a local
//!   attempt that did not end it), as `MessageSend` does for any other
//!   route (`accept`);
//! - `RecordDelivery` writes a delivery's outcome, reported by the delivery
//!   once it ends after acceptance, to the sender's ledger
//!   ([`record_delivery`]), which `message.delivery.status` reads.
//!
//! The process manager ([`SendProcess`]) decides which of them goes to
//! whom, as a pure state machine: the shell (the supervisor's
//! `message_send`) only carries out each [`Next`] and feeds back what came
//! of it.
//!
//! 1. The recipient's route is looked up, unless the sender sends to its
//!    own account (self-delivery needs no route).
//! 2. The sender's account decides `MessageSend`. Anything but
//!    [`Reply::Accept`] (a duplicate, a self-delivery, an acceptance written
//!    with its delivery) is the answer.
//! 3. [`Reply::Accept`]: the recipient is served by this relay alone, so its
//!    account takes the receipt first (commit 1), answered at once.
//! 4. The sender's account writes the acceptance (commit 2): with the final
//!    status when the receipt ended the delivery (`Settle`), else with its
//!    delivery and that first attempt (`Accept`). The client is answered
//!    once commit 2 is durable, which covers commit 1.
//!
//! A receipt refused with `StateConflict` writes nothing at the sender: the
//! recipient holds other params under this message id, so the request is
//! refused as the sender's ledger would refuse it once the other send
//! settles, and only once the recipient's receipt is durable.

use crate::account::decision::{Acceptance, Decision, Effect, Reads, Reply, Written};
use crate::account::events::AccountEvent;
use crate::account::ledger::SendEntry;
use crate::account::method::message_deliver::deliver_digest;
use crate::account::shared::{
    check_created_at, check_session, idempotent, record, registered_route, served_here, visible_devices, Ctx,
};
use crate::account::state::AccountState;
use crate::delivery::aggregate::{begin, DeliveryCmd, DeliveryCtx};
use crate::delivery::outcome::{final_status, AttemptOutcome};
use relay_schemas::methods::{DeliverParams, SendParams};
use relay_schemas::objects::{check_boxes, DeliveryStatus, Route, Wire};
use relay_schemas::sign::Tag;
use relay_schemas::{ErrorCode, RelayError, UnixSecs};

/// `MessageSend`: a duplicate answers its status, a self-delivery writes
/// its record, a send to an account served here alone is decided only
/// (answered [`Reply::Accept`]), any other is accepted with its delivery.
pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &SendParams,
    digest: &str,
    route: Option<&Wire<Route>>,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    let prior = reads.send_entry(&params.envelope.message_id)?;
    Ok(match send(state, prior.as_ref(), device, params, digest, ctx)? {
        SendDecision::Duplicate(status) => Decision::reply(Reply::Status(status)),
        SendDecision::SelfDelivered { event, status } => Decision::write(vec![event], Reply::Status(status)),
        SendDecision::Sent { event, status, deliver, deadline } => {
            let deliver_digest = deliver_digest(&deliver)?;
            let acceptance = Acceptance { event, status, deliver, deliver_digest, deadline };
            if delivered_here_first(route, &ctx.policy.relay_id) {
                return Ok(Decision::reply(Reply::Accept(Box::new(acceptance))));
            }
            accept(state, acceptance, route, None, ctx)?
        }
    })
}

/// Whether a `message.send` is delivered before its acceptance is written:
/// the recipient's route names this relay alone, so the attempt is a call
/// into this process that ends at once (see `final_status`). A route
/// naming another relay too is delivered to both by a delivery stream.
pub fn delivered_here_first(route: Option<&Wire<Route>>, own_relay_id: &str) -> bool {
    route.is_some_and(|r| r.relays.len() == 1 && r.lists_relay(own_relay_id))
}

/// `Settle`: the decided acceptance with the final status its local
/// delivery gave at once, unless a retry settled first.
pub(crate) fn decide_settle(
    state: &AccountState,
    acceptance: &Acceptance,
    status: &DeliveryStatus,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    let prior = reads.send_entry(&acceptance.deliver.envelope.message_id)?;
    Ok(match settle(state, prior.as_ref(), &acceptance.event, status, ctx)? {
        SettleDecision::Duplicate(status) => Decision::reply(Reply::Status(status)),
        SettleDecision::Settled { events, status } => Decision::write(events, Reply::Settled { status, head: () }),
    })
}

/// `Accept`: the decided acceptance with its delivery and `first`, the
/// outcome of the local attempt made before, unless a retry was accepted
/// first.
pub(crate) fn decide_accept(
    state: &AccountState,
    acceptance: &Acceptance,
    route: Option<&Wire<Route>>,
    first: Option<&AttemptOutcome>,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    Ok(match reads.send_entry(&acceptance.deliver.envelope.message_id)? {
        // A retry racing this one was accepted first.
        Some(entry) => match settle(state, Some(&entry), &acceptance.event, &acceptance.status, ctx)? {
            SettleDecision::Duplicate(status) | SettleDecision::Settled { status, .. } => {
                Decision::reply(Reply::Status(status))
            }
        },
        None => accept(state, acceptance.clone(), route, first, ctx)?,
    })
}

/// Atomic acceptance: the sent record, the idempotency result, the
/// delivery's first events and its due-index entry in one commit. With the
/// route known, the first attempt rides in it: in flight (`first` is
/// `None`: the shell starts it once the commit is durable), or already
/// made here with outcome `first` (then the next is due by the timetable,
/// or the delivery ended and its status is written too).
fn accept(
    state: &AccountState,
    a: Acceptance,
    route: Option<&Wire<Route>>,
    first: Option<&AttemptOutcome>,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    let Acceptance { event, status, deliver, deliver_digest, deadline } = a;
    let message_id = deliver.envelope.message_id.clone();
    let (accepted_at, deadline) = (UnixSecs(status.accepted_at), UnixSecs(deadline));
    let cmd = DeliveryCmd::Accept { params: &deliver, digest: &deliver_digest, accepted_at, deadline, route, first };
    let begun = begin(&cmd, DeliveryCtx { now_ms: ctx.now.millis(), policy: ctx.policy })?;
    let mut events = vec![restamp(state, event)];
    let reply = match &begun.state.finished {
        // Ended by the attempt made before: reported finished with the acceptance.
        Some(done) => {
            events.push(AccountEvent::DeliveryUpdated { message_id, status: done.clone() });
            Reply::Settled { status: done.clone(), head: () }
        }
        None => Reply::Status(status),
    };
    Ok(Decision { events, reply, effects: vec![Effect::BeginDelivery(Box::new(begun))] })
}

/// What a `message.send` decided.
#[derive(Debug)]
pub enum SendDecision {
    /// Same key, same content: the latest status, nothing appended.
    Duplicate(DeliveryStatus),
    /// Self-delivery: one record, `target_accepted` at once.
    SelfDelivered { event: AccountEvent, status: DeliveryStatus },
    /// Cross-account: accepted, delivery to start with these params.
    Sent { event: AccountEvent, status: DeliveryStatus, deliver: Box<DeliverParams>, deadline: u64 },
}

/// `message.send` at the source. `digest` is blake3(JCS(params)); `prior`
/// is the ledger's entry for `envelope.message_id`.
pub fn send(
    state: &AccountState,
    prior: Option<&SendEntry>,
    device_id: &str,
    p: &SendParams,
    digest: &str,
    ctx: Ctx,
) -> Result<SendDecision, RelayError> {
    let env = &p.envelope;
    // Basic parameter validation and invocation requirements come first,
    // even for a duplicate (seed: idempotent retries).
    env.check_constraints(ctx.policy.max_ciphertext_bytes)?;
    check_boxes("recipient_boxes", &p.recipient_boxes, ctx.policy.max_boxes)?;
    if let Some(sb) = &p.sender_boxes {
        check_boxes("sender_boxes", sb, ctx.policy.max_boxes)?;
    }
    // Kept with the delivery and sent on: bounded here, though only the
    // recipient's home can verify it.
    if let Some(auth) = &p.authorization {
        auth.check_size(ctx.policy.max_object_bytes)?;
    }
    if env.from != state.account_id {
        return Err(RelayError::forbidden("envelope.from is not the session's account"));
    }
    if env.from_device_id != device_id {
        return Err(RelayError::forbidden("envelope.from_device_id is not the session's device"));
    }
    if let Some(entry) = prior {
        idempotent(digest, &entry.digest, entry.retention_until, ctx.now)?;
        return Ok(SendDecision::Duplicate(entry.status.clone()));
    }
    served_here(state, ctx)?;
    let device_key = state
        .device_key(device_id, ctx.now)
        .ok_or_else(|| RelayError::device_unknown("sending device is not valid"))?;
    env.verify(Tag::Envelope, device_key)?;
    check_created_at(env, ctx)?;

    // Events and statuses carry the protocol's plain seconds.
    let accepted_at = ctx.now.0;
    let retention_until = crate::retention::retention_until(accepted_at, ctx.policy);
    if env.to == state.account_id {
        // Self-delivery: receiving rules for our own account; no authorization.
        let visible = visible_devices(state, &p.recipient_boxes, ctx.now);
        if visible.is_empty() {
            return Err(RelayError::device_unknown("no recipient box names a valid device"));
        }
        let status = DeliveryStatus::target_accepted(accepted_at);
        let event = AccountEvent::SelfDelivered {
            message_id: env.message_id.clone(),
            digest: digest.into(),
            accepted_at,
            retention_until,
            record: record(state, env, &p.recipient_boxes, visible, retention_until),
        };
        return Ok(SendDecision::SelfDelivered { event, status });
    }
    let sent_record = p
        .sender_boxes
        .as_ref()
        .map(|boxes| record(state, env, boxes, visible_devices(state, boxes, ctx.now), retention_until));
    let deadline = (env.created_at + ctx.policy.delivery_age_limit).min(retention_until);
    let deliver = Box::new(DeliverParams {
        envelope: env.clone(),
        recipient_boxes: p.recipient_boxes.clone(),
        sender_device_certificate: state
            .certificate(device_id)
            .ok_or_else(|| RelayError::device_unknown("sending device is not valid"))?
            .clone(),
        sender_route: Some(registered_route(state)?.clone()),
        authorization: p.authorization.clone(),
    });
    let event = AccountEvent::MessageSent {
        message_id: env.message_id.clone(),
        to: env.to.clone(),
        digest: digest.into(),
        accepted_at,
        deadline,
        retention_until,
        record: sent_record,
        status: None,
    };
    Ok(SendDecision::Sent { event, status: DeliveryStatus::delivering(accepted_at), deliver, deadline })
}

/// What settling a `message.send` at once decided.
#[derive(Debug)]
pub enum SettleDecision {
    /// A retry of the same send settled first: its status, nothing appended.
    Duplicate(DeliveryStatus),
    Settled {
        events: Vec<AccountEvent>,
        status: DeliveryStatus,
    },
}

/// A `message.send` whose delivery ended before its acceptance was written
/// (the recipient is an account of this relay and took or refused it at
/// once): the acceptance `sent` (a `MessageSent` from [`send`]) and its
/// final status are one commit. `prior` is the ledger's entry now: a retry
/// racing this one may have settled first.
pub fn settle(
    state: &AccountState,
    prior: Option<&SendEntry>,
    sent: &AccountEvent,
    status: &DeliveryStatus,
    ctx: Ctx,
) -> Result<SettleDecision, RelayError> {
    let AccountEvent::MessageSent { digest, accepted_at, .. } = sent else {
        return Err(RelayError::internal("only a message_sent settles"));
    };
    if let Some(entry) = prior {
        idempotent(digest, &entry.digest, entry.retention_until, ctx.now)?;
        return Ok(SettleDecision::Duplicate(entry.status.clone()));
    }
    let status = DeliveryStatus { accepted_at: *accepted_at, ..status.clone() };
    let mut settled = restamp(state, sent.clone());
    if let AccountEvent::MessageSent { status: s, .. } = &mut settled {
        *s = Some(status.clone());
    }
    Ok(SettleDecision::Settled { events: vec![settled], status })
}

/// `RecordDelivery`: a delivery's outcome for the sender, answered with
/// the status as recorded.
pub(crate) fn decide_record(
    message_id: &str,
    status: &DeliveryStatus,
    reads: &impl Reads,
) -> Result<Decision, RelayError> {
    let entry = reads.send_entry(message_id)?;
    let events = record_delivery(entry.as_ref(), message_id, status);
    // The status as recorded: a terminal one never changes.
    let current = match events.first() {
        Some(AccountEvent::DeliveryUpdated { status, .. }) => status.clone(),
        _ => entry.map_or_else(|| status.clone(), |e| e.status),
    };
    Ok(Decision::write(events, Reply::Settled { status: current, head: () }))
}

/// A delivery outcome reported to the sender's account; `entry` is the
/// ledger's entry for `message_id`. The status keeps the source's
/// `accepted_at`; terminal states never change, so repeated or late
/// reports are no-ops.
pub fn record_delivery(entry: Option<&SendEntry>, message_id: &str, status: &DeliveryStatus) -> Vec<AccountEvent> {
    let Some(entry) = entry else { return vec![] };
    let status = DeliveryStatus { accepted_at: entry.status.accepted_at, ..status.clone() };
    if entry.status.status.is_terminal() || entry.status == status {
        return vec![];
    }
    vec![AccountEvent::DeliveryUpdated { message_id: message_id.into(), status }]
}

/// A `message_sent` decided earlier and written now: other records may
/// have been written in between, so its record takes the sequence that is
/// next now (timeline sequences are dense and never reused).
pub fn restamp(state: &AccountState, mut sent: AccountEvent) -> AccountEvent {
    if let AccountEvent::MessageSent { record: Some(r), .. } = &mut sent {
        r.sequence = state.last_sequence + 1;
    }
    sent
}

/// How much longer than one attempt's timeout the `message.send` handler
/// waits for the first delivery attempt: the attempt ends itself at
/// `attempt_timeout_ms`, so the client gets that outcome; the margin covers
/// the attempt's scheduling and commit, and past it the client gets the
/// status the acceptance wrote (the delivery goes on either way).
pub const FIRST_ATTEMPT_MARGIN_MS: u64 = 1_000;

/// How long the `message.send` answer waits for the first attempt's outcome.
pub fn first_attempt_wait_ms(policy: &crate::policy::Policy) -> u64 {
    policy.attempt_timeout_ms.saturating_add(FIRST_ATTEMPT_MARGIN_MS)
}

// The process manager: which command goes to whom next, between the
// sender's and the recipient's commits.

/// One `message.send` between its commits.
#[derive(Debug)]
pub struct SendProcess {
    /// The recipient account.
    to: String,
    /// The recipient's route as looked up (`None`: self-delivery, or no
    /// route known yet).
    route: Option<Wire<Route>>,
    phase: Phase,
}

#[derive(Debug)]
enum Phase {
    /// Waiting for the recipient's route; the send is not yet decided.
    Routing {
        device: String,
        params: Box<SendParams>,
        digest: String,
    },
    /// Waiting for the sender's decision of `MessageSend`.
    Deciding,
    /// Waiting for the recipient's receipt of the decided acceptance.
    Receiving(Box<Acceptance>),
    /// Waiting for the sender's commit of the acceptance.
    Writing(Finished),
    Done,
}

/// What came of the last [`Next`].
#[derive(Debug)]
pub enum Input<W: Written> {
    /// The recipient's route (after [`Next::LookupRoute`]).
    Routed(Option<Wire<Route>>),
    /// The sender's account answered (after [`Next::AskSender`]).
    Replied(Reply<W>),
    /// The recipient's receipt came to this (after [`Next::Receive`]).
    Received(AttemptOutcome),
}

/// What the shell does next.
#[derive(Debug)]
pub enum Next<C, W: Written> {
    /// Look up the recipient's route ([`SendProcess::to`], no fresh
    /// lookup); a send is refused only when no relay serves it.
    LookupRoute,
    /// Ask the sender's account, answered once durable.
    AskSender(C),
    /// Ask the recipient's account ([`SendProcess::to`]) for its receipt,
    /// answered at once: the sender's later durable commit covers it.
    Receive(C),
    /// Refuse the request once everything written so far is durable (the
    /// refusal rests on the recipient's receipt).
    RefuseWhenDurable(RelayError),
    /// Answer the client with the sender's reply. `finished`: the
    /// delivery ended by this request's own commit.
    Answer { reply: Reply<W>, finished: Option<Finished> },
}

/// The message of a delivery that ended at acceptance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub from: String,
    pub message_id: String,
    pub to: String,
    pub accepted_at: UnixSecs,
}

impl SendProcess {
    /// `message.send` by `device` of `account`: refused at once for a
    /// malformed recipient, else its first step.
    pub fn start<C: SendCmds, W: Written>(
        account: &str,
        device: String,
        params: SendParams,
        digest: String,
    ) -> Result<(Self, Next<C, W>), RelayError> {
        let to = params.envelope.to.clone();
        relay_schemas::ids::check_account_id("envelope.to", &to)?;
        if to == account {
            // Self-delivery: the sender's account writes the record itself.
            let mut process = SendProcess { to, route: None, phase: Phase::Done };
            let next = process.decide(device, params, digest);
            return Ok((process, next));
        }
        let routing = Phase::Routing { device, params: Box::new(params), digest };
        Ok((SendProcess { to, route: None, phase: routing }, Next::LookupRoute))
    }

    /// The recipient account.
    pub fn to(&self) -> &str {
        &self.to
    }

    /// The next step after `input`; an input the current step does not
    /// expect is an internal error.
    pub fn on<C: SendCmds, W: Written>(&mut self, input: Input<W>) -> Result<Next<C, W>, RelayError> {
        match (std::mem::replace(&mut self.phase, Phase::Done), input) {
            (Phase::Routing { device, params, digest }, Input::Routed(route)) => {
                self.route = route;
                Ok(self.decide(device, *params, digest))
            }
            (Phase::Deciding, Input::Replied(Reply::Accept(acceptance))) => {
                let receipt = C::message_deliver((*acceptance.deliver).clone(), acceptance.deliver_digest.clone());
                self.phase = Phase::Receiving(acceptance);
                Ok(Next::Receive(receipt))
            }
            (Phase::Deciding, Input::Replied(reply)) => Ok(Next::Answer { reply, finished: None }),
            (Phase::Receiving(_), Input::Received(AttemptOutcome::Rejected(e)))
                if e.code == ErrorCode::StateConflict =>
            {
                // The recipient holds other deliver params under this
                // message id: another content under the same id, racing
                // this send, was received first, or a retry after a crash
                // differs from the original. Settling this one `failed`
                // could let it win the sender's ledger while the recipient
                // holds the other content, so nothing is written.
                Ok(Next::RefuseWhenDurable(e))
            }
            (Phase::Receiving(acceptance), Input::Received(outcome)) => {
                let accepted_at = UnixSecs(acceptance.status.accepted_at);
                let env = &acceptance.deliver.envelope;
                let finished = Finished {
                    from: env.from.clone(),
                    message_id: env.message_id.clone(),
                    to: env.to.clone(),
                    accepted_at,
                };
                self.phase = Phase::Writing(finished);
                Ok(Next::AskSender(match final_status(&outcome, accepted_at) {
                    Some(status) => C::settle(acceptance, status),
                    // The attempt is recorded with the acceptance; the
                    // timetable makes the next one.
                    None => C::accept(acceptance, self.route.clone(), Some(outcome)),
                }))
            }
            (Phase::Writing(finished), Input::Replied(reply)) => {
                // `Settled` only when this request's commit wrote the final
                // status (a racing retry that settled first answers `Status`).
                let finished = matches!(reply, Reply::Settled { .. }).then_some(finished);
                Ok(Next::Answer { reply, finished })
            }
            (phase, input) => {
                let e = RelayError::internal(format!("message.send in {phase:?} cannot take {input:?}"));
                self.phase = phase;
                Err(e)
            }
        }
    }

    /// The sender's account decides the send with the route looked up.
    fn decide<C: SendCmds, W: Written>(&mut self, device: String, params: SendParams, digest: String) -> Next<C, W> {
        self.phase = Phase::Deciding;
        Next::AskSender(C::message_send(device, params, digest, self.route.clone()))
    }
}

/// The account commands the process asks for, built by the command type
/// (`AccountCmd` in `command.rs`, which dispatches to this file: the
/// process names them through this trait so the two import one way).
pub trait SendCmds {
    /// `MessageSend`: the sender's decision.
    fn message_send(device: String, params: SendParams, digest: String, route: Option<Wire<Route>>) -> Self;
    /// `MessageDeliver`: the recipient's receipt.
    fn message_deliver(params: DeliverParams, digest: String) -> Self;
    /// `Settle`: the acceptance with its final status.
    fn settle(acceptance: Box<Acceptance>, status: DeliveryStatus) -> Self;
    /// `Accept`: the acceptance with its delivery and the first attempt.
    fn accept(acceptance: Box<Acceptance>, route: Option<Wire<Route>>, first: Option<AttemptOutcome>) -> Self;
}

#[cfg(test)]
mod tests {
    //! `message.send` at the source, account self-delivery included.
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::testkit::*;
    use relay_schemas::objects::RelayRef;

    fn send_cmd(v: &Value, route: Option<Value>) -> Cmd {
        AccountCmd::MessageSend {
            device: "phone".into(),
            params: parse(v),
            digest: digest(v),
            route: route.map(|r| wire(&r)),
        }
    }

    /// Bob's route naming `relays`.
    fn bob_route(relays: &[&str]) -> Value {
        route(&bob(), 1, relays)
    }

    #[test]
    fn the_send_answer_waits_for_the_first_attempt_one_second_past_its_timeout() {
        let policy =
            crate::policy::Policy { attempt_timeout_ms: 10_000, ..crate::policy::Policy::with_relay_id("relay-a") };
        assert_eq!(first_attempt_wait_ms(&policy), 11_000);
        let never = crate::policy::Policy { attempt_timeout_ms: u64::MAX, ..policy };
        assert_eq!(first_attempt_wait_ms(&never), u64::MAX, "no overflow");
    }

    #[test]
    fn a_send_to_an_account_served_here_alone_is_decided_without_writing() {
        let d = when(&given_alice([]), send_cmd(&alice_to_bob(1), Some(bob_route(&[RELAY])))).unwrap();
        assert!(d.events.is_empty() && d.effects.is_empty());
        let Reply::Accept(a) = d.reply else { panic!("expected an acceptance to deliver first, got {:?}", d.reply) };
        assert_eq!(a.status, DeliveryStatus::delivering(NOW));
        assert_eq!(a.deadline, NOW + age_limit());
    }

    #[test]
    fn a_send_elsewhere_writes_its_acceptance_and_begins_its_delivery_in_one_decision() {
        let d = when(&given_alice([]), send_cmd(&alice_to_bob(1), Some(bob_route(&["relay-b"])))).unwrap();
        assert!(matches!(&d.events[..], [AccountEvent::MessageSent { .. }]));
        assert_eq!(*reply_status(&d.reply), DeliveryStatus::delivering(NOW));
        let [Effect::BeginDelivery(begun)] = &d.effects[..] else {
            panic!("expected one delivery, got {:?}", d.effects)
        };
        assert_eq!(begun.due_ms.map(|ms| ms.secs()), Some(UnixSecs(NOW)), "its first attempt is due now");
        let target = begun.state.target.as_ref().expect("the route resolved at acceptance is the first target");
        assert_eq!(target.relays, vec![RelayRef { id: "relay-b".into(), url: URL_B.into() }]);
        assert_eq!(begun.state.finished, None);
    }

    #[test]
    fn an_accept_that_lost_the_race_to_a_retry_answers_the_first_result_and_writes_nothing() {
        let s = given_alice([]);
        let Reply::Accept(a) = when(&s, send_cmd(&alice_to_bob(1), Some(bob_route(&[RELAY])))).unwrap().reply else {
            panic!("expected an acceptance")
        };
        let settled = DeliveryStatus::target_accepted(NOW);
        let first = when(&s, Cmd::Settle { acceptance: a.clone(), status: settled.clone() }).unwrap();
        assert!(
            matches!(&first.events[..], [AccountEvent::MessageSent { status: Some(st), .. }] if *st == settled),
            "the acceptance and its final status, one event: {:?}",
            first.events
        );
        assert!(matches!(first.reply, Reply::Settled { .. }), "the settling command reports the delivery finished");
        let after = given(&alice(), &[alice_history(), first.events].concat());
        let late = when(&after, Cmd::Accept { acceptance: a, route: None, first: None }).unwrap();
        assert!(late.events.is_empty() && late.effects.is_empty());
        assert!(matches!(&late.reply, Reply::Status(s) if *s == settled), "the first settlement was reported");
    }

    #[test]
    fn send_requires_the_session_account_to_be_the_envelope_sender() {
        let s = given_alice([]);
        // Bob's envelope, properly signed by Bob's device, submitted on Alice's account.
        let v = send_value(envelope(&bob_phone(), &bob(), &alice(), 1, NOW), &["phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::Forbidden);
        then_error(when_send(&s, "bob-phone", &v, at(NOW)), ErrorCode::Forbidden);
    }

    #[test]
    fn send_requires_the_session_device_to_be_the_envelope_sending_device() {
        let s = given_alice([]);
        let v = send_value(envelope(&laptop(), &alice(), &bob(), 1, NOW), &["bob-phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::Forbidden);
        then_sent(when_send(&s, "laptop", &v, at(NOW)));
    }

    #[test]
    fn send_rejects_a_forged_envelope_signature() {
        let s = given_alice([]);
        // Claims to be from the phone, signed by a key that is not the phone's.
        let forged = signed(Tag::Envelope, envelope(&phone(), &alice(), &bob(), 1, NOW), &tablet().key);
        let v = send_value(forged, &["bob-phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidSignature);
        // The phone's signature over other content.
        let altered = tampered(envelope(&phone(), &alice(), &bob(), 1, NOW), "created_at", json!(NOW - 1));
        let v = send_value(altered, &["bob-phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn send_rejects_an_envelope_signed_under_another_domain_tag() {
        let s = given_alice([]);
        let wrong_tag = signed(Tag::Route, envelope(&phone(), &alice(), &bob(), 1, NOW), &phone().key);
        let v = send_value(wrong_tag, &["bob-phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn send_rejects_ciphertext_over_the_size_limit() {
        let s = given_alice([]);
        let max = POLICY.max_ciphertext_bytes;
        let over = phone().envelope(&alice().id, &bob().id, &mid(1), NOW, &vec![7u8; max + 1]);
        then_error(
            when_send(&s, "phone", &send_value(over, &["bob-phone"], None), at(NOW)),
            ErrorCode::PayloadTooLarge,
        );
        let at_limit = phone().envelope(&alice().id, &bob().id, &mid(2), NOW, &vec![7u8; max]);
        then_sent(when_send(&s, "phone", &send_value(at_limit, &["bob-phone"], None), at(NOW)));
    }

    #[test]
    fn send_rejects_ciphertext_that_is_not_base64url_without_padding() {
        let s = given_alice([]);
        for bad in ["AQ==", "a+b/", "AQID!"] {
            let env = signed(
                Tag::Envelope,
                tampered(envelope(&phone(), &alice(), &bob(), 1, NOW), "ciphertext", json!(bad)),
                &phone().key,
            );
            let v = send_value(env, &["bob-phone"], None);
            then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidParams);
        }
    }

    #[test]
    fn send_rejects_an_empty_ciphertext() {
        let s = given_alice([]);
        let env = phone().envelope(&alice().id, &bob().id, &mid(1), NOW, b"");
        then_error(when_send(&s, "phone", &send_value(env, &["bob-phone"], None), at(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn send_requires_key_boxes_with_distinct_device_ids() {
        let s = given_alice([]);
        let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &["bob-phone", "bob-phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidParams);
        let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &["bob-phone"], Some(&["phone", "phone"]));
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidParams);
        let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &[], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn send_rejects_created_at_beyond_the_clock_tolerance() {
        let s = given_alice([]);
        let tol = POLICY.clock_tolerance;
        let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW + tol + 1), &["bob-phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::ClockSkew);
        let v = send_value(envelope(&phone(), &alice(), &bob(), 2, NOW + tol), &["bob-phone"], None);
        then_sent(when_send(&s, "phone", &v, at(NOW)));
    }

    #[test]
    fn send_rejects_created_at_older_than_the_delivery_age_limit() {
        let s = given_alice([]);
        let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW - age_limit() - 1), &["bob-phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::MessageExpired);
        let v = send_value(envelope(&phone(), &alice(), &bob(), 2, NOW - age_limit() + 1), &["bob-phone"], None);
        then_sent(when_send(&s, "phone", &v, at(NOW)));
    }

    #[test]
    fn send_from_a_revoked_or_unknown_device_is_device_unknown() {
        let s = given_alice([device_revoked(&alice(), "laptop")]);
        let v = send_value(envelope(&laptop(), &alice(), &bob(), 1, NOW), &["bob-phone"], None);
        then_error(when_send(&s, "laptop", &v, at(NOW)), ErrorCode::DeviceUnknown);
        let v = send_value(envelope(&tablet(), &alice(), &bob(), 2, NOW), &["bob-phone"], None);
        then_error(when_send(&s, "tablet", &v, at(NOW)), ErrorCode::DeviceUnknown);
    }

    #[test]
    fn send_is_refused_when_this_relay_no_longer_serves_the_sender() {
        let moved = route(&alice(), 2, &["relay-b"]);
        let s = given_alice([route_updated(&moved)]);
        then_route_error(when_send(&s, "phone", &alice_to_bob(1), at(NOW)), &moved);
    }

    #[test]
    fn send_accepts_with_status_delivering_at_the_source_acceptance_time() {
        let s = given_alice([]);
        let sent = then_sent(when_send(&s, "phone", &alice_to_bob(1), at(NOW + 7)));
        assert_eq!(sent.status, DeliveryStatus::delivering(NOW + 7));
        match &sent.event {
            AccountEvent::MessageSent { message_id, to, accepted_at, retention_until, .. } => {
                assert_eq!(message_id, &mid(1));
                assert_eq!(to, &bob().id);
                assert_eq!(*accepted_at, NOW + 7);
                assert_eq!(*retention_until, NOW + 7 + retention());
            }
            e => panic!("expected MessageSent, got {e:?}"),
        }
    }

    #[test]
    fn send_forwards_the_original_envelope_recipient_boxes_certificate_on_file_and_authorization() {
        let s = given_alice([]);
        let auth = grant_auth(bob().grant("grant-alice", &alice().id, ISSUED, None));
        let v = with_auth(alice_to_bob(1), auth.clone());
        let sent = then_sent(when_send(&s, "phone", &v, at(NOW)));
        let forwarded = serde_json::to_value(&sent.deliver).unwrap();
        assert_eq!(sent.deliver.envelope.raw().get(), v["envelope"].to_string());
        assert_eq!(forwarded["envelope"], v["envelope"]);
        assert_eq!(forwarded["recipient_boxes"], v["recipient_boxes"]);
        assert_eq!(forwarded["sender_device_certificate"], cert(&alice(), &phone()));
        assert_eq!(forwarded["authorization"], auth);
        // Sender key boxes remain at the source.
        assert!(forwarded.get("sender_boxes").is_none());
    }

    #[test]
    fn send_retry_with_identical_content_returns_the_original_status_and_appends_nothing() {
        let s = given_alice([]);
        let v = alice_to_bob(1);
        let s = given_alice([send_event(&s, &v)]);
        let status = then_send_duplicate(when_send(&s, "phone", &v, at(NOW + 60)));
        assert_eq!(status, DeliveryStatus::delivering(NOW));
        // The latest known status, still with the original accepted_at.
        let done = when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 5));
        let s2 = {
            let mut s2 = s.clone();
            done.iter().for_each(|e| s2.apply(e));
            s2
        };
        let status = then_send_duplicate(when_send(&s2, "phone", &v, at(NOW + 120)));
        assert_eq!(status, DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn send_retry_with_different_content_is_state_conflict_and_leaves_the_original_untouched() {
        let s = given_alice([]);
        let original = alice_to_bob(1);
        let s = given_alice([send_event(&s, &original)]);
        let entry_before = s.sent(&mid(1)).clone();
        // Other ciphertext under the same message id.
        let other_env = phone().envelope(&alice().id, &bob().id, &mid(1), NOW, b"other ciphertext");
        let other = send_value(other_env, &["bob-phone"], Some(&["phone", "laptop"]));
        then_error(when_send(&s, "phone", &other, at(NOW + 1)), ErrorCode::StateConflict);
        // Only optional-field presence differs.
        let without_sender_boxes = send_value(original["envelope"].clone(), &["bob-phone"], None);
        then_error(when_send(&s, "phone", &without_sender_boxes, at(NOW + 1)), ErrorCode::StateConflict);
        // Only array order differs.
        let reordered = send_value(original["envelope"].clone(), &["bob-phone"], Some(&["laptop", "phone"]));
        then_error(when_send(&s, "phone", &reordered, at(NOW + 1)), ErrorCode::StateConflict);
        assert_eq!(*s.sent(&mid(1)), entry_before);
        then_send_duplicate(when_send(&s, "phone", &original, at(NOW + 2)));
    }

    #[test]
    fn send_retry_after_result_retention_is_message_expired() {
        // Retention shorter than the age limit, so only the retention rule can
        // reject the retry.
        let mut short = Policy::with_relay_id(RELAY);
        short.message_retention = 600;
        let s = given_alice([]);
        let v = alice_to_bob(1);
        let event = then_sent(when_send(&s, "phone", &v, under(&short, NOW))).event;
        let s = given_alice([event]);
        then_send_duplicate(when_send(&s, "phone", &v, under(&short, NOW + 599)));
        then_error(when_send(&s, "phone", &v, under(&short, NOW + 601)), ErrorCode::MessageExpired);
    }

    #[test]
    fn result_retention_promised_at_acceptance_is_not_shortened_by_a_later_policy() {
        let s = given_alice([]);
        let v = alice_to_bob(1);
        let s = given_alice([send_event(&s, &v)]);
        let mut shorter = Policy::with_relay_id(RELAY);
        shorter.message_retention = 3600;
        let status = then_send_duplicate(when_send(&s, "phone", &v, under(&shorter, NOW + 2 * 86_400)));
        assert_eq!(status.accepted_at, NOW);
    }

    #[test]
    fn send_deadline_is_created_at_plus_the_age_limit_when_that_is_earlier() {
        let s = given_alice([]);
        let created_at = NOW - 600;
        let v = send_value(envelope(&phone(), &alice(), &bob(), 1, created_at), &["bob-phone"], None);
        let sent = then_sent(when_send(&s, "phone", &v, at(NOW)));
        assert_eq!(sent.deadline, created_at + age_limit());
        assert!(
            matches!(sent.event, AccountEvent::MessageSent { deadline, .. } if deadline == created_at + age_limit())
        );
        let s = given_alice([sent.event]);
        assert_eq!(s.sent(&mid(1)).deadline, created_at + age_limit());
    }

    #[test]
    fn send_deadline_is_accepted_at_plus_retention_when_that_is_earlier() {
        let mut short = Policy::with_relay_id(RELAY);
        short.message_retention = 1800;
        let s = given_alice([]);
        let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &["bob-phone"], None);
        let sent = then_sent(when_send(&s, "phone", &v, under(&short, NOW + 10)));
        assert_eq!(sent.deadline, NOW + 10 + 1800);
        assert!(matches!(sent.event, AccountEvent::MessageSent { deadline, retention_until, .. }
            if deadline == NOW + 10 + 1800 && retention_until == NOW + 10 + 1800));
    }

    #[test]
    fn send_appends_a_sent_record_only_when_sender_boxes_are_given() {
        let s = given_alice([]);
        let without = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &["bob-phone"], None);
        let sent = then_sent(when_send(&s, "phone", &without, at(NOW)));
        assert!(sent.event.record().is_none());
        let s = given_alice([sent.event]);
        assert_eq!(s.last_sequence, 0, "no sequence is used without a record");
        assert_eq!(s.sent(&mid(1)).sequence, None);

        let with = alice_to_bob(2);
        let sent = then_sent(when_send(&s, "phone", &with, at(NOW)));
        let r = record_of(&sent.event);
        assert_eq!(r.sequence, 1);
        assert_eq!(box_ids(r), strings(&["phone", "laptop"]));
        assert_eq!(r.envelope.raw().get(), with["envelope"].to_string());
        assert_eq!(r.expires_at, NOW + retention());
        let s = given_alice([sent.event]);
        assert_eq!(s.last_sequence, 1);
    }

    #[test]
    fn sent_record_is_visible_only_to_devices_valid_at_acceptance_among_sender_boxes() {
        let expiring = alice().certificate(&tablet(), ISSUED, Some(NOW + 10));
        let s = given_alice([device_revoked(&alice(), "laptop"), device_added_cert(&expiring)]);
        let v = send_value(
            envelope(&phone(), &alice(), &bob(), 1, NOW + 10),
            &["bob-phone"],
            Some(&["phone", "laptop", "tablet", "unknown-device"]),
        );
        let sent = then_sent(when_send(&s, "phone", &v, at(NOW + 10)));
        let r = record_of(&sent.event);
        assert_eq!(r.visible, strings(&["phone"]));
        // The record keeps every box as submitted.
        assert_eq!(box_ids(r), strings(&["phone", "laptop", "tablet", "unknown-device"]));
    }

    // =============================================================================
    // account self-delivery
    // =============================================================================

    #[test]
    fn self_delivery_appends_exactly_one_record_and_returns_target_accepted() {
        let s = given_alice([]);
        // Sender boxes, if any, are not used for self-delivery.
        let mut v = alice_to_self(1, &["phone", "laptop"]);
        v["sender_boxes"] = boxes(&["phone"]);
        let (event, status) = then_self_delivered(when_send(&s, "phone", &v, at(NOW)));
        assert_eq!(status, DeliveryStatus::target_accepted(NOW));
        assert!(matches!(event, AccountEvent::SelfDelivered { .. }));
        let r = record_of(&event);
        assert_eq!(r.sequence, 1);
        assert_eq!(box_ids(r), strings(&["phone", "laptop"]));
        let s = given_alice([event]);
        assert_eq!(s.last_sequence, 1);
        assert_eq!(s.sent(&mid(1)).status, DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn self_delivery_needs_no_contact_authorization() {
        let s = given_alice([]);
        assert!(!s.public_discovery);
        then_self_delivered(when_send(&s, "phone", &alice_to_self(1, &["laptop"]), at(NOW)));
    }

    #[test]
    fn self_delivery_stores_the_complete_recipient_boxes_but_only_valid_devices_may_read() {
        let s = given_alice([device_revoked(&alice(), "laptop")]);
        let v = alice_to_self(1, &["phone", "laptop", "tablet"]);
        let (event, _) = then_self_delivered(when_send(&s, "phone", &v, at(NOW)));
        let r = record_of(&event);
        assert_eq!(box_ids(r), strings(&["phone", "laptop", "tablet"]));
        assert_eq!(r.visible, strings(&["phone"]));
    }

    #[test]
    fn self_delivery_device_visibility_is_fixed_at_acceptance() {
        let s = given_alice([]);
        // The tablet has a box but is not a device yet.
        let v = alice_to_self(1, &["phone", "tablet"]);
        let event = send_event(&s, &v);
        assert_eq!(record_of(&event).visible, strings(&["phone"]));
        // Adding the tablet later neither re-decides nor appends anything.
        let s = given_alice([event.clone(), device_added(&alice(), &tablet())]);
        assert!(s.device_valid("tablet", UnixSecs(NOW)));
        let status = then_send_duplicate(when_send(&s, "phone", &v, at(NOW + 5)));
        assert_eq!(status, DeliveryStatus::target_accepted(NOW));
        assert_eq!(s.last_sequence, 1);
        assert_eq!(record_of(&event).visible, strings(&["phone"]));
    }

    #[test]
    fn self_delivery_with_every_recipient_box_naming_an_unavailable_device_is_device_unknown() {
        let s = given_alice([device_revoked(&alice(), "laptop")]);
        let v = alice_to_self(1, &["laptop", "tablet"]);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::DeviceUnknown);
    }

    #[test]
    fn self_delivery_retry_returns_target_accepted_with_the_original_accepted_at() {
        let s = given_alice([]);
        let v = alice_to_self(1, &["phone", "laptop"]);
        let s = given_alice([send_event(&s, &v)]);
        let status = then_send_duplicate(when_send(&s, "phone", &v, at(NOW + 30)));
        assert_eq!(status, DeliveryStatus::target_accepted(NOW));
        let other = alice_to_self(1, &["phone"]);
        then_error(when_send(&s, "phone", &other, at(NOW + 30)), ErrorCode::StateConflict);
    }

    #[test]
    fn self_delivery_still_meets_the_clock_rules() {
        let s = given_alice([]);
        let v =
            send_value(envelope(&phone(), &alice(), &alice(), 1, NOW + POLICY.clock_tolerance + 1), &["phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::ClockSkew);
        let v = send_value(envelope(&phone(), &alice(), &alice(), 2, NOW - age_limit() - 1), &["phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::MessageExpired);
    }

    /// The process manager ([`SendProcess`]): each step it asks of the
    /// shell, given what the last one answered.
    mod process {
        use super::*;
        use crate::account::AsDecided;
        use relay_schemas::objects::DeliveryStatus;

        type Step = Next<AccountCmd<()>, AsDecided>;

        fn start(account: &str, v: &Value) -> Result<(SendProcess, Step), RelayError> {
            SendProcess::start(account, "phone".into(), parse(v), digest(v))
        }

        /// Alice's send to Bob, Bob served by this relay alone: the process
        /// waiting for Bob's receipt, and the acceptance Alice's account decided.
        fn receiving() -> (SendProcess, Box<Acceptance>) {
            let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
            let route = wire(&route(&bob(), 1, &[RELAY]));
            let Ok(Step::AskSender(cmd)) = p.on(Input::Routed(Some(route))) else { panic!("expected the decision") };
            let Reply::Accept(acceptance) = when(&given_alice([]), cmd).unwrap().reply else {
                panic!("expected an acceptance to deliver first")
            };
            let Ok(Step::Receive(_)) = p.on(Input::Replied(Reply::Accept(acceptance.clone()))) else {
                panic!("expected the receipt")
            };
            (p, acceptance)
        }

        fn answered(status: DeliveryStatus) -> Input<AsDecided> {
            Input::Received(AttemptOutcome::Answered(status))
        }

        #[test]
        fn a_send_to_another_account_looks_up_the_recipients_route_first() {
            let (p, next) = start(&alice().id, &alice_to_bob(1)).unwrap();
            assert!(matches!(next, Step::LookupRoute), "{next:?}");
            assert_eq!(p.to(), bob().id);
        }

        #[test]
        fn a_self_send_skips_the_route_lookup_and_is_decided_at_once() {
            let v = send_value(envelope(&phone(), &alice(), &alice(), 1, NOW), &["laptop"], None);
            let (_, next) = start(&alice().id, &v).unwrap();
            assert!(matches!(next, Step::AskSender(AccountCmd::MessageSend { route: None, .. })), "{next:?}");
        }

        #[test]
        fn a_malformed_recipient_is_refused_before_any_step() {
            let mut v = alice_to_bob(1);
            v["envelope"]["to"] = "not an id!".into();
            assert_eq!(start(&alice().id, &v).unwrap_err().code, ErrorCode::InvalidParams);
        }

        #[test]
        fn the_send_is_decided_with_the_route_looked_up() {
            let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
            let route = wire::<Route>(&route(&bob(), 3, &["relay-b"]));
            let next: Step = p.on(Input::Routed(Some(route))).unwrap();
            let Step::AskSender(AccountCmd::MessageSend { route: Some(r), .. }) = next else { panic!("{next:?}") };
            assert_eq!(r.revision, 3);
        }

        #[test]
        fn a_decision_that_is_not_an_acceptance_to_deliver_first_is_the_answer() {
            let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
            let _: Step = p.on(Input::Routed(None)).unwrap();
            let next: Step = p.on(Input::Replied(Reply::Status(DeliveryStatus::delivering(NOW)))).unwrap();
            assert!(matches!(next, Step::Answer { reply: Reply::Status(_), finished: None }), "{next:?}");
        }

        #[test]
        fn an_acceptance_to_deliver_first_asks_the_recipient_for_its_receipt_of_the_decided_params() {
            let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
            let _: Step = p.on(Input::Routed(None)).unwrap();
            let route = wire(&route(&bob(), 1, &[RELAY]));
            let cmd = AccountCmd::MessageSend {
                device: "phone".into(),
                params: parse(&alice_to_bob(1)),
                digest: digest(&alice_to_bob(1)),
                route: Some(route),
            };
            let Reply::Accept(a) = when(&given_alice([]), cmd).unwrap().reply else { panic!("expected an acceptance") };
            let next: Step = p.on(Input::Replied(Reply::Accept(a.clone()))).unwrap();
            let Step::Receive(AccountCmd::MessageDeliver { params, digest }) = next else { panic!("{next:?}") };
            assert_eq!(params.envelope.message_id, a.deliver.envelope.message_id);
            assert_eq!(digest, a.deliver_digest);
        }

        #[test]
        fn a_state_conflict_at_the_recipient_is_refused_once_durable_and_writes_nothing_at_the_sender() {
            let (mut p, _) = receiving();
            let conflict = RelayError::new(ErrorCode::StateConflict, "other params under this id");
            let next: Step = p.on(Input::Received(AttemptOutcome::Rejected(conflict))).unwrap();
            assert!(matches!(&next, Step::RefuseWhenDurable(e) if e.code == ErrorCode::StateConflict), "{next:?}");
        }

        #[test]
        fn a_receipt_taken_settles_the_acceptance_as_target_accepted() {
            let (mut p, a) = receiving();
            let next: Step = p.on(answered(DeliveryStatus::target_accepted(NOW))).unwrap();
            let Step::AskSender(AccountCmd::Settle { status, .. }) = next else { panic!("{next:?}") };
            assert_eq!(status, DeliveryStatus::target_accepted(a.status.accepted_at));
        }

        #[test]
        fn a_receipt_refused_for_good_settles_the_acceptance_as_failed() {
            let (mut p, _) = receiving();
            let refused = RelayError::new(ErrorCode::Forbidden, "not a contact");
            let next: Step = p.on(Input::Received(AttemptOutcome::Rejected(refused))).unwrap();
            let Step::AskSender(AccountCmd::Settle { status, .. }) = next else { panic!("{next:?}") };
            assert_eq!(status.error.map(|e| e.code), Some(ErrorCode::Forbidden));
        }

        #[test]
        fn a_receipt_that_does_not_end_the_delivery_is_written_with_the_acceptance_and_the_route() {
            let (mut p, _) = receiving();
            let busy = RelayError::unavailable("the recipient's account is busy");
            let next: Step = p.on(Input::Received(AttemptOutcome::NotAttempted(busy))).unwrap();
            let Step::AskSender(AccountCmd::Accept {
                route: Some(r),
                first: Some(AttemptOutcome::NotAttempted(_)),
                ..
            }) = next
            else {
                panic!("{next:?}")
            };
            assert!(r.lists_relay(RELAY));
        }

        #[test]
        fn a_settlement_written_by_this_request_reports_the_delivery_finished() {
            let (mut p, a) = receiving();
            let _: Step = p.on(answered(DeliveryStatus::target_accepted(NOW))).unwrap();
            let settled = Reply::Settled { status: DeliveryStatus::target_accepted(NOW), head: () };
            let next: Step = p.on(Input::Replied(settled)).unwrap();
            let Step::Answer { finished: Some(f), .. } = next else { panic!("{next:?}") };
            assert_eq!((f.from, f.to), (alice().id, bob().id));
            assert_eq!(f.message_id, a.deliver.envelope.message_id);
            assert_eq!(f.accepted_at, UnixSecs(a.status.accepted_at));
        }

        #[test]
        fn a_settlement_a_racing_retry_wrote_first_is_answered_but_not_reported_again() {
            let (mut p, _) = receiving();
            let _: Step = p.on(answered(DeliveryStatus::target_accepted(NOW))).unwrap();
            let next: Step = p.on(Input::Replied(Reply::Status(DeliveryStatus::target_accepted(NOW)))).unwrap();
            assert!(matches!(next, Step::Answer { reply: Reply::Status(_), finished: None }), "{next:?}");
        }

        #[test]
        fn an_input_the_step_does_not_expect_is_an_internal_error() {
            let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
            let e = p.on::<AccountCmd<()>, AsDecided>(answered(DeliveryStatus::target_accepted(NOW))).unwrap_err();
            assert_eq!(e.code, ErrorCode::InternalError);
            // Still waiting for the route.
            assert!(matches!(p.on::<AccountCmd<()>, AsDecided>(Input::Routed(None)), Ok(Next::AskSender(_))));
        }
    }
}

#[cfg(test)]
mod record_delivery_tests {
    //! Delivery results recorded at the source (`RecordDelivery`).
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::testkit::*;
    fn alice_sent_one() -> Given {
        let s = given_alice([]);
        given_alice([send_event(&s, &alice_to_bob(1))])
    }

    fn applied(mut s: Given, events: &[AccountEvent]) -> Given {
        events.iter().for_each(|e| s.apply(e));
        s
    }

    #[test]
    fn record_delivery_answers_the_status_as_recorded_and_a_terminal_one_never_changes() {
        let sent = send_event(&given_alice([]), &alice_to_bob(1));
        let s = given_alice([sent]);
        let record = |s: &Given, st: &DeliveryStatus| {
            when(s, Cmd::RecordDelivery { message_id: mid(1), status: st.clone(), settlement: None }).unwrap()
        };
        // Reported with another accepted_at: recorded with the source's.
        let d = record(&s, &DeliveryStatus::target_accepted(NOW + 9));
        assert_eq!(*reply_status(&d.reply), DeliveryStatus::target_accepted(NOW));
        let s = given(&alice(), &[s.events.clone(), d.events].concat());
        let failed = DeliveryStatus::failed(NOW, RelayError::new(ErrorCode::MessageExpired, "expired"));
        let d = record(&s, &failed);
        assert!(d.events.is_empty());
        assert_eq!(*reply_status(&d.reply), DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn record_delivery_moves_delivering_to_a_terminal_state() {
        let s = alice_sent_one();
        let events = when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW));
        assert!(matches!(events.as_slice(), [AccountEvent::DeliveryUpdated { .. }]));
        let s = applied(s, &events);
        assert_eq!(s.sent(&mid(1)).status.status, Status::TargetAccepted);
    }

    #[test]
    fn record_delivery_keeps_the_source_accepted_at() {
        let s = alice_sent_one();
        // The destination's accepted_at is later than the source's.
        let events = when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 42));
        match events.as_slice() {
            [AccountEvent::DeliveryUpdated { status, .. }] => assert_eq!(status, &DeliveryStatus::target_accepted(NOW)),
            e => panic!("expected DeliveryUpdated, got {e:?}"),
        }
        let s = applied(s, &events);
        assert_eq!(s.sent(&mid(1)).status, DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn terminal_delivery_states_never_change() {
        let failed = DeliveryStatus::failed(NOW, RelayError::device_unknown("gone"));
        // target_accepted stays.
        let s = alice_sent_one();
        let s = applied(s.clone(), &when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW)));
        assert!(when_record_delivery(&s, &mid(1), &failed).is_empty());
        assert!(when_record_delivery(&s, &mid(1), &DeliveryStatus::delivering(NOW)).is_empty());
        assert!(when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 9)).is_empty());
        // failed stays, with its reason.
        let s = alice_sent_one();
        let s = applied(s.clone(), &when_record_delivery(&s, &mid(1), &failed));
        assert!(when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW)).is_empty());
        let other_failure = DeliveryStatus::failed(NOW, RelayError::new(ErrorCode::ClockSkew, "late"));
        assert!(when_record_delivery(&s, &mid(1), &other_failure).is_empty());
        let status = then_send_duplicate(when_send(&s, "phone", &alice_to_bob(1), at(NOW + 1)));
        assert_eq!(status, failed);
    }

    #[test]
    fn record_delivery_of_an_unchanged_status_or_unknown_message_is_a_no_op() {
        let s = alice_sent_one();
        assert!(when_record_delivery(&s, &mid(1), &DeliveryStatus::delivering(NOW)).is_empty());
        assert!(when_record_delivery(&s, &mid(9), &DeliveryStatus::target_accepted(NOW)).is_empty());
    }

    #[test]
    fn record_delivery_never_changes_a_self_delivery() {
        let s = given_alice([]);
        let s = given_alice([send_event(&s, &alice_to_self(1, &["phone"]))]);
        let failed = DeliveryStatus::failed(NOW, RelayError::device_unknown("gone"));
        assert!(when_record_delivery(&s, &mid(1), &failed).is_empty());
    }
}
