//! `message.deliver` (PROTOCOL §5): the recipient's home takes a message
//! from a home relay of the sender, by the seed's receiving rules
//! ([`receive`]), once the caller is one the sender chose
//! ([`may_deliver`], and [`check_sender`] where this relay serves the
//! sender too). A local delivery is decided by the same rules.

use crate::account::command::{Decision, Reads, Reply};
use crate::account::events::AccountEvent;
use crate::account::ledger::ReceiptEntry;
use crate::account::shared::{check_created_at, idempotent, record, served_here, visible_devices, Ctx};
use crate::account::state::{contact_key, AccountState};
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{check_boxes, Authorization, MessageEnvelope, Route};
use relay_schemas::sign::Tag;
use relay_schemas::{DeliveryStatus, RelayError, Wire};

/// `MessageDeliver`: a duplicate answers its status, a new message writes
/// its record.
pub(crate) fn decide(
    state: &AccountState,
    params: &DeliverParams,
    digest: &str,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    let prior = reads.receipt_entry(&params.envelope.from, &params.envelope.message_id)?;
    Ok(match receive(state, prior.as_ref(), params, digest, ctx)? {
        ReceiveDecision::Duplicate(status) => Decision::reply(Reply::Status(status)),
        ReceiveDecision::Accepted { event, status } => Decision::write(vec![*event], Reply::Status(status)),
    })
}

/// `CheckSender`: asked of the sender's account when this relay serves it.
pub(crate) fn decide_check_sender(state: &AccountState, device_id: &str, ctx: Ctx) -> Result<Decision, RelayError> {
    check_sender(state, device_id, ctx)?;
    Ok(Decision::reply(Reply::ok()))
}

/// What a receipt (`message.deliver`, or a local delivery) decided.
#[derive(Debug)]
pub enum ReceiveDecision {
    Duplicate(DeliveryStatus),
    Accepted { event: Box<AccountEvent>, status: DeliveryStatus },
}

/// The digest a receipt is keyed on: blake3(JCS(deliver params)).
/// Computed over the params as they go on the wire (their raw objects
/// included), exactly as the destination computes it from the body.
pub fn deliver_digest(p: &DeliverParams) -> Result<String, RelayError> {
    Ok(blake3::hash(&p.jcs()?).to_hex().to_string())
}

/// The seed's receiving validation rules, at the destination. `prior` is
/// the ledger's entry for `(envelope.from, envelope.message_id)`.
pub fn receive(
    state: &AccountState,
    prior: Option<&ReceiptEntry>,
    p: &DeliverParams,
    digest: &str,
    ctx: Ctx,
) -> Result<ReceiveDecision, RelayError> {
    let env = &p.envelope;
    env.check_constraints(ctx.policy.max_ciphertext_bytes)?;
    check_boxes("recipient_boxes", &p.recipient_boxes, ctx.policy.max_boxes)?;
    if env.to != state.account_id {
        return Err(RelayError::invalid_params("envelope.to is not this account"));
    }
    // Self-delivery happens only at the account's home relay, on
    // `message.send`; it never travels as `message.deliver` (seed).
    if env.from == env.to {
        return Err(RelayError::invalid_params("account self-delivery is not delivered between relays"));
    }
    // A previously accepted request answers its result, whatever changed
    // since (even the account's home): a route error here would invite the
    // source to deliver it again elsewhere.
    if let Some(entry) = prior {
        idempotent(digest, &entry.digest, entry.retention_until, ctx.now)?;
        return Ok(ReceiveDecision::Duplicate(DeliveryStatus::target_accepted(entry.accepted_at)));
    }
    // Rule 1: the recipient's current route designates this relay.
    served_here(state, ctx)?;
    // Rule 2: certificate binding and signatures.
    let cert = &p.sender_device_certificate;
    let device_key = cert.check(ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)?;
    if cert.account_id != env.from || cert.device_id != env.from_device_id {
        return Err(RelayError::invalid_signature(
            "sender_device_certificate does not match envelope.from / from_device_id",
        ));
    }
    env.verify(Tag::Envelope, &device_key)?;
    // Rule 3: this relay's own clock tolerance and age limit.
    check_created_at(env, ctx)?;
    // Rule 4: authorization, with no fallback from invalid credentials.
    check_authorization(state, &env.from, p.authorization.as_ref(), ctx)?;
    // Rule 5: at least one recipient device valid now.
    let visible = visible_devices(state, &p.recipient_boxes, ctx.now);
    if visible.is_empty() {
        return Err(RelayError::device_unknown("no recipient box names a valid device"));
    }
    // Events and statuses carry the protocol's plain seconds.
    let accepted_at = ctx.now.0;
    let retention_until = crate::retention::retention_until(accepted_at, ctx.policy);
    let event = AccountEvent::MessageReceived {
        from: env.from.clone(),
        message_id: env.message_id.clone(),
        digest: digest.into(),
        accepted_at,
        retention_until,
        record: record(state, env, &p.recipient_boxes, visible, retention_until),
        // Only an account with another home replicates its records (and only
        // there is the certificate read); a single home saves the bytes on
        // every receipt. Records kept without it are checked against the
        // sender's home's list if the account gains a second home later.
        sender_certificate: state.route().filter(|r| r.relays.len() > 1).map(|_| Box::new(cert.clone())),
    };
    Ok(ReceiveDecision::Accepted { event: Box::new(event), status: DeliveryStatus::target_accepted(accepted_at) })
}

