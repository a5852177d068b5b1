//! `message.deliver` (PROTOCOL §5): the recipient's home takes a message
//! from a home relay of the sender, by the seed's receiving rules
//! ([`receive`]), once the caller is one the sender chose
//! ([`may_deliver`], and [`check_sender`] where this relay serves the
//! sender too). A local delivery is decided by the same rules.

use crate::account::decision::{Decision, Reads, Reply};
use crate::account::events::AccountEvent;
use crate::account::ledger::ReceiptEntry;
use crate::account::shared::{check_created_at, idempotent, record, served_here, visible_devices, Ctx};
use crate::account::state::{contact_key, AccountState};
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{check_boxes, Authorization, DeliveryStatus, MessageEnvelope, Route, Wire};
use relay_schemas::sign::Tag;
use relay_schemas::RelayError;

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

/// PROTOCOL §5 *Who may deliver*, at a relay that may serve the sender
/// too: whether the sending device must also be checked against the
/// sender's own state here ([`check_sender`]). So it must when the
/// sender's newest route this relay knows (`known`) names this relay;
/// with no route known, or one naming only other relays, the source's
/// word stands. For `message.deliver` from another relay and for this
/// relay's own attempts at a recipient it serves alike.
pub fn checks_sender_here(known: Option<&Wire<Route>>, relay_id: &str) -> bool {
    known.is_some_and(|r| r.lists_relay(relay_id))
}

