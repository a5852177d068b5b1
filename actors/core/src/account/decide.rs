//! The rules of an account, one function per command: `(state, command,
//! ctx) -> events`; [`super::command::decide`] dispatches to them.
//! Pure: no I/O, no clock, no actix. Each function returns the events to
//! append (empty for an idempotent no-op) or the `RelayError` that rejects
//! the command, in which case nothing is appended. A command keyed by a
//! message gets that message's ledger entry, read by the shell.

use super::events::{AccountEvent, PushSubscription, Record};
use super::ledger::{ReceiptEntry, SendEntry};
use super::state::{contact_key, AccountState};
use crate::policy::{Policy, MAX_DEVICES_SETTING, MAX_REVOKED_CONTACTS_SETTING};
use relay_schemas::methods::{
    ContactRevokeParams, DeliverParams, DevicesAnswer, PushSubscribeParams, RegisterParams, SendParams,
};
use relay_schemas::objects::{
    check_boxes, Authorization, DeviceCertificate, DeviceRevocation, KeyBox, MessageEnvelope, Route,
};
use relay_schemas::sign::Tag;
use relay_schemas::{DeliveryStatus, ErrorCode, RelayError, UnixSecs, Wire};

/// The time, policy and randomness a decision is made under.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub now: UnixSecs,
    pub policy: &'a Policy,
    /// Fresh random bytes, for the commands that draw any (a session
    /// challenge, a session token); such a command is refused without.
    pub random: Option<[u8; 32]>,
}

impl<'a> Ctx<'a> {
    /// For decisions that draw no randomness.
    pub fn new(now: UnixSecs, policy: &'a Policy) -> Self {
        Ctx { now, policy, random: None }
    }

    /// With `random` for the commands that draw it.
    pub fn with_random(self, random: [u8; 32]) -> Self {
        Ctx { random: Some(random), ..self }
    }

    /// The fresh random bytes; an internal error where none came in.
    pub fn random(&self) -> Result<[u8; 32], RelayError> {
        self.random.ok_or_else(|| RelayError::internal("a decision that draws randomness got none"))
    }
}

fn registered(state: &AccountState) -> Result<&Wire<Route>, RelayError> {
    state.route().ok_or_else(|| RelayError::not_found(format!("unknown account {}", state.account_id)))
}

/// Receiving rule 1: this relay is a home relay in the account's current
/// route. An account that moved away keeps its new route here, and callers
/// get it back with `route_stale`.
fn served_here(state: &AccountState, ctx: Ctx) -> Result<(), RelayError> {
    let route = registered(state)?;
    if route.lists_relay(&ctx.policy.relay_id) {
        return Ok(());
    }
    Err(not_served_here(Some(route)))
}

/// Where an account this relay does not serve lives now: `route_stale`
/// with the newest route known here, else `target_not_local`.
pub fn not_served_here(known: Option<&Wire<Route>>) -> RelayError {
    match known {
        Some(route) => RelayError::new(ErrorCode::RouteStale, "the account's current route names other relays")
            .with_data(serde_json::json!({ "route": route })),
        None => RelayError::new(ErrorCode::TargetNotLocal, "this relay does not serve the account"),
    }
}

/// The session's device must still be valid (a revoked device's sessions
/// end at once).
pub fn check_session(state: &AccountState, device_id: &str, ctx: Ctx) -> Result<(), RelayError> {
    registered(state).map_err(|_| RelayError::unauthorized("session account unknown"))?;
    if !state.device_valid(device_id, ctx.now) {
        return Err(RelayError::unauthorized("session device is no longer valid"));
    }
    Ok(())
}

/// `created_at` against this relay's clock tolerance and age limit
/// (receiving rule 3; the source applies its own policy the same way).
fn check_created_at(envelope: &MessageEnvelope, ctx: Ctx) -> Result<(), RelayError> {
    if envelope.created_at > ctx.now.plus(ctx.policy.clock_tolerance) {
        return Err(RelayError::new(ErrorCode::ClockSkew, "envelope.created_at is beyond clock tolerance"));
    }
    if envelope.created_at.saturating_add(ctx.policy.delivery_age_limit) <= ctx.now {
        return Err(RelayError::new(ErrorCode::MessageExpired, "envelope is beyond the delivery age limit"));
    }
    Ok(())
}

