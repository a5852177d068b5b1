//! Newtypes for the values the relay must never mix up: Unix seconds (the
//! protocol's unit of time) and milliseconds (timers and the due index),
//! and the three kinds of identifier a delivery carries. All serialize as
//! the bare number or string they wrap, so stored events and snapshots keep
//! their bytes.
//!
//! Wire objects keep their fields as the protocol's plain numbers and
//! strings; the rules take these types, so a second can no longer be passed
//! where a millisecond is due, nor a message id where an account id is.

use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::ops::Deref;

/// Unix seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UnixSecs(pub u64);

/// Milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UnixMillis(pub u64);

impl UnixSecs {
    /// The same instant in milliseconds.
    pub fn millis(self) -> UnixMillis {
        UnixMillis(self.0.saturating_mul(1000))
    }
    /// `secs` later (saturating).
    pub fn plus(self, secs: u64) -> Self {
        UnixSecs(self.0.saturating_add(secs))
    }
    /// Seconds from `earlier` to `self`; 0 if `earlier` is later.
    pub fn since(self, earlier: UnixSecs) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl UnixMillis {
    /// The second this instant falls in.
    pub fn secs(self) -> UnixSecs {
        UnixSecs(self.0 / 1000)
    }
    /// `ms` later (saturating).
    pub fn plus(self, ms: u64) -> Self {
        UnixMillis(self.0.saturating_add(ms))
    }
    /// `ms` earlier (saturating).
    pub fn minus(self, ms: u64) -> Self {
        UnixMillis(self.0.saturating_sub(ms))
    }
    /// Milliseconds from `earlier` to `self`; 0 if `earlier` is later.
    pub fn since(self, earlier: UnixMillis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// Both read as their plain number (`u64::from`, `Display`).
macro_rules! plain_number {
    ($t:ty) => {
        impl From<$t> for u64 {
            fn from(t: $t) -> u64 {
                t.0
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}
plain_number!(UnixSecs);
plain_number!(UnixMillis);

/// Seconds compare with the protocol's plain second fields (`created_at`,
/// `expires_at`, …) in either order. Milliseconds do not: no protocol
/// field is in milliseconds, so such a comparison is a unit mix-up.
macro_rules! compares_with_u64 {
    ($t:ty) => {
        impl PartialEq<u64> for $t {
            fn eq(&self, other: &u64) -> bool {
                self.0 == *other
            }
        }
        impl PartialEq<$t> for u64 {
            fn eq(&self, other: &$t) -> bool {
                *self == other.0
            }
        }
        impl PartialOrd<u64> for $t {
            fn partial_cmp(&self, other: &u64) -> Option<Ordering> {
                self.0.partial_cmp(other)
            }
        }
        impl PartialOrd<$t> for u64 {
            fn partial_cmp(&self, other: &$t) -> Option<Ordering> {
                self.partial_cmp(&other.0)
            }
        }
    };
}
compares_with_u64!(UnixSecs);

/// A string identifier kind: reads as `&str`, compares with strings,
/// serializes as the bare string.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                $name(id.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl From<String> for $name {
            fn from(id: String) -> Self {
                $name(id)
            }
        }
        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                $name(id.to_owned())
            }
        }
        impl From<&String> for $name {
            fn from(id: &String) -> Self {
                $name(id.clone())
            }
        }
        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }
        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }
        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }
        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
    };
}

id_type!(
    /// An account: lowercase hex of the first 16 bytes of blake3(account_key).
    AccountId
);
id_type!(
    /// A message, unique per sending account (16–64 chars of `[A-Za-z0-9_-]`).
    MessageId
);
id_type!(
    /// A relay, as routes and peers name it.
    RelayId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_milliseconds_convert_without_mixing_units() {
        assert_eq!(UnixSecs(7).millis(), UnixMillis(7_000));
        assert_eq!(UnixMillis(7_999).secs(), UnixSecs(7));
        assert_eq!(UnixSecs(10).since(UnixSecs(12)), 0);
        assert_eq!(UnixMillis(u64::MAX).plus(1), UnixMillis(u64::MAX));
        assert!(UnixSecs(5) < 6 && 4 < UnixSecs(5));
    }

    #[test]
    fn newtypes_keep_the_bytes_of_what_they_wrap() {
        assert_eq!(serde_json::to_string(&UnixSecs(1_764_400_000)).unwrap(), "1764400000");
        assert_eq!(serde_json::to_string(&AccountId::new("ab")).unwrap(), "\"ab\"");
        let id: MessageId = serde_json::from_str("\"message-1\"").unwrap();
        assert_eq!(id, "message-1");
        assert_eq!(RelayId::from("relay-a").to_string(), "relay-a");
    }
}