/// When this relay itself serves the sender, a delivery from another relay
/// must name a sending device valid here: not revoked, not expired
/// (PROTOCOL §5). A device this home has no word of at all (no certificate,
/// no revocation) was added at a home the account had before it moved here,
/// or at its other home and not replicated yet: the source confirmed it at
/// submission and its certificate verified above, as at any recipient, so
/// this home has nothing to hold against it. Refusing it would end the
/// delivery `failed` for good over what a client re-adds later or
/// replication brings (found by relay-sim, seeds 3889 and 9381).
pub fn check_sender(state: &AccountState, device_id: &str, ctx: Ctx) -> Result<(), RelayError> {
    let unknown = state.certificate(device_id).is_none() && !state.revocations().contains_key(device_id);
    if unknown || state.device_valid(device_id, ctx.now) {
        return Ok(());
    }
    Err(RelayError::forbidden(format!("who may deliver: device {device_id} is not valid at the sender's home relay")))
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
    if state.revoked_contacts().contains(&contact_key(kind, id)) {
        return Err(RelayError::forbidden(format!("authorization: {kind} was revoked")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! `message.deliver` at the destination: the receiving rules and who may
    //! deliver (PROTOCOL §5).

    use super::*;
    use crate::account::testkit::*;

    /// Every invalid credential is `forbidden`, with or without public discovery.
    #[track_caller]
    fn then_forbidden_without_fallback(extra: Vec<AccountEvent>, auth: Value) {
        for discovery in [false, true] {
            let mut events = extra.clone();
            events.push(public_discovery(discovery));
            let s = given_alice(events);
            let v = with_auth(bob_to_alice_without_auth(1), auth.clone());
            then_error(when_receive(&s, &v, at(NOW)), ErrorCode::Forbidden);
            // The same message without credentials is accepted under public discovery.
            if discovery {
                then_accepted(when_receive(&s, &bob_to_alice_without_auth(1), at(NOW)));
            }
        }
    }

    // =============================================================================
    // who may deliver (PROTOCOL §5): message.deliver from another relay
    // =============================================================================

    fn bob_env(created_at: u64) -> Wire<relay_schemas::objects::MessageEnvelope> {
        wire(&envelope(&bob_phone(), &bob(), &alice(), 1, created_at))
    }

    /// Bob's route at `revision` naming `relays`, issued at `issued_at`.
    fn bob_route(revision: u64, relays: &[&str], issued_at: u64) -> Wire<Route> {
        let relays: Vec<(&str, &str)> = relays.iter().map(|r| (*r, URL_B)).collect();
        wire(&bob().route(revision, &relays, issued_at))
    }

    #[test]
    fn the_sending_device_is_checked_here_only_when_the_senders_known_route_names_this_relay() {
        assert!(checks_sender_here(Some(&bob_route(2, &[RELAY, "relay-c"], NOW)), RELAY));
        assert!(!checks_sender_here(Some(&bob_route(2, &["relay-b", "relay-c"], NOW)), RELAY));
        assert!(!checks_sender_here(None, RELAY), "no route known: the source's word stands");
    }

    #[test]
    fn receive_accepts_a_valid_delivery_with_target_accepted_at_the_destination_time() {
        let s = given_alice([]);
        let (event, status) = then_accepted(when_receive(&s, &bob_to_alice(1), at(NOW + 3)));
        assert_eq!(status, DeliveryStatus::target_accepted(NOW + 3));
        match &event {
            AccountEvent::MessageReceived { from, message_id, accepted_at, retention_until, record, .. } => {
                assert_eq!(from, &bob().id);
                assert_eq!(message_id, &mid(1));
                assert_eq!(*accepted_at, NOW + 3);
                assert_eq!(*retention_until, NOW + 3 + retention());
                assert_eq!(record.sequence, 1);
                assert_eq!(record.visible, strings(&["phone", "laptop"]));
                assert_eq!(record.envelope.raw().get(), bob_to_alice(1)["envelope"].to_string());
            }
            e => panic!("expected MessageReceived, got {e:?}"),
        }
    }

    /// PROTOCOL §5 *What a partner home may replicate*: the other home checks
    /// a received record against the certificate it verified under, so an
    /// account with two homes keeps it; one with a single home has no partner
    /// to show it to.
    #[test]
    fn a_receipt_keeps_the_senders_certificate_only_for_an_account_with_another_home() {
        let kept = |s: &Given| match then_accepted(when_receive(s, &bob_to_alice(1), at(NOW))).0 {
            AccountEvent::MessageReceived { sender_certificate, .. } => sender_certificate,
            e => panic!("expected MessageReceived, got {e:?}"),
        };
        assert!(kept(&given_alice([])).is_none());
        let two_homes = given_alice([route_updated(&route(&alice(), 2, &[RELAY, "relay-b"]))]);
        let kept_cert = kept(&two_homes).expect("kept for the other home");
        assert_eq!(*kept_cert, parse::<Wire<DeviceCertificate>>(&cert(&bob(), &bob_phone())));
    }

    // Rule 1.

    #[test]
    fn receive_requires_the_recipients_current_route_to_designate_this_relay() {
        let moved = route(&alice(), 2, &["relay-b"]);
        let s = given_alice([route_updated(&moved)]);
        then_route_error(when_receive(&s, &bob_to_alice(1), at(NOW)), &moved);
    }

    #[test]
    fn receive_accepts_at_either_home_relay_of_the_route() {
        let s = given_alice([route_updated(&route(&alice(), 2, &["relay-b", RELAY]))]);
        then_accepted(when_receive(&s, &bob_to_alice(1), at(NOW)));
    }

    #[test]
    fn receive_for_an_unregistered_account_is_not_found() {
        let s = Given::new(&alice().id);
        then_error(when_receive(&s, &bob_to_alice(1), at(NOW)), ErrorCode::NotFound);
    }

    #[test]
    fn receive_requires_the_envelope_to_be_addressed_to_this_account() {
        let s = given_alice([]);
        let to_carol = envelope(&bob_phone(), &bob(), &carol(), 1, NOW);
        let v = with_auth(
            deliver_value(to_carol, &["phone"], cert(&bob(), &bob_phone())),
            grant_auth(grant_alice_to_bob()),
        );
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidParams);
    }

    // Rule 2.

    #[test]
    fn receive_requires_the_envelope_and_boxes_to_meet_the_object_constraints() {
        let s = given_alice([]);
        let big =
            bob_phone().envelope(&bob().id, &alice().id, &mid(1), NOW, &vec![0u8; POLICY.max_ciphertext_bytes + 1]);
        let v = with_auth(deliver_value(big, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::PayloadTooLarge);
        let mut v = bob_to_alice(2);
        v["recipient_boxes"] = json!([{"device_id": "phone", "box": "AQ=="}]);
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn receive_rejects_a_sender_certificate_with_a_bad_signature() {
        let s = given_alice([]);
        let mut v = bob_to_alice(1);
        v["sender_device_certificate"] = tampered(cert(&bob(), &bob_phone()), "issued_at", json!(ISSUED - 1));
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
        // Signed by the device instead of the account.
        v["sender_device_certificate"] = signed(Tag::DeviceCertificate, cert(&bob(), &bob_phone()), &bob_phone().key);
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
        // Signed under another tag.
        v["sender_device_certificate"] = signed(Tag::Route, cert(&bob(), &bob_phone()), &bob().key);
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn receive_rejects_a_sender_certificate_whose_account_id_does_not_derive_from_its_key() {
        let s = given_alice([]);
        // Carol's key certifying a device under Bob's id, so that it "matches" the envelope.
        let forged = signed(
            Tag::DeviceCertificate,
            tampered(
                tampered(cert(&bob(), &bob_phone()), "account_key", json!(carol().public_key())),
                "account_id",
                json!(bob().id),
            ),
            &carol().key,
        );
        let mut v = bob_to_alice(1);
        v["sender_device_certificate"] = forged;
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn receive_requires_the_certificate_to_match_envelope_from_and_from_device_id() {
        let s = given_alice([]);
        // In each case the envelope signature verifies under the certificate's
        // device key, so only the match rule can reject it.
        let bob_phone_key = [21; 32];
        // A valid certificate of another account (Carol certifies Bob's phone key).
        let mut v = bob_to_alice(1);
        v["sender_device_certificate"] = cert(&carol(), &Device::from_seed("bob-phone", bob_phone_key));
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
        // A valid certificate of the sender for another device id with the same key.
        let mut v = bob_to_alice(2);
        v["sender_device_certificate"] = cert(&bob(), &Device::from_seed("bob-laptop", bob_phone_key));
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
        // A valid certificate of another device of the sender, envelope signed by the named device.
        let env = envelope(&bob_laptop(), &bob(), &alice(), 3, NOW);
        let v = with_auth(deliver_value(env, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn receive_requires_the_envelope_to_be_signed_by_the_certified_device() {
        let s = given_alice([]);
        let by_other_device =
            signed(Tag::Envelope, envelope(&bob_phone(), &bob(), &alice(), 1, NOW), &bob_laptop().key);
        let v = with_auth(
            deliver_value(by_other_device, &["phone"], cert(&bob(), &bob_phone())),
            grant_auth(grant_alice_to_bob()),
        );
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
        let altered = tampered(envelope(&bob_phone(), &bob(), &alice(), 2, NOW), "ciphertext", json!("AQID"));
        let v =
            with_auth(deliver_value(altered, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn receive_rejects_an_envelope_signed_under_another_domain_tag() {
        let s = given_alice([]);
        let wrong_tag = signed(Tag::Session, envelope(&bob_phone(), &bob(), &alice(), 1, NOW), &bob_phone().key);
        let v = with_auth(
            deliver_value(wrong_tag, &["phone"], cert(&bob(), &bob_phone())),
            grant_auth(grant_alice_to_bob()),
        );
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn receive_rejects_an_expired_or_not_yet_valid_sender_certificate() {
        let s = given_alice([]);
        let mut v = bob_to_alice(1);
        v["sender_device_certificate"] = bob().certificate(&bob_phone(), ISSUED, Some(NOW));
        then_rejected(when_receive(&s, &v, at(NOW)));
        v["sender_device_certificate"] = bob().certificate(&bob_phone(), NOW + POLICY.clock_tolerance + 1, None);
        then_rejected(when_receive(&s, &v, at(NOW)));
    }

    // Rule 3.

    #[test]
    fn receive_applies_the_destinations_own_clock_tolerance() {
        let s = given_alice([]);
        let mut strict = Policy::with_relay_id(RELAY);
        strict.clock_tolerance = 60;
        // Within the default (source) tolerance, beyond the destination's.
        let env = envelope(&bob_phone(), &bob(), &alice(), 1, NOW + 120);
        let v = with_auth(deliver_value(env, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
        then_accepted(when_receive(&s, &v, at(NOW)));
        then_error(when_receive(&s, &v, under(&strict, NOW)), ErrorCode::ClockSkew);
    }

    #[test]
    fn receive_applies_the_destinations_own_delivery_age_limit() {
        let s = given_alice([]);
        let mut strict = Policy::with_relay_id(RELAY);
        strict.delivery_age_limit = 600;
        let env = envelope(&bob_phone(), &bob(), &alice(), 1, NOW - 1200);
        let v = with_auth(deliver_value(env, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
        then_accepted(when_receive(&s, &v, at(NOW)));
        then_error(when_receive(&s, &v, under(&strict, NOW)), ErrorCode::MessageExpired);
        let env = envelope(&bob_phone(), &bob(), &alice(), 2, NOW - age_limit() - 1);
        let v = with_auth(deliver_value(env, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::MessageExpired);
    }

    // Rule 4.

    #[test]
    fn receive_without_authorization_requires_public_discovery() {
        let s = given_alice([]);
        then_error(when_receive(&s, &bob_to_alice_without_auth(1), at(NOW)), ErrorCode::Forbidden);
        let s = given_alice([public_discovery(true)]);
        then_accepted(when_receive(&s, &bob_to_alice_without_auth(1), at(NOW)));
    }

    #[test]
    fn receive_accepts_a_valid_contact_grant_from_the_recipient_to_the_sender() {
        let s = given_alice([]);
        assert!(!s.public_discovery);
        then_accepted(when_receive(&s, &bob_to_alice(1), at(NOW)));
        // Grants without expiry are valid too.
        let open_ended = alice().grant("grant-open", &bob().id, ISSUED, None);
        let v = with_auth(bob_to_alice_without_auth(2), grant_auth(open_ended));
        then_accepted(when_receive(&s, &v, at(NOW)));
    }

    #[test]
    fn receive_accepts_a_contact_invite_issued_by_the_recipient() {
        let s = given_alice([]);
        let invite = alice().invite("invite-1", ISSUED, NOW + 3600);
        let v = with_auth(bob_to_alice_without_auth(1), invite_auth(invite));
        then_accepted(when_receive(&s, &v, at(NOW)));
    }

    #[test]
    fn receive_refuses_a_grant_to_another_account_without_falling_back_to_public_discovery() {
        let to_carol = alice().grant("grant-carol", &carol().id, ISSUED, None);
        then_forbidden_without_fallback(vec![], grant_auth(to_carol));
    }

    #[test]
    fn receive_refuses_a_grant_from_another_account_without_falling_back_to_public_discovery() {
        let from_carol = carol().grant("grant-bob", &bob().id, ISSUED, None);
        then_forbidden_without_fallback(vec![], grant_auth(from_carol));
    }

    #[test]
    fn receive_refuses_an_expired_grant_without_falling_back_to_public_discovery() {
        let expired = alice().grant("grant-bob", &bob().id, ISSUED, Some(NOW));
        then_forbidden_without_fallback(vec![], grant_auth(expired));
        let future = alice().grant("grant-bob", &bob().id, NOW + POLICY.clock_tolerance + 1, None);
        then_forbidden_without_fallback(vec![], grant_auth(future));
    }

    #[test]
    fn receive_refuses_a_grant_with_a_bad_signature_without_falling_back_to_public_discovery() {
        let altered = tampered(grant_alice_to_bob(), "expires_at", json!(NOW + 10 * 86_400));
        then_forbidden_without_fallback(vec![], grant_auth(altered));
        // Alice's grant signed by someone else's key.
        let by_bob = signed(Tag::ContactGrant, grant_alice_to_bob(), &bob().key);
        then_forbidden_without_fallback(vec![], grant_auth(by_bob));
        // Alice's key, another object's tag.
        let wrong_tag = signed(Tag::ContactInvite, grant_alice_to_bob(), &alice().key);
        then_forbidden_without_fallback(vec![], grant_auth(wrong_tag));
    }

    #[test]
    fn receive_refuses_a_revoked_grant_without_falling_back_to_public_discovery() {
        then_forbidden_without_fallback(vec![contact_revoked("grant", "grant-bob")], grant_auth(grant_alice_to_bob()));
    }

    #[test]
    fn receive_refuses_an_invalid_invite_without_falling_back_to_public_discovery() {
        let expired = alice().invite("invite-1", ISSUED, NOW);
        then_forbidden_without_fallback(vec![], invite_auth(expired));
        let foreign = carol().invite("invite-1", ISSUED, NOW + 3600);
        then_forbidden_without_fallback(vec![], invite_auth(foreign));
        let altered = tampered(alice().invite("invite-1", ISSUED, NOW + 3600), "expires_at", json!(NOW + 7200));
        then_forbidden_without_fallback(vec![], invite_auth(altered));
        then_forbidden_without_fallback(
            vec![contact_revoked("invite", "invite-1")],
            invite_auth(alice().invite("invite-1", ISSUED, NOW + 3600)),
        );
    }

    #[test]
    fn revoking_an_invite_does_not_revoke_a_grant_with_the_same_id() {
        let s = given_alice([contact_revoked("invite", "grant-bob")]);
        then_accepted(when_receive(&s, &bob_to_alice(1), at(NOW)));
    }

    // Rule 5.

    #[test]
    fn receive_requires_at_least_one_recipient_device_valid_now() {
        let expired = alice().certificate(&tablet(), ISSUED, Some(NOW));
        let s = given_alice([device_revoked(&alice(), "laptop"), device_added_cert(&expired)]);
        let mut v = bob_to_alice(1);
        v["recipient_boxes"] = boxes(&["laptop", "tablet", "unknown-device"]);
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::DeviceUnknown);
    }

    #[test]
    fn receive_accepts_when_some_recipient_devices_are_unavailable_and_they_cannot_read_the_record() {
        let s = given_alice([device_revoked(&alice(), "laptop")]);
        let mut v = bob_to_alice(1);
        v["recipient_boxes"] = boxes(&["laptop", "phone", "tablet"]);
        let (event, _) = then_accepted(when_receive(&s, &v, at(NOW)));
        let r = record_of(&event);
        assert_eq!(r.visible, strings(&["phone"]));
        assert_eq!(box_ids(r), strings(&["laptop", "phone", "tablet"]));
    }

    #[test]
    fn receive_accepts_boxes_that_do_not_cover_every_current_device() {
        let s = given_alice([]);
        let mut v = bob_to_alice(1);
        v["recipient_boxes"] = boxes(&["laptop"]);
        let (event, _) = then_accepted(when_receive(&s, &v, at(NOW)));
        assert_eq!(record_of(&event).visible, strings(&["laptop"]));
    }

    // Idempotency at the destination.

    #[test]
    fn receive_retry_with_identical_content_returns_target_accepted_with_the_original_accepted_at() {
        let s = given_alice([]);
        let v = bob_to_alice(1);
        let s = given_alice([receive_event(&s, &v)]);
        let status = then_receive_duplicate(when_receive(&s, &v, at(NOW + 60)));
        assert_eq!(status, DeliveryStatus::target_accepted(NOW));
        assert_eq!(s.last_sequence, 1);
    }

    #[test]
    fn receive_retry_is_not_negated_by_later_device_authorization_or_age_changes() {
        let s = given_alice([]);
        let v = bob_to_alice(1);
        let accepted = receive_event(&s, &v);
        let s = given_alice([
            accepted,
            device_revoked(&alice(), "phone"),
            device_revoked(&alice(), "laptop"),
            contact_revoked("grant", "grant-bob"),
        ]);
        // Every recipient device gone, the grant revoked, and past the age limit.
        let later = NOW + age_limit() + 60;
        let status = then_receive_duplicate(when_receive(&s, &v, at(later)));
        assert_eq!(status, DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn receive_retry_with_different_content_is_state_conflict() {
        let s = given_alice([]);
        let v = bob_to_alice(1);
        let s = given_alice([receive_event(&s, &v)]);
        let mut other_boxes = v.clone();
        other_boxes["recipient_boxes"] = boxes(&["phone"]);
        then_error(when_receive(&s, &other_boxes, at(NOW + 1)), ErrorCode::StateConflict);
        let without_auth = bob_to_alice_without_auth(1);
        then_error(when_receive(&s, &without_auth, at(NOW + 1)), ErrorCode::StateConflict);
        // The original result is untouched.
        assert_eq!(then_receive_duplicate(when_receive(&s, &v, at(NOW + 2))), DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn receive_idempotency_key_is_the_sender_and_the_message_id() {
        let s = given_alice([]);
        let s = given_alice([receive_event(&s, &bob_to_alice(1))]);
        // The same message id from another account is another message.
        let env = envelope(&carol_phone(), &carol(), &alice(), 1, NOW);
        let grant = alice().grant("grant-carol", &carol().id, ISSUED, None);
        let v = with_auth(deliver_value(env, &["phone"], cert(&carol(), &carol_phone())), grant_auth(grant));
        let (event, _) = then_accepted(when_receive(&s, &v, at(NOW)));
        assert_eq!(record_of(&event).sequence, 2);
    }

    #[test]
    fn receive_retry_after_result_retention_is_message_expired() {
        let mut short = Policy::with_relay_id(RELAY);
        short.message_retention = 600;
        let s = given_alice([]);
        let v = bob_to_alice(1);
        let event = then_accepted(when_receive(&s, &v, under(&short, NOW))).0;
        let s = given_alice([event]);
        then_receive_duplicate(when_receive(&s, &v, under(&short, NOW + 599)));
        then_error(when_receive(&s, &v, under(&short, NOW + 601)), ErrorCode::MessageExpired);
    }

    #[test]
    fn receive_retry_of_an_accepted_message_answers_the_original_result_after_the_route_moves() {
        let s = given_alice([]);
        let v = bob_to_alice(1);
        let s = given_alice([receive_event(&s, &v), route_updated(&route(&alice(), 2, &["relay-b"]))]);
        let status = then_receive_duplicate(when_receive(&s, &v, at(NOW + 60)));
        assert_eq!(status, DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn receive_refuses_inter_relay_delivery_of_a_self_delivery() {
        let s = given_alice([]);
        let env = envelope(&phone(), &alice(), &alice(), 1, NOW);
        let v = deliver_value(env, &["laptop"], cert(&alice(), &phone()));
        let r = when_receive(&s, &v, at(NOW));
        assert!(r.is_err(), "self-delivery must not be accepted through message.deliver, got {r:?}");
    }

    #[test]
    fn who_may_deliver_requires_the_senders_route() {
        let e = may_deliver(None, None, "relay-b", &bob_env(NOW), at(NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
    }

    #[test]
    fn who_may_deliver_requires_the_caller_to_be_listed_in_the_senders_route() {
        let route = bob_route(1, &["relay-b"], ISSUED);
        may_deliver(Some(&route), None, "relay-b", &bob_env(NOW), at(NOW)).unwrap();
        let e = may_deliver(Some(&route), None, "relay-c", &bob_env(NOW), at(NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
    }

    #[test]
    fn who_may_deliver_requires_a_valid_route_of_the_sender() {
        // Alice's route listing the caller does not let it deliver as Bob.
        let alices = wire(&alice().route(1, &[("relay-b", URL_B)], ISSUED));
        let e = may_deliver(Some(&alices), None, "relay-b", &bob_env(NOW), at(NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
        // A tampered route (relay swapped in after signing).
        let forged: Wire<Route> = wire(&tampered(
            bob().route(1, &[("relay-x", URL_B)], ISSUED),
            "relays",
            json!([{"id": "relay-b", "url": URL_B}]),
        ));
        let e = may_deliver(Some(&forged), None, "relay-b", &bob_env(NOW), at(NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
    }

    #[test]
    fn who_may_deliver_accepts_the_highest_known_revision() {
        let route = bob_route(2, &["relay-b"], ISSUED);
        let known = bob_route(1, &["relay-c"], ISSUED - 100);
        may_deliver(Some(&route), Some(&known), "relay-b", &bob_env(NOW), at(NOW)).unwrap();
        may_deliver(Some(&route), Some(&route), "relay-b", &bob_env(NOW), at(NOW)).unwrap();
    }

    #[test]
    fn who_may_deliver_refuses_a_route_superseded_before_the_message_was_created() {
        let old = bob_route(1, &["relay-b"], ISSUED - 100);
        let moved = bob_route(2, &["relay-c"], ISSUED);
        let e = may_deliver(Some(&old), Some(&moved), "relay-b", &bob_env(ISSUED + 10), at(NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
    }

    #[test]
    fn who_may_deliver_accepts_a_route_superseded_after_the_message_was_created() {
        // Accepted under revision 1 before the sender moved: its source still
        // delivers it.
        let old = bob_route(1, &["relay-b"], ISSUED - 100);
        let moved = bob_route(2, &["relay-c"], NOW - 10);
        may_deliver(Some(&old), Some(&moved), "relay-b", &bob_env(NOW - 60), at(NOW)).unwrap();
    }

    #[test]
    fn who_may_deliver_refuses_a_route_that_differs_from_the_known_one_of_its_revision() {
        let known = bob_route(1, &["relay-c"], ISSUED);
        let other = bob_route(1, &["relay-b"], ISSUED);
        let e = may_deliver(Some(&other), Some(&known), "relay-b", &bob_env(NOW), at(NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Forbidden);
    }

    #[test]
    fn who_may_deliver_requires_a_sending_device_valid_where_the_callee_serves_the_sender() {
        check_sender(&given_alice([]), "laptop", at(NOW)).unwrap();
        let s = given_alice([device_revoked(&alice(), "laptop")]);
        assert_eq!(check_sender(&s, "laptop", at(NOW)).unwrap_err().code, ErrorCode::Forbidden);
    }

    #[test]
    fn who_may_deliver_holds_nothing_against_a_device_the_senders_home_has_no_word_of() {
        // Added at the home the account moved from, or at its other home
        // and not replicated yet: the source confirmed it.
        check_sender(&given_alice([]), "tablet", at(NOW)).unwrap();
        // Its revocation known here without its certificate is a refusal.
        let s = given_alice([device_revoked(&alice(), "tablet")]);
        assert_eq!(check_sender(&s, "tablet", at(NOW)).unwrap_err().code, ErrorCode::Forbidden);
    }
}
