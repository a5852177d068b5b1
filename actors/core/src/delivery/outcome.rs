//! What one attempt at one destination came to: the input of the
//! delivery core's rules, whichever transport made the attempt.

use relay_schemas::{DeliveryStatus, RelayError};

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