/// Devices named in `boxes` that are valid now: the record's visible set,
/// fixed at acceptance.
fn visible_devices(state: &AccountState, boxes: &[Wire<KeyBox>], now: UnixSecs) -> Vec<String> {
    boxes.iter().filter(|b| state.device_valid(&b.device_id, now)).map(|b| b.device_id.clone()).collect()
}

fn record(
    state: &AccountState,
    envelope: &Wire<MessageEnvelope>,
    boxes: &[Wire<KeyBox>],
    visible: Vec<String>,
    expires_at: u64,
) -> Box<Record> {
    Box::new(Record {
        sequence: state.last_sequence + 1,
        expires_at,
        envelope: envelope.clone(),
        boxes: boxes.to_vec(),
        visible,
    })
}

/// Idempotency lookup shared by sends and receipts: `Some(accepted_at)` for
/// the same content, `state_conflict` for different content,
/// `message_expired` once the promised retention has passed.
fn idempotent(digest: &str, stored_digest: &str, retention_until: u64, now: UnixSecs) -> Result<(), RelayError> {
    retained(retention_until, now)?;
    if stored_digest != digest {
        return Err(RelayError::state_conflict("message_id already used with different content"));
    }
    Ok(())
}

/// A result is kept at least until `retention_until`, that second included.
fn retained(retention_until: u64, now: UnixSecs) -> Result<(), RelayError> {
    if retention_until < now {
        return Err(RelayError::new(ErrorCode::MessageExpired, "result retention has ended"));
    }
    Ok(())
}

/// `message.delivery.peer_status` is answered only to a relay the
/// account's current route names: its other home (SHiNE's read-only
/// exchange of delivery results between a user's two servers).
pub fn may_ask_peer_status(state: &AccountState, peer: &str) -> Result<(), RelayError> {
    let route = state.route().ok_or_else(|| RelayError::not_found("unknown account"))?;
    if !route.lists_relay(peer) {
        return Err(RelayError::forbidden("only the account's other home relay may ask"));
    }
    Ok(())
}

/// `message.delivery.status`: the ledger's result while it is retained
/// (the same retention an idempotent retry is answered within).
pub fn delivery_status(entry: Option<&SendEntry>, now: UnixSecs) -> Result<DeliveryStatus, RelayError> {
    let entry = entry.ok_or_else(|| RelayError::not_found("unknown message"))?;
    retained(entry.retention_until, now)?;
    Ok(entry.status.clone())
}

// ---- accounts and devices ---------------------------------------------------

/// The stateless checks of `account.register`: signatures, identity
/// binding, this relay named in the route and in a fresh registration, and
/// unsigned settings that agree with the signed ones. The transport runs
/// them before any actor exists for the account, so a stranger's garbage
/// costs no memory; [`register`] runs them again.
pub fn check_register(p: &RegisterParams, ctx: Ctx) -> Result<(), RelayError> {
    let (tolerance, max_bytes) = (ctx.policy.clock_tolerance, ctx.policy.max_object_bytes);
    p.route.check(ctx.now, tolerance, max_bytes)?;
    if !p.route.lists_relay(&ctx.policy.relay_id) {
        return Err(RelayError::invalid_params(format!("route must list this relay ({})", ctx.policy.relay_id)));
    }
    let cert = &p.device_certificate;
    cert.check(ctx.now, tolerance, max_bytes)?;
    if cert.account_id != p.route.account_id || cert.account_key != p.route.account_key {
        return Err(RelayError::invalid_params("device_certificate names another account"));
    }
    p.registration.check(&p.route, &ctx.policy.relay_id, ctx.now, tolerance, max_bytes)?;
    let unsigned = p.settings.as_ref().and_then(|s| s.public_discovery);
    if unsigned.is_some_and(|d| d != p.registration.public_discovery) {
        return Err(RelayError::invalid_params("settings.public_discovery disagrees with the signed registration"));
    }
    Ok(())
}

