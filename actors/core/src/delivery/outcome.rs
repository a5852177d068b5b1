//! What one attempt at one destination came to: the input of the
//! delivery core's rules, whichever transport made the attempt, and the
//! final status an outcome settles at once ([`final_status`]), which the
//! delivery's aggregate and `message.send`'s process manager (of a local
//! attempt made before acceptance) both ask.

use relay_schemas::objects::{DeliveryStatus, Status};
use relay_schemas::{DeliveryHandling, RelayError, UnixSecs};

/// What one attempt at one destination came to. The distinctions matter
/// for result confirmation and target switching (seed).
#[derive(Clone, Debug)]
pub enum AttemptOutcome {
    /// The destination answered with a `DeliveryStatus`.
    Answered(DeliveryStatus),
    /// The destination answered an error with a code this protocol defines.
    Rejected(RelayError),
    /// The destination answered a code this version does not define; the
    /// delivery ends with `bad_gateway` (seed error table).
    Unrecognized(RelayError),
    /// Receipt unknown: timeout, disconnect or unreadable answer after the
    /// request may have arrived. Confirm with the same target.
    Unknown(RelayError),
    /// Receipt certainly not attempted (e.g. connection refused); the
    /// target may be switched to a higher route revision.
    NotAttempted(RelayError),
}

impl AttemptOutcome {
    pub fn error(&self) -> Option<&RelayError> {
        match self {
            AttemptOutcome::Answered(_) => None,
            AttemptOutcome::Rejected(e)
            | AttemptOutcome::Unrecognized(e)
            | AttemptOutcome::Unknown(e)
            | AttemptOutcome::NotAttempted(e) => Some(e),
        }
    }
}

/// The final status an attempt's outcome settles at once, if any: the
/// target took it, or refused it for good (the seed's error table). Anything
/// else (a busy account, a retryable or route error, an unknown result) is
/// left to the timetable. The delivery's `DeliveryCmd::Outcome` starts with
/// it, and the send's process manager asks it of a local attempt made
/// before acceptance.
pub fn final_status(outcome: &AttemptOutcome, accepted_at: UnixSecs) -> Option<DeliveryStatus> {
    let accepted_at = accepted_at.0;
    match outcome {
        AttemptOutcome::Answered(st) if st.status == Status::TargetAccepted => {
            Some(DeliveryStatus::target_accepted(accepted_at))
        }
        AttemptOutcome::Rejected(e) if e.code.delivery_handling() == DeliveryHandling::End => {
            Some(DeliveryStatus::failed(accepted_at, e.clone()))
        }
        AttemptOutcome::Unrecognized(e) => Some(DeliveryStatus::failed(accepted_at, e.clone())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::ErrorCode;

    const AT: UnixSecs = UnixSecs(1_700_000_000);

    #[test]
    fn an_outcome_ends_a_delivery_at_once_only_when_the_target_took_it_or_refused_it_for_good() {
        let taken = AttemptOutcome::Answered(DeliveryStatus::target_accepted(5));
        assert_eq!(
            final_status(&taken, AT),
            Some(DeliveryStatus::target_accepted(AT.0)),
            "stamped with the acceptance"
        );
        let refused = RelayError::new(ErrorCode::DeviceUnknown, "no such device");
        assert_eq!(refused.code.delivery_handling(), DeliveryHandling::End);
        assert_eq!(
            final_status(&AttemptOutcome::Rejected(refused.clone()), AT),
            Some(DeliveryStatus::failed(AT.0, refused))
        );
        let unrecognized = RelayError::new(ErrorCode::BadGateway, "code from a later version");
        assert!(final_status(&AttemptOutcome::Unrecognized(unrecognized), AT).is_some());
        let busy = RelayError::unavailable("account busy");
        assert_eq!(busy.code.delivery_handling(), DeliveryHandling::Retry);
        for left in [
            AttemptOutcome::Rejected(busy.clone()),
            AttemptOutcome::Unknown(busy.clone()),
            AttemptOutcome::NotAttempted(busy),
            AttemptOutcome::Answered(DeliveryStatus::delivering(5)),
        ] {
            assert_eq!(final_status(&left, AT), None, "left to the timetable: {left:?}");
        }
    }
}
