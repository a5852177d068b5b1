//! `account.devices.get` (PROTOCOL §4): the account's certificates and
//! revocations, to anyone; an answer read from another relay is held to
//! this relay's bounds before it is passed on ([`check_devices_answer`]).

use crate::account::decision::json;
use crate::account::decision::Decision;
use crate::account::state::AccountState;
use crate::policy::{Policy, MAX_DEVICES_SETTING};
use relay_schemas::methods::{DevicesAnswer, DevicesResult};
use relay_schemas::RelayError;

/// Reads the lists; writes nothing.
pub(crate) fn decide(state: &AccountState) -> Result<Decision, RelayError> {
    if !state.is_registered() {
        return Err(RelayError::not_found("unknown account"));
    }
    let certificates: Vec<_> = state.certificates().collect();
    Ok(Decision::reply(json(&DevicesResult {
        certificates: certificates.iter().collect(),
        revocations: state.revocations().values().collect(),
    })?))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::testkit::limits::*;
    use relay_schemas::objects::MAX_OBJECT_BYTES_SETTING;
    use relay_schemas::sign::Tag;
    use serde_json::{json, Value};

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
}