/// `account.register`. `known` is the highest route revision of the account
/// this relay knows or learned from its peers: an older route would let a
/// replayed registration bring back relays or devices the account has left.
pub fn register(
    state: &AccountState,
    p: &RegisterParams,
    digest: &str,
    known: Option<&Wire<Route>>,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    check_register(p, ctx)?;
    if p.route.account_id != state.account_id {
        return Err(RelayError::invalid_params("route.account_id does not match"));
    }
    let cert = &p.device_certificate;
    if state.revocations.contains_key(&cert.device_id) {
        return Err(RelayError::device_unknown(format!("device {} was revoked", cert.device_id)));
    }
    let highest = [known, state.route()].into_iter().flatten().max_by_key(|r| r.revision);
    if let Some(highest) = highest {
        if p.route.revision < highest.revision {
            return Err(RelayError::new(ErrorCode::RouteStale, "a newer route revision of this account is known")
                .with_data(serde_json::json!({ "route": highest })));
        }
        if p.route.revision == highest.revision && p.route != *highest {
            return Err(RelayError::state_conflict("same route revision with different content"));
        }
    }
    if state.is_registered() {
        // The same account the other home registered (it came here by
        // `timeline.replicate`): registering here too changes nothing.
        let same = state.register_digest.is_empty()
            && state.route() == Some(&p.route)
            && state.certificate(&cert.device_id) == Some(cert)
            && state.public_discovery == p.registration.public_discovery;
        return if state.register_digest == digest || same {
            Ok(vec![])
        } else {
            Err(RelayError::state_conflict("account already registered with different content"))
        };
    }
    Ok(vec![AccountEvent::Registered {
        route: p.route.clone(),
        device_certificate: cert.clone(),
        public_discovery: p.registration.public_discovery,
        params_digest: digest.to_owned(),
        registration: Some(Box::new(p.registration.clone())),
    }])
}

/// `device.add` (and a device added at the account's other home, as
/// replicated): a new certificate while the account holds fewer than
/// `max_devices`, revoked ones included (PROTOCOL §1); the same certificate
/// again is a no-op even on a full account.
pub fn add_device(
    state: &AccountState,
    cert: &Wire<DeviceCertificate>,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered(state)?;
    cert.check(ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)?;
    add_signed_device(state, cert, ctx.policy)
}

/// `device.add` past the certificate's own checks (its size and signature,
/// and its validity window now, or, for one replicated from the account's
/// other home, at the time it was added there).
pub fn add_signed_device(
    state: &AccountState,
    cert: &Wire<DeviceCertificate>,
    policy: &Policy,
) -> Result<Vec<AccountEvent>, RelayError> {
    let route = registered(state)?;
    if cert.account_id != state.account_id || cert.account_key != route.account_key {
        return Err(RelayError::forbidden("device_certificate names another account"));
    }
    if state.revocations.contains_key(&cert.device_id) {
        return Err(RelayError::invalid_state("device_id was revoked and cannot be reused"));
    }
    match state.certificate(&cert.device_id) {
        Some(existing) if existing == cert => Ok(vec![]),
        Some(_) => Err(RelayError::state_conflict("device_id already has another certificate")),
        None if state.devices.len() >= policy.max_devices => Err(RelayError::over_limit(
            MAX_DEVICES_SETTING,
            format!("the account holds {} device certificates, limit {}", state.devices.len(), policy.max_devices),
        )),
        None => Ok(vec![AccountEvent::DeviceAdded { device_certificate: cert.clone() }]),
    }
}

pub fn revoke_device(
    state: &AccountState,
    rev: &Wire<DeviceRevocation>,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered(state)?;
    let key = state.account_key().ok_or_else(|| RelayError::internal("account key unreadable"))?;
    rev.check(key, ctx.policy.max_object_bytes)?;
    if rev.account_id != state.account_id {
        return Err(RelayError::forbidden("revocation names another account"));
    }
    if !state.devices.contains_key(&rev.device_id) {
        return Err(RelayError::not_found(format!("unknown device {}", rev.device_id)));
    }
    if state.revocations.contains_key(&rev.device_id) {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::DeviceRevoked { revocation: rev.clone() }])
}