/// PROTOCOL §5 *Who may deliver*: the destination trusts the source for
/// the sending device's permissions, so the caller must be a source the
/// sender chose. `sender_route` is the route the source accepted under,
/// `caller` the authenticated `Relay-Id`, `known` the highest route of the
/// sender this relay knows. Every failure is `forbidden`.
pub fn may_deliver(
    sender_route: Option<&Wire<Route>>,
    known: Option<&Wire<Route>>,
    caller: &str,
    envelope: &MessageEnvelope,
    ctx: Ctx,
) -> Result<(), RelayError> {
    let forbid = |why: &str| RelayError::forbidden(format!("who may deliver: {why}"));
    let route = sender_route.ok_or_else(|| forbid("sender_route is missing"))?;
    // Oversized is a size refusal (PROTOCOL §1), whoever sent it.
    route.check_size("sender_route", ctx.policy.max_object_bytes)?;
    route
        .check(ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)
        .map_err(|e| forbid(&format!("sender_route: {}", e.message)))?;
    if route.account_id != envelope.from {
        return Err(forbid("sender_route is not the route of envelope.from"));
    }
    if !route.lists_relay(caller) {
        return Err(forbid(&format!("relay {caller} is not a home relay in the sender's route")));
    }
    match known {
        Some(k) if k.revision > route.revision && k.issued_at <= envelope.created_at => {
            Err(forbid("sender_route was superseded before the message was created"))
        }
        Some(k) if k.revision == route.revision && k != route => {
            Err(forbid("sender_route differs from the known route of that revision"))
        }
        _ => Ok(()),
    }
}

/// When this relay itself serves the sender, a delivery from another relay
/// must name a sending device valid here (not revoked, not expired).
pub fn check_sender(state: &AccountState, device_id: &str, ctx: Ctx) -> Result<(), RelayError> {
    if !state.device_valid(device_id, ctx.now) {
        return Err(RelayError::forbidden(format!(
            "who may deliver: device {device_id} is not valid at the sender's home relay"
        )));
    }
    Ok(())
}

fn check_authorization(
    state: &AccountState,
    sender: &str,
    auth: Option<&Authorization>,
    ctx: Ctx,
) -> Result<(), RelayError> {
    if sender == state.account_id {
        return Ok(());
    }
    let Some(auth) = auth else {
        return if state.public_discovery {
            Ok(())
        } else {
            Err(RelayError::forbidden(
                "recipient does not allow public discovery; a contact grant or invite is required",
            ))
        };
    };
    let key = state.account_key().ok_or_else(|| RelayError::internal("account key unreadable"))?;
    auth.check(sender, &state.account_id, key, ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)?;
    let (kind, id) = auth.revocation_key();
    if state.revoked_contacts.contains(&contact_key(kind, id)) {
        return Err(RelayError::forbidden(format!("authorization: {kind} was revoked")));
    }
    Ok(())
}
