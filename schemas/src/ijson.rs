//! I-JSON checks (RFC 7493, which RFC 8785 requires) on protocol objects:
//! no member name twice in one object, and no integer beyond ±(2^53 − 1).
//!
//! Both matter for signatures: with a repeated member, parsers that keep
//! the first copy would read content the signature (computed over the last
//! copy) does not cover; and canonical JSON writes numbers as doubles, so
//! two integers above 2^53 could share one signature.

use serde::de::{DeserializeSeed, Error, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::cell::Cell;
use std::collections::HashSet;
use std::fmt;

/// The largest integer a double represents exactly, and so JCS keeps.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The checking visitor; with `BUILD` it also builds the value it checked
/// (one pass for both), otherwise it allocates nothing but member names.
struct Check<const BUILD: bool>;

type Out = Option<Value>;

impl<'de, const BUILD: bool> DeserializeSeed<'de> for Check<BUILD> {
    type Value = Out;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Out, D::Error> {
        d.deserialize_any(self)
    }
}

impl<const BUILD: bool> Check<BUILD> {
    fn out(v: impl FnOnce() -> Value) -> Out {
        BUILD.then(v)
    }
}

impl<'de, const BUILD: bool> Visitor<'de> for Check<BUILD> {
    type Value = Out;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("I-JSON")
    }
    fn visit_bool<E: Error>(self, v: bool) -> Result<Out, E> {
        Ok(Self::out(|| Value::Bool(v)))
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<Out, E> {
        if v > MAX_SAFE_INTEGER {
            return Err(E::custom(format!("integer {v} is beyond 2^53-1")));
        }
        Ok(Self::out(|| Value::from(v)))
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<Out, E> {
        if v.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(E::custom(format!("integer {v} is beyond 2^53-1")));
        }
        Ok(Self::out(|| Value::from(v)))
    }
    fn visit_f64<E: Error>(self, v: f64) -> Result<Out, E> {
        Ok(Self::out(|| Value::from(v)))
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<Out, E> {
        Ok(Self::out(|| Value::String(v.to_owned())))
    }
    fn visit_unit<E: Error>(self) -> Result<Out, E> {
        Ok(Self::out(|| Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Out, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(Check::<BUILD>)? {
            items.extend(v);
        }
        Ok(Self::out(|| Value::Array(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Out, A::Error> {
        let mut seen = HashSet::new();
        let mut members = Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !seen.insert(key.to_string()) {
                return Err(A::Error::custom(format!("member {key:?} appears twice")));
            }
            if let Some(v) = map.next_value_seed(Check::<BUILD>)? {
                members.insert(key.into_owned(), v);
            }
        }
        Ok(Self::out(|| Value::Object(members)))
    }
}

fn run<const BUILD: bool>(json: &str) -> Result<Out, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(json);
    let out = Check::<BUILD>.deserialize(&mut de)?;
    de.end()?;
    Ok(out)
}

/// Checks a JSON text: every object's member names distinct, every integer
/// within ±(2^53 − 1).
pub fn check(json: &str) -> Result<(), serde_json::Error> {
    run::<false>(json).map(|_| ())
}

/// [`check`] and the value, in one pass (for the params digest).
pub fn value(json: &str) -> Result<Value, serde_json::Error> {
    run::<true>(json).map(|v| v.unwrap_or(Value::Null))
}

thread_local! {
    static WITHIN_CHECKED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `parse` over a text that passed [`check`] (or [`value`]) whole:
/// the [`crate::objects::Wire`]s it reads skip their own check, which would only
/// repeat it. Sound because both checks are local to each object and
/// number, so every part of a checked text passes them too.
pub fn parse_checked<R>(parse: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            WITHIN_CHECKED.set(self.0);
        }
    }
    let _reset = Reset(WITHIN_CHECKED.replace(true));
    parse()
}

/// Whether the current thread is inside [`parse_checked`].
pub(crate) fn within_checked_text() -> bool {
    WITHIN_CHECKED.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_checked_marks_only_what_runs_inside_it_even_after_a_panic() {
        assert!(!within_checked_text());
        parse_checked(|| {
            assert!(within_checked_text());
            parse_checked(|| assert!(within_checked_text()));
            assert!(within_checked_text(), "a nested call restores the outer mark");
        });
        assert!(!within_checked_text());
        let panicked = std::panic::catch_unwind(|| parse_checked(|| panic!("a parse that panics")));
        assert!(panicked.is_err());
        assert!(!within_checked_text(), "the mark does not outlive a panic");
    }

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

    #[test]
    fn value_checks_and_builds_what_serde_json_builds() {
        let text = r#"{"a":[1,-2,2.5,"s",null,true,{"b":{}}],"c":"\u0061"}"#;
        assert_eq!(value(text).unwrap(), serde_json::from_str::<Value>(text).unwrap());
        assert!(value(r#"{"a":{"x":1,"x":1}}"#).is_err());
        assert!(value("9007199254740992").is_err());
    }
}