/// An `account.devices.get` answer read from the account's home relay,
/// before this relay passes it on: held to this relay's own bounds
/// (PROTOCOL §1), so a peer cannot make it answer more than it would
/// itself. Revocations name devices of the list, so as many at most.
pub fn check_devices_answer(answer: &DevicesAnswer, policy: &Policy) -> Result<(), RelayError> {
    let max = policy.max_devices;
    let most = answer.certificates.len().max(answer.revocations.len());
    if most > max {
        let what = format!("the home relay answered {most} certificates or revocations, limit {max}");
        return Err(RelayError::over_limit(MAX_DEVICES_SETTING, what));
    }
    for c in &answer.certificates {
        c.check_size("certificates[]", policy.max_object_bytes)?;
    }
    for r in &answer.revocations {
        r.check_size("revocations[]", policy.max_object_bytes)?;
    }
    Ok(())
}

pub fn update_settings(
    state: &AccountState,
    public_discovery: bool,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered(state)?;
    if state.public_discovery == public_discovery {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::SettingsUpdated { public_discovery, at: Some(ctx.now.0) }])
}

/// `route.update`: a higher revision replaces a lower one; an equal
/// revision with other content is `state_conflict`; a lower one is stale.
pub fn update_route(state: &AccountState, route: &Wire<Route>, ctx: Ctx) -> Result<Vec<AccountEvent>, RelayError> {
    let current = registered(state)?;
    route.check(ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)?;
    if route.account_id != state.account_id || route.account_key != current.account_key {
        return Err(RelayError::forbidden("route names another account"));
    }
    if route.revision < current.revision {
        return Err(RelayError::new(ErrorCode::RouteStale, "a newer route revision is known")
            .with_data(serde_json::json!({ "route": current })));
    }
    if route.revision == current.revision {
        return if route == current {
            Ok(vec![])
        } else {
            Err(RelayError::state_conflict("same route revision with different content"))
        };
    }
    Ok(vec![AccountEvent::RouteUpdated { route: route.clone() }])
}

pub fn revoke_contact(
    state: &AccountState,
    p: &ContactRevokeParams,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered(state)?;
    let (kind, id) = match (&p.grant_id, &p.invite_id) {
        (Some(g), None) => ("grant", g),
        (None, Some(i)) => ("invite", i),
        _ => return Err(RelayError::invalid_params("exactly one of grant_id or invite_id")),
    };
    revoke_contact_id(state, kind, id, ctx)
}

/// One more revoked grant or invite id (`kind` is `grant` or `invite`),
/// from `contact.revoke` or replicated from the other home: the relay
/// cannot tell an issued id from an invented one, and keeps revoked ids
/// for good, so an account revokes at most `max_revoked_contacts`. An id
/// revoked already is a no-op, even on a full list.
pub fn revoke_contact_id(
    state: &AccountState,
    kind: &str,
    id: &str,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    if !matches!(kind, "grant" | "invite") {
        return Err(RelayError::invalid_params(format!("unknown contact credential kind {kind:?}")));
    }
    relay_schemas::ids::check_id(&format!("{kind}_id"), id)?;
    if state.revoked_contacts.contains(&contact_key(kind, id)) {
        return Ok(vec![]);
    }
    let max = ctx.policy.max_revoked_contacts;
    if state.revoked_contacts.len() >= max {
        return Err(RelayError::over_limit(
            MAX_REVOKED_CONTACTS_SETTING,
            format!("the account revoked {} grants and invites, limit {max}", state.revoked_contacts.len()),
        ));
    }
    Ok(vec![AccountEvent::ContactRevoked { kind: kind.into(), id: id.to_owned() }])
}

