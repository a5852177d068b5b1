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
//!   route ([`accept`]).

use crate::account::command::{Acceptance, Decision, Effect, Reads, Reply};
use crate::account::events::AccountEvent;
use crate::account::ledger::SendEntry;
use crate::account::method::message_deliver::deliver_digest;
use crate::account::shared::{
    check_created_at, check_session, idempotent, record, registered, served_here, visible_devices, Ctx,
};
use crate::account::state::AccountState;
use crate::delivery::core::{decide_acceptance, delivered_here_first};
use crate::delivery::AttemptOutcome;
use relay_schemas::methods::{DeliverParams, SendParams};
use relay_schemas::objects::{check_boxes, Route};
use relay_schemas::sign::Tag;
use relay_schemas::{DeliveryStatus, RelayError, UnixSecs, Wire};

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
            accept(state, acceptance, route, None, ctx)
        }
    })
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
        SettleDecision::Settled { events, status } => Decision::write(events, Reply::Settled(status)),
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
        None => accept(state, acceptance.clone(), route, first.cloned(), ctx),
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
    first: Option<AttemptOutcome>,
    ctx: Ctx,
) -> Decision {
    let Acceptance { event, status, deliver, deliver_digest, deadline } = a;
    let message_id = deliver.envelope.message_id.clone();
    let times = (UnixSecs(status.accepted_at), UnixSecs(deadline));
    let begun = decide_acceptance(deliver, deliver_digest, times, route, first, ctx.now.millis(), ctx.policy);
    let mut events = vec![restamp(state, event)];
    let reply = match &begun.state.finished {
        // Ended by the attempt made before: reported finished with the acceptance.
        Some(done) => {
            events.push(AccountEvent::DeliveryUpdated { message_id, status: done.clone() });
            Reply::Settled(done.clone())
        }
        None => Reply::Status(status),
    };
    Decision { events, reply, effects: vec![Effect::BeginDelivery(Box::new(begun))] }
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
        sender_route: Some(registered(state)?.clone()),
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

/// A `message_sent` decided earlier and written now: other records may
/// have been written in between, so its record takes the sequence that is
/// next now (timeline sequences are dense and never reused).
pub fn restamp(state: &AccountState, mut sent: AccountEvent) -> AccountEvent {
    if let AccountEvent::MessageSent { record: Some(r), .. } = &mut sent {
        r.sequence = state.last_sequence + 1;
    }
    sent
}
