//! `contact.revoke` (PROTOCOL §4): a grant or invite id the account no
//! longer honours; also how one revoked at the other home is decided here
//! ([`revoke_contact_id`]).

use crate::account::decision::{Decision, Reply};
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, registered_route, Ctx};
use crate::account::state::{contact_key, AccountState};
use crate::policy::MAX_REVOKED_CONTACTS_SETTING;
use relay_schemas::methods::ContactRevokeParams;
use relay_schemas::RelayError;

pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &ContactRevokeParams,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    Ok(Decision::write(revoke_contact(state, params, ctx)?, Reply::ok()))
}

pub fn revoke_contact(
    state: &AccountState,
    p: &ContactRevokeParams,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered_route(state)?;
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
    if state.revoked_contacts().contains(&contact_key(kind, id)) {
        return Ok(vec![]);
    }
    let max = ctx.policy.max_revoked_contacts;
    if state.revoked_contacts().len() >= max {
        return Err(RelayError::over_limit(
            MAX_REVOKED_CONTACTS_SETTING,
            format!("the account revoked {} grants and invites, limit {max}", state.revoked_contacts().len()),
        ));
    }
    Ok(vec![AccountEvent::ContactRevoked { kind: kind.into(), id: id.to_owned() }])
}

#[cfg(test)]
/// The rule at the limits of its policy.
mod at_the_limits {
    use super::*;
    use crate::account::testkit::limits::*;
    use relay_schemas::UnixSecs;

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
}

#[cfg(test)]
mod tests {
    //! `route.update`, `account.settings.update` and `contact.revoke`.

    use super::*;
    use crate::account::testkit::*;

    #[test]
    fn contact_revoke_is_idempotent_and_keyed_by_kind_and_id() {
        let s = given_alice([]);
        let p = ContactRevokeParams { grant_id: Some("grant-bob".into()), invite_id: None };
        let events = then_events(revoke_contact(&s, &p, at(NOW)));
        assert_eq!(events.len(), 1);
        let s = given_alice(events);
        then_no_events(revoke_contact(&s, &p, at(NOW)));
        // An invite with the same id is another credential.
        let invite = ContactRevokeParams { grant_id: None, invite_id: Some("grant-bob".into()) };
        assert_eq!(then_events(revoke_contact(&s, &invite, at(NOW))).len(), 1);
        let both = ContactRevokeParams { grant_id: Some("a".into()), invite_id: Some("b".into()) };
        then_error(revoke_contact(&s, &both, at(NOW)), ErrorCode::InvalidParams);
    }
}