/// `message.timeline.ack`: moves the device's cursor forward only. Acking
/// beyond the last sequence is `invalid_params`; acking at or behind the
/// cursor is ignored.
pub fn ack(state: &AccountState, device_id: &str, through: u64) -> Result<Vec<AccountEvent>, RelayError> {
    if through > state.last_sequence {
        return Err(RelayError::invalid_params(format!(
            "through {through} is beyond the last sequence {}",
            state.last_sequence
        )));
    }
    if through <= state.cursors.get(device_id).copied().unwrap_or(0) {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::CursorMoved { device_id: device_id.into(), through }])
}

// ---- messages --------------------------------------------------------------

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

// ---- Web Push (PROTOCOL §9) ------------------------------------------------

/// `push.subscribe`: binds the subscription to the session's device (its
/// shape already checked by the transport); the same subscription again
/// is a no-op, another one replaces it.
pub fn push_subscribe(
    state: &AccountState,
    device_id: &str,
    p: &PushSubscribeParams,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered(state)?;
    let subscription =
        PushSubscription { endpoint: p.endpoint.clone(), p256dh: p.keys.p256dh.clone(), auth: p.keys.auth.clone() };
    if state.push.get(device_id) == Some(&subscription) {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::PushSubscribed { device_id: device_id.into(), subscription }])
}

/// `push.unsubscribe`: removes the session's device's subscription (none:
/// nothing to do).
pub fn push_unsubscribe(state: &AccountState, device_id: &str) -> Vec<AccountEvent> {
    match state.push.get(device_id) {
        Some(s) => vec![AccountEvent::PushUnsubscribed {
            device_id: device_id.into(),
            endpoint: s.endpoint.clone(),
            reason: "unsubscribed".into(),
        }],
        None => vec![],
    }
}

/// The push service answered 404/410 for `endpoint`: the subscription is
/// dropped, unless the device has subscribed anew since (another endpoint).
pub fn push_gone(state: &AccountState, device_id: &str, endpoint: &str) -> Vec<AccountEvent> {
    match state.push.get(device_id) {
        Some(s) if s.endpoint == endpoint => vec![AccountEvent::PushUnsubscribed {
            device_id: device_id.into(),
            endpoint: endpoint.into(),
            reason: "gone".into(),
        }],
        _ => vec![],
    }
}

