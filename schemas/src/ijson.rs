//! I-JSON checks (RFC 7493, which RFC 8785 requires) on protocol objects:
//! no member name twice in one object, and no integer beyond ±(2^53 − 1).
//!
//! Both matter for signatures: with a repeated member, parsers that keep
//! the first copy would read content the signature (computed over the last
//! copy) does not cover; and canonical JSON writes numbers as doubles, so
//! two integers above 2^53 could share one signature.

use serde::de::{DeserializeSeed, Error, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;
use std::fmt;

/// The largest integer a double represents exactly, and so JCS keeps.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

struct Check;

impl<'de> DeserializeSeed<'de> for Check {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Check {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("I-JSON")
    }
    fn visit_bool<E: Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<(), E> {
        if v > MAX_SAFE_INTEGER {
            return Err(E::custom(format!("integer {v} is beyond 2^53-1")));
        }
        Ok(())
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<(), E> {
        if v.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(E::custom(format!("integer {v} is beyond 2^53-1")));
        }
        Ok(())
    }
    fn visit_f64<E: Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Check)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !seen.insert(key.to_string()) {
                return Err(A::Error::custom(format!("member {key:?} appears twice")));
            }
            map.next_value_seed(Check)?;
        }
        Ok(())
    }
}

/// Checks a JSON text: every object's member names distinct, every integer
/// within ±(2^53 − 1).
pub fn check(json: &str) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(json);
    Check.deserialize(&mut de)?;
    de.end()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_members_are_refused_at_any_depth() {
        assert!(check(r#"{"a":1,"b":{"c":[{"d":1,"e":2}]}}"#).is_ok());
        assert!(check(r#"{"a":1,"a":2}"#).is_err());
        assert!(check(r#"{"x":{"y":[{"z":1,"z":1}]}}"#).is_err());
        assert!(check(r#"{"a":1,"\u0061":2}"#).is_err(), "escapes name the same member");
    }

    #[test]
    fn integers_beyond_two_pow_53_are_refused() {
        assert!(check("9007199254740991").is_ok());
        assert!(check("-9007199254740991").is_ok());
        assert!(check("9007199254740992").is_err());
        assert!(check(r#"{"revision":1152921504606846976}"#).is_err());
        assert!(check("1e300").is_ok(), "non-integers are doubles already");
    }
}