/// Who gets a Web Push for a new record (PROTOCOL §9): the devices of the
/// record's visible set (fixed at acceptance: the devices that may read
/// it) that have a subscription, are still valid at `now`, and have no
/// open WebSocket (`connected`); never `sender_device`, the device whose
/// own send wrote the record (it knows).
pub fn push_targets<'a>(
    state: &'a AccountState,
    visible: &[String],
    sender_device: Option<&str>,
    connected: impl Fn(&str) -> bool,
    now: UnixSecs,
) -> Vec<(&'a str, &'a PushSubscription)> {
    state
        .push
        .iter()
        .filter(|(device, _)| visible.iter().any(|v| v == device))
        .filter(|(device, _)| Some(*device) != sender_device)
        .filter(|(device, _)| state.device_valid(device, now))
        .filter(|(device, _)| !connected(device))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::client::{Account, Device};
    use relay_schemas::objects::MAX_OBJECT_BYTES_SETTING;
    use serde_json::{json, Value};

    const NOW: u64 = 1_764_400_000;

    fn policy(max_devices: usize, max_revoked_contacts: usize) -> Policy {
        Policy { max_devices, max_revoked_contacts, ..Policy::with_relay_id("relay-a") }
    }

    fn wire<T: serde::de::DeserializeOwned>(v: &Value) -> Wire<T> {
        Wire::from_value(v).unwrap()
    }

    fn alice() -> Account {
        Account::from_seed([1; 32])
    }

    fn device(i: u8) -> Device {
        Device::from_seed(&format!("device-{i}"), [i + 10; 32])
    }

    fn register_value(cert: &Value) -> Value {
        let route = alice().route(1, &[("relay-a", "https://a.example")], NOW);
        alice().register_params(&route, cert, "relay-a", false, NOW)
    }

    /// Alice registered with device 0, then devices 1..n added.
    fn alice_with(n: u8, ctx: Ctx) -> AccountState {
        let mut state = AccountState::new(&alice().id);
        let p: RegisterParams =
            serde_json::from_str(&register_value(&alice().certificate(&device(0), NOW, None)).to_string()).unwrap();
        for e in register(&state, &p, "digest", None, ctx).unwrap() {
            state.apply(&e);
        }
        for i in 1..n {
            for e in add_device(&state, &wire(&alice().certificate(&device(i), NOW, None)), ctx).unwrap() {
                state.apply(&e);
            }
        }
        state
    }

    /// A valid certificate of device `i` whose canonical JSON is `bytes`
    /// long: padded with a signed unknown member.
    fn padded_certificate(i: u8, bytes: usize) -> Value {
        let cert = alice().certificate(&device(i), NOW, None);
        let base = wire::<DeviceCertificate>(&alice().with_member(Tag::DeviceCertificate, &cert, "x-pad", json!("")))
            .jcs()
            .unwrap()
            .len();
        alice().with_member(Tag::DeviceCertificate, &cert, "x-pad", json!("a".repeat(bytes - base)))
    }

    fn limit_of(e: &RelayError) -> &str {
        assert_eq!(e.code, ErrorCode::PayloadTooLarge, "{e:?}");
        e.data.as_ref().and_then(|d| d["limit"].as_str()).unwrap_or_else(|| panic!("no data.limit in {e:?}"))
    }

    #[test]
    fn a_device_add_past_max_devices_is_payload_too_large_naming_the_setting() {
        let policy = policy(3, 1024);
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let state = alice_with(3, ctx);
        let e = add_device(&state, &wire(&alice().certificate(&device(3), NOW, None)), ctx).unwrap_err();
        assert_eq!(limit_of(&e), "limits.max_devices");
        // A certificate on file already is still the no-op it always was.
        let again = add_device(&state, &wire(&alice().certificate(&device(1), NOW, None)), ctx).unwrap();
        assert!(again.is_empty());
    }

    #[test]
    fn revoked_certificates_count_toward_max_devices() {
        let policy = policy(3, 1024);
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let mut state = alice_with(3, ctx);
        for e in revoke_device(&state, &wire(&alice().revocation("device-2", NOW)), ctx).unwrap() {
            state.apply(&e);
        }
        let e = add_device(&state, &wire(&alice().certificate(&device(3), NOW, None)), ctx).unwrap_err();
        assert_eq!(limit_of(&e), "limits.max_devices");
    }

    #[test]
    fn a_certificate_over_max_object_bytes_is_refused_by_device_add_and_account_register() {
        let policy = Policy::with_relay_id("relay-a");
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let state = alice_with(1, ctx);
        let at_limit = padded_certificate(1, policy.max_object_bytes);
        assert_eq!(add_device(&state, &wire(&at_limit), ctx).unwrap().len(), 1, "exactly the limit is accepted");
        let over = padded_certificate(1, policy.max_object_bytes + 1);
        let e = add_device(&state, &wire(&over), ctx).unwrap_err();
        assert_eq!(limit_of(&e), MAX_OBJECT_BYTES_SETTING);
        let p: RegisterParams =
            serde_json::from_str(&register_value(&padded_certificate(0, 20_000)).to_string()).unwrap();
        let e = register(&AccountState::new(&alice().id), &p, "digest", None, ctx).unwrap_err();
        assert_eq!(limit_of(&e), MAX_OBJECT_BYTES_SETTING);
    }

    #[test]
    fn a_route_over_max_object_bytes_is_refused_by_route_update_and_by_a_deliverer() {
        let policy = Policy::with_relay_id("relay-a");
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let state = alice_with(1, ctx);
        let route = alice().route(2, &[("relay-a", "https://a.example")], NOW);
        let big: Wire<Route> = wire(&alice().with_member(Tag::Route, &route, "x-pad", json!("a".repeat(20_000))));
        assert_eq!(limit_of(&update_route(&state, &big, ctx).unwrap_err()), MAX_OBJECT_BYTES_SETTING);
        let env: Wire<MessageEnvelope> =
            wire(&device(0).envelope(&alice().id, &"b".repeat(32), "message-000000000001", NOW, b"x"));
        let e = may_deliver(Some(&big), None, "relay-a", &env, ctx).unwrap_err();
        assert_eq!(limit_of(&e), MAX_OBJECT_BYTES_SETTING, "a size refusal, not forbidden");
    }

    #[test]
    fn contact_revoke_past_max_revoked_contacts_is_payload_too_large_and_a_revoked_id_stays_a_no_op() {
        let policy = policy(32, 2);
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let mut state = alice_with(1, ctx);
        let grant = |id: &str| ContactRevokeParams { grant_id: Some(id.into()), invite_id: None };
        for id in ["g1", "g2"] {
            for e in revoke_contact(&state, &grant(id), ctx).unwrap() {
                state.apply(&e);
            }
        }
        let e = revoke_contact(&state, &grant("g3"), ctx).unwrap_err();
        assert_eq!(limit_of(&e), "limits.max_revoked_contacts");
        let invite = ContactRevokeParams { grant_id: None, invite_id: Some("i1".into()) };
        assert_eq!(limit_of(&revoke_contact(&state, &invite, ctx).unwrap_err()), "limits.max_revoked_contacts");
        assert!(revoke_contact(&state, &grant("g1"), ctx).unwrap().is_empty());
    }

    #[test]
    fn a_devices_answer_from_a_peer_is_held_to_this_relays_bounds() {
        let policy = policy(2, 1024);
        let certs: Vec<Value> = (0..3).map(|i| alice().certificate(&device(i), NOW, None)).collect();
        let answer = |certs: &[Value], revs: &[Value]| -> DevicesAnswer {
            serde_json::from_str(&json!({"certificates": certs, "revocations": revs}).to_string()).unwrap()
        };
        assert!(check_devices_answer(&answer(&certs[..2], &[]), &policy).is_ok());
        let e = check_devices_answer(&answer(&certs, &[]), &policy).unwrap_err();
        assert_eq!(limit_of(&e), "limits.max_devices");
        let big = padded_certificate(0, policy.max_object_bytes + 1);
        let e = check_devices_answer(&answer(&[big], &[]), &policy).unwrap_err();
        assert_eq!(limit_of(&e), MAX_OBJECT_BYTES_SETTING);
        let rev = alice().revocation("device-0", NOW);
        let big_rev = alice().with_member(Tag::DeviceRevocation, &rev, "x-pad", json!("a".repeat(20_000)));
        let e = check_devices_answer(&answer(&certs[..1], &[big_rev]), &policy).unwrap_err();
        assert_eq!(limit_of(&e), MAX_OBJECT_BYTES_SETTING);
    }

    fn entry(retention_until: u64) -> SendEntry {
        let status = DeliveryStatus::target_accepted(10);
        SendEntry { digest: "d".into(), to: "b".into(), deadline: 50, retention_until, status, sequence: None }
    }

    #[test]
    fn an_account_not_served_here_is_pointed_at_its_newer_route_or_is_not_local() {
        let route = relay_schemas::client::Account::from_seed([5; 32]).route(3, &[("relay-c", "http://c")], 1);
        let route: Wire<Route> = Wire::from_value(&route).unwrap();
        let e = not_served_here(Some(&route));
        assert_eq!(e.code, ErrorCode::RouteStale);
        assert_eq!(e.data.unwrap()["route"]["revision"], 3);
        assert_eq!(not_served_here(None).code, ErrorCode::TargetNotLocal);
    }

    #[test]
    fn delivery_status_answers_until_retention_ends_that_second_included() {
        assert_eq!(delivery_status(Some(&entry(100)), UnixSecs(100)).unwrap(), DeliveryStatus::target_accepted(10));
        assert_eq!(delivery_status(Some(&entry(100)), UnixSecs(101)).unwrap_err().code, ErrorCode::MessageExpired);
        assert_eq!(delivery_status(None, UnixSecs(0)).unwrap_err().code, ErrorCode::NotFound);
    }
}
