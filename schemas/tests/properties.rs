//! Property tests of the protocol vocabulary against hostile input.
//!
//! Nothing a client or a peer sends may panic the parsing, canonical JSON or
//! object checks, and every rejection is a `RelayError` with a code the
//! protocol gives for it. The request-parsing properties replicate
//! `relay::rpc::parse` / `params_digest` (crate-private) with the same public
//! types; the root crate's `tests/it/properties.rs` sends the same kinds of
//! bodies to a real relay.
//!
//! Cases per property (default; `PROPTEST_CASES=N` overrides every one):
//! base64url and identifiers 1000 each, canonical JSON 1000 each (order and
//! whitespace 500, structure 500), request parsing 1000 (bytes and JSON
//! values) and 300 (mutated valid params, digest spelling), signed-object
//! mutation and respelling 256 each, domain tags 1000 (signed bytes) and
//! 128 (with Ed25519, slow in debug builds), public keys 1000, nesting
//! depth 64.

use proptest::prelude::*;
use proptest::test_runner::Config;
use relay_schemas::client::{Account, Device};
use relay_schemas::encoding::{
    b64_decode, b64_decode_array, b64_decoded_len, b64_encode, jcs, jcs_digest, jcs_object_without,
};
use relay_schemas::ids::{account_id_of, check_account_id, check_id, check_message_id, check_relay_id};
use relay_schemas::methods::*;
use relay_schemas::objects::*;
use relay_schemas::sign::{parse_public_key, sign_object, signed_bytes, verify_object, Tag};
use relay_schemas::{ErrorCode, RelayError, UnixSecs};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Map, Number, Value};

/// `cases` unless `PROPTEST_CASES` is set; no regression files in the tree
/// (a failure prints its minimal input).
fn config(cases: u32) -> Config {
    let mut c = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    c.failure_persistence = None;
    c
}

// The params harness (parsing, stateless checks, valid params of every
// method) is shared with the fuzz targets in `fuzz/`.
#[path = "common/params.rs"]
mod params;
use params::*;

// ---- strategies -----------------------------------------------------------------------------

/// Numbers of every kind serde_json holds, with the awkward ones weighted up.
fn arb_number() -> impl Strategy<Value = Number> {
    prop_oneof![
        any::<u64>().prop_map(Number::from),
        any::<i64>().prop_map(Number::from),
        (0u64..10_000).prop_map(Number::from),
        // Either side of the largest integer a double holds exactly.
        prop::sample::select(vec![(1i64 << 53) - 1, 1 << 53, (1 << 53) + 1, -(1 << 53), -(1 << 53) - 1])
            .prop_map(Number::from),
        any::<f64>().prop_filter_map("finite", Number::from_f64),
        prop::sample::select(vec![
            0.0,
            -0.0,
            0.5,
            -1.5,
            1e21,
            1e-7,
            1e-6,
            123456789012345680000.0,
            5e-324,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
            f64::EPSILON,
            9007199254740991.0,
            9007199254740992.0,
            18446744073709551616.0,
        ])
        .prop_filter_map("finite", Number::from_f64),
        prop::sample::select(vec![u64::MAX, (1 << 53) - 1, 1 << 53, (1 << 53) + 1, 1 << 63]).prop_map(Number::from),
        prop::sample::select(vec![i64::MIN, -(1 << 53) - 1, -1]).prop_map(Number::from),
    ]
}

/// Strings with control characters, quotes, backslashes, non-BMP and
/// combining characters, and arbitrary Unicode.
fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,6}",
        any::<String>(),
        "[\\x00-\\x1f\"\\\\/\\x7f\u{80}\u{a0}\u{2028}\u{2029}\u{fffd}\u{ffff}a-z]{0,10}",
        prop::sample::select(vec![
            "\u{1F600}",
            "\u{10FFFF}",
            "\u{E000}",
            "\u{FB33}",
            "e\u{301}",
            "\u{e9}",
            "\u{20ac}",
            "\u{10000}",
            "",
        ])
        .prop_map(String::from),
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number().prop_map(Value::Number),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((arb_string(), inner), 0..8).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((arb_string(), arb_json()), 0..8).prop_map(|m| m.into_iter().collect())
}

/// Bytes that are often almost JSON: a soup of JSON tokens, or raw bytes.
fn arb_body() -> impl Strategy<Value = Vec<u8>> {
    let token = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"",
        "\\",
        "\\u",
        "\\ud800",
        "\\udc00",
        "0",
        "-",
        "1e999",
        "-0",
        "1.5e-400",
        "18446744073709551616",
        "null",
        "true",
        "tru",
        " ",
        "\n",
        "\t",
        "\u{feff}",
        "\u{0}",
        "\"account_id\"",
        "\"envelope\"",
        "\"after\"",
        "\"through\"",
        "\"route\"",
        "\"signature\"",
        "\"a\"",
        "\"\u{1F600}\"",
        "\u{ff}",
    ]);
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        prop::collection::vec(token, 0..40).prop_map(|t| t.concat().into_bytes()),
        arb_json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
    ]
}

// ---- base64url and identifiers ---------------------------------------------------------------

/// RFC 4648 §5 without padding, strict: no `=`, no other alphabet, and the
/// unused low bits of the last character must be zero (one encoding per
/// value).
fn reference_b64url(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = s.as_bytes();
    if bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3 + 2);
    for chunk in bytes.chunks(4) {
        let mut acc: u32 = 0;
        for &c in chunk {
            acc = (acc << 6) | val(c)?;
        }
        match chunk.len() {
            4 => out.extend_from_slice(&[(acc >> 16) as u8, (acc >> 8) as u8, acc as u8]),
            3 if acc & 0b11 == 0 => out.extend_from_slice(&[(acc >> 10) as u8, (acc >> 2) as u8]),
            2 if acc & 0b1111 == 0 => out.push((acc >> 4) as u8),
            _ => return None,
        }
    }
    Some(out)
}

fn arb_b64ish() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_\\-]{0,24}",
        "[A-Za-z0-9_\\-=+/. \n\u{e9}\u{1F600}]{0,24}",
        any::<String>(),
        // A valid encoding with one character replaced.
        (prop::collection::vec(any::<u8>(), 1..40), any::<prop::sample::Index>(), any::<char>()).prop_map(
            |(b, i, c)| {
                let mut chars: Vec<char> = b64_encode(&b).chars().collect();
                let n = i.index(chars.len());
                chars[n] = c;
                chars.into_iter().collect()
            }
        ),
    ]
}

proptest! {
    #![proptest_config(config(1000))]

    /// `b64_decode` accepts exactly what a strict RFC 4648 §5 decoder
    /// accepts, with the same bytes; every rejection is `invalid_params`.
    #[test]
    fn base64url_decoding_agrees_with_a_strict_reference_decoder(s in arb_b64ish()) {
        let got = b64_decode("f", &s);
        match (&got, reference_b64url(&s)) {
            (Ok(a), Some(b)) => prop_assert_eq!(a, &b),
            (Err(e), None) => prop_assert_eq!(e.code, ErrorCode::InvalidParams),
            (got, want) => prop_assert!(false, "{s:?}: got {got:?}, reference {want:?}"),
        }
        // The size pre-check never disagrees with decoding.
        match (b64_decoded_len(&s), &got) {
            (Some(n), Ok(bytes)) => prop_assert_eq!(n, bytes.len()),
            (None, Ok(_)) => prop_assert!(false, "{s:?}: decodes but has no decoded length"),
            _ => {}
        }
        let arr: Result<[u8; 32], RelayError> = b64_decode_array("f", &s);
        match arr {
            Ok(a) => prop_assert_eq!(Some(a.to_vec()), reference_b64url(&s)),
            Err(e) => prop_assert_eq!(e.code, ErrorCode::InvalidParams),
        }
    }

    /// Encoding then decoding gives the bytes back; the encoding is the
    /// reference's only accepted spelling of them.
    #[test]
    fn base64url_round_trips_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let s = b64_encode(&bytes);
        prop_assert!(!s.contains('=') && !s.contains('+') && !s.contains('/'));
        prop_assert_eq!(b64_decode("f", &s).unwrap(), bytes.clone());
        prop_assert_eq!(b64_decoded_len(&s), Some(bytes.len()));
        prop_assert_eq!(reference_b64url(&s), Some(bytes));
    }

    /// Identifier checks agree with the PROTOCOL §1 regexes and reject with
    /// `invalid_params` only.
    #[test]
    fn identifier_checks_agree_with_the_protocol_regexes(s in prop_oneof![
        "[A-Za-z0-9_\\-.]{0,70}",
        "[0-9a-fA-F]{30,34}",
        "[a-z0-9.\\-]{0,66}",
        "[A-Za-z0-9_\\- .\n\u{0}\u{e9}\u{130}\u{212a}\u{17f}\u{ff10}]{0,70}",
        any::<String>(),
    ]) {
        use std::sync::OnceLock;
        static RES: OnceLock<[regex::Regex; 4]> = OnceLock::new();
        let [id, message, account, relay] = RES.get_or_init(|| {
            [
                regex::Regex::new(r"\A[A-Za-z0-9_-]{1,64}\z").unwrap(),
                regex::Regex::new(r"\A[A-Za-z0-9_-]{16,64}\z").unwrap(),
                regex::Regex::new(r"\A[0-9a-f]{32}\z").unwrap(),
                regex::Regex::new(r"\A[a-z0-9.-]{1,64}\z").unwrap(),
            ]
        });
        for (name, check, re) in [
            ("device_id", check_id as fn(&str, &str) -> Result<(), RelayError>, id),
            ("message_id", check_message_id, message),
            ("account_id", check_account_id, account),
            ("relay_id", check_relay_id, relay),
        ] {
            let got = check(name, &s);
            prop_assert_eq!(got.is_ok(), re.is_match(&s), "{} {:?}", name, s);
            if let Err(e) = got {
                prop_assert_eq!(e.code, ErrorCode::InvalidParams);
            }
        }
    }

    /// An `account_id` is bound to its key: only the key's own id checks out.
    #[test]
    fn account_id_derives_only_from_its_own_key(seed in any::<[u8; 32]>(), other in any::<[u8; 32]>()) {
        let a = Account::from_seed(seed);
        prop_assert_eq!(&a.id, &account_id_of(a.key.verifying_key().as_bytes()));
        check_account_id("a", &a.id).unwrap();
        if seed != other {
            prop_assert_ne!(a.id, Account::from_seed(other).id);
        }
    }
}

// ---- canonical JSON -------------------------------------------------------------------------

/// A tiny LCG for deterministic shuffles and whitespace from a proptest seed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Serializes `v` as valid JSON that means the same value but is spelled
/// differently: members shuffled, whitespace everywhere, characters escaped
/// as `\uXXXX` (surrogate pairs for non-BMP), numbers in other notations.
fn respell(v: &Value, rng: &mut Lcg, out: &mut String) {
    respell_with(v, rng, true, out)
}

/// [`respell`]; numbers keep serde_json's spelling unless `numbers`.
fn respell_with(v: &Value, rng: &mut Lcg, numbers: bool, out: &mut String) {
    fn ws(rng: &mut Lcg, out: &mut String) {
        for _ in 0..rng.below(3) {
            out.push([' ', '\n', '\t', '\r'][rng.below(4)]);
        }
    }
    fn string(s: &str, rng: &mut Lcg, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            let must = c == '"' || c == '\\' || (c as u32) < 0x20;
            if must || rng.below(4) == 0 {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    if rng.below(2) == 0 {
                        out.push_str(&format!("\\u{u:04x}"));
                    } else {
                        out.push_str(&format!("\\u{u:04X}"));
                    }
                }
            } else {
                out.push(c);
            }
        }
        out.push('"');
    }
    ws(rng, out);
    match v {
        Value::Null | Value::Bool(_) => out.push_str(&v.to_string()),
        Value::Number(n) if !numbers => out.push_str(&n.to_string()),
        Value::Number(n) => {
            let f = n.as_f64().unwrap();
            match rng.below(3) {
                // serde_json's own spelling (exact for integers)
                0 => out.push_str(&n.to_string()),
                // shortest round-trip exponent form of the double
                1 => out.push_str(&format!("{f:e}")),
                // a decimal point and trailing zeros where integral
                _ if n.is_u64() && f < 1e15 => out.push_str(&format!("{}.000", n.as_u64().unwrap())),
                _ => out.push_str(&format!("{f:E}")),
            }
        }
        Value::String(s) => string(s, rng, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                respell_with(x, rng, numbers, out);
            }
            ws(rng, out);
            out.push(']');
        }
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            for i in (1..members.len()).rev() {
                members.swap(i, rng.below(i + 1));
            }
            out.push('{');
            for (i, (k, x)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(rng, out);
                string(k, rng, out);
                ws(rng, out);
                out.push(':');
                respell_with(x, rng, numbers, out);
            }
            ws(rng, out);
            out.push('}');
        }
    }
    ws(rng, out);
}

/// An independent RFC 8785 serializer for everything but number formatting
/// (which the 100k ES6 vectors of `canonical_json.rs` cover): the escaping
/// rules of §3.2.2.2 and member order by UTF-16 code units (§3.2.3).
fn reference_jcs(v: &Value, out: &mut String) {
    fn string(s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    match v {
        Value::Null | Value::Bool(_) => out.push_str(&v.to_string()),
        Value::Number(n) => out.push_str(std::str::from_utf8(&jcs(&n.as_f64().unwrap()).unwrap()).unwrap()),
        Value::String(s) => string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                reference_jcs(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut members: Vec<(&String, &Value)> = m.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, x)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                string(k, out);
                out.push(':');
                reference_jcs(x, out);
            }
            out.push('}');
        }
    }
}

/// Equal as JSON values once every number is read as an IEEE double (what
/// RFC 8785 compares).
fn same_as_doubles(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_as_doubles(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same_as_doubles(p, q)))
        }
        _ => a == b,
    }
}

proptest! {
    #![proptest_config(config(1000))]

    /// JCS never fails or panics on a JSON value, is deterministic, and its
    /// output is UTF-8 JSON meaning the same value (numbers as doubles).
    #[test]
    fn canonical_json_is_deterministic_and_means_the_same_value(v in arb_json()) {
        let a = jcs(&v).expect("every JSON value canonicalizes");
        prop_assert_eq!(&a, &jcs(&v).unwrap());
        prop_assert_eq!(jcs_digest(&v).unwrap(), *blake3::hash(&a).as_bytes());
        let text = std::str::from_utf8(&a).expect("JCS output is UTF-8");
        let back: Value = serde_json::from_str(text).expect("JCS output is JSON");
        prop_assert!(same_as_doubles(&back, &v), "{} vs {}", text, v);
    }

    /// jcs(parse(jcs(v))) == jcs(v).
    #[test]
    fn canonical_json_is_idempotent(v in arb_json()) {
        let once = jcs(&v).unwrap();
        let parsed: Value = serde_json::from_slice(&once).unwrap();
        prop_assert_eq!(jcs(&parsed).unwrap(), once);
    }

    /// Arbitrary bytes: whatever serde_json accepts canonicalizes, and the
    /// result is a fixed point.
    #[test]
    fn canonical_json_of_any_parsable_bytes_never_panics(body in arb_body()) {
        if let Ok(v) = serde_json::from_slice::<Value>(&body) {
            let once = jcs(&v).unwrap();
            let again: Value = serde_json::from_slice(&once).unwrap();
            prop_assert_eq!(jcs(&again).unwrap(), once);
        }
    }
}

proptest! {
    #![proptest_config(config(500))]

    /// Member order, whitespace, `\u` escapes and number notation do not
    /// change the canonical bytes.
    #[test]
    fn canonical_json_is_independent_of_member_order_whitespace_and_escapes(v in arb_json(), seed in any::<u64>()) {
        let mut text = String::new();
        respell(&v, &mut Lcg(seed), &mut text);
        let reparsed: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(
            String::from_utf8(jcs(&reparsed).unwrap()).unwrap(),
            String::from_utf8(jcs(&v).unwrap()).unwrap(),
            "respelled as {}", text
        );
    }

    /// Escaping and member order match an independent RFC 8785 serializer.
    #[test]
    fn canonical_json_matches_a_reference_for_strings_and_member_order(v in arb_json()) {
        let mut want = String::new();
        reference_jcs(&v, &mut want);
        prop_assert_eq!(String::from_utf8(jcs(&v).unwrap()).unwrap(), want);
    }

    /// The relay's own JCS writer (every value whose numbers are integers
    /// within ±2^53; the rest falls back to the library) writes exactly what
    /// the `serde_json_canonicalizer` crate writes, and a signed object's
    /// bytes are JCS of the object without its `signature`.
    #[test]
    fn canonical_json_is_byte_identical_to_serde_json_canonicalizer(v in arb_json(), mut o in arb_object(), sig in any::<bool>()) {
        prop_assert_eq!(jcs(&v).unwrap(), serde_json_canonicalizer::to_vec(&v).unwrap());
        if sig {
            o.insert("signature".into(), Value::String("c2ln".into()));
        }
        let mut without = o.clone();
        without.remove("signature");
        prop_assert_eq!(jcs_object_without(&o, "signature").unwrap(), serde_json_canonicalizer::to_vec(&without).unwrap());
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Nesting deeper than serde_json's limit is a parse error
    /// (`invalid_params`), never a stack overflow, at every place a client
    /// can put it.
    #[test]
    fn deeply_nested_json_is_invalid_params_not_a_stack_overflow(depth in 1usize..20_000, obj in any::<bool>()) {
        let (open, close) = if obj { ("{\"a\":", "}") } else { ("[", "]") };
        let nested = format!("{}0{}", open.repeat(depth), close.repeat(depth));
        // (body, nesting levels around `nested`)
        for (body, around) in [
            (format!("{{\"after\":0,\"x\":{nested}}}"), 1),
            (format!("{{\"envelope\":{{\"x\":{nested}}},\"recipient_boxes\":[]}}"), 2),
            (nested.clone(), 0),
        ] {
            let s = parse::<SendParams>(body.as_bytes());
            let r = parse::<SyncParams>(body.as_bytes());
            let d = params_digest(body.as_bytes());
            // serde_json's recursion limit: 128 levels. (Skipping an unknown
            // member is iterative and has no limit: `r` may succeed.)
            if depth + around > 128 {
                for e in [s.unwrap_err(), d.unwrap_err()] {
                    prop_assert_eq!(e.code, ErrorCode::InvalidParams);
                }
            }
            if let Err(e) = r {
                prop_assert_eq!(e.code, ErrorCode::InvalidParams);
            }
        }
        if let Ok(v) = serde_json::from_str::<Value>(&nested) {
            jcs(&v).unwrap();
        }
    }
}

#[test]
fn every_valid_params_object_passes_its_checks() {
    for m in METHODS {
        call(m, &serde_json::to_vec(&valid_params(m)).unwrap()).unwrap_or_else(|e| panic!("{m}: {e}"));
    }
}

// ---- mutations ------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// Every place in a value (members and elements, at any depth).
fn places(v: &Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                here.push(Step::Key(k.clone()));
                out.push(here.clone());
                places(x, here, out);
                here.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                here.push(Step::Index(i));
                out.push(here.clone());
                places(x, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

fn at_mut<'a>(v: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// A change at one place of a value.
#[derive(Clone, Debug)]
enum Op {
    Remove,
    Replace(Value),
    /// Numbers: add this; strings: edit at this position.
    Nudge(i64, usize, char),
    /// Add a sibling member (or element).
    Insert(String, Value),
    Rename(String),
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "signature",
            "account_id",
            "account_key",
            "device_id",
            "device_key",
            "box_key",
            "issued_at",
            "expires_at",
            "revision",
            "relays",
            "id",
            "url",
            "message_id",
            "from",
            "from_device_id",
            "to",
            "created_at",
            "ciphertext",
            "box",
            "grant_id",
            "grantor",
            "grantee",
            "invite_id",
            "issuer",
            "revoked_at",
            "contact_grant",
            "contact_invite",
            "x-ext",
            "",
        ])
        .prop_map(String::from),
        arb_string(),
    ]
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Remove),
        2 => arb_json().prop_map(Op::Replace),
        3 => (prop_oneof![-2i64..=2, any::<i64>(), Just(1i64 << 53)], any::<usize>(), any::<char>())
            .prop_map(|(d, i, c)| Op::Nudge(d, i, c)),
        1 => (arb_key(), arb_json()).prop_map(|(k, v)| Op::Insert(k, v)),
        1 => arb_key().prop_map(Op::Rename),
    ]
}

fn nudge_string(s: &str, i: usize, c: char) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    match i % 4 {
        0 if !chars.is_empty() => {
            let n = i / 4 % chars.len();
            chars[n] = c;
        }
        1 => chars.insert(i / 4 % (chars.len() + 1), c),
        2 if !chars.is_empty() => {
            chars.remove(i / 4 % chars.len());
        }
        _ => return s.to_ascii_uppercase(),
    }
    chars.into_iter().collect()
}

/// Applies `op` at the place chosen by `pick` (or at the top level when
/// the value has no places).
fn mutate(v: &mut Value, pick: prop::sample::Index, op: &Op) {
    let mut all = Vec::new();
    places(v, &mut Vec::new(), &mut all);
    let Some(path) = (!all.is_empty()).then(|| all[pick.index(all.len())].clone()) else {
        if let (Op::Insert(k, x), Value::Object(m)) = (op, &mut *v) {
            m.insert(k.clone(), x.clone());
        }
        return;
    };
    let (last, parent_path) = path.split_last().unwrap();
    match op {
        Op::Replace(x) => *at_mut(v, &path) = x.clone(),
        Op::Nudge(d, i, c) => {
            let target = at_mut(v, &path);
            *target = match &*target {
                Value::Number(n) if n.is_u64() => json!(n.as_u64().unwrap().wrapping_add_signed(*d)),
                Value::Number(n) if n.is_i64() => json!(n.as_i64().unwrap().wrapping_add(*d)),
                Value::Number(n) => json!(n.as_f64().unwrap() + *d as f64),
                Value::String(s) => json!(nudge_string(s, *i, *c)),
                Value::Bool(b) => json!(!b),
                other => other.clone(),
            };
        }
        Op::Remove | Op::Insert(..) | Op::Rename(_) => {
            let parent = at_mut(v, parent_path);
            match (parent, last) {
                (Value::Object(m), Step::Key(k)) => match op {
                    Op::Remove => drop(m.remove(k)),
                    Op::Insert(nk, x) => drop(m.insert(nk.clone(), x.clone())),
                    Op::Rename(nk) => {
                        if let Some(x) = m.remove(k) {
                            m.insert(nk.clone(), x);
                        }
                    }
                    _ => unreachable!(),
                },
                (Value::Array(a), Step::Index(i)) => match op {
                    Op::Remove => drop(a.remove(*i)),
                    Op::Insert(_, x) => a.insert(*i, x.clone()),
                    _ => {}
                },
                _ => unreachable!(),
            }
        }
    }
}

fn arb_mutations() -> impl Strategy<Value = Vec<(prop::sample::Index, Op)>> {
    prop::collection::vec((any::<prop::sample::Index>(), arb_op()), 1..4)
}

proptest! {
    #![proptest_config(config(1000))]

    /// Arbitrary bytes as the body of every method: never a panic, and every
    /// failure is `invalid_params` (or, for the rare body that parses, a
    /// content error of the protocol).
    #[test]
    fn params_of_every_method_from_arbitrary_bytes_fail_only_with_protocol_errors(body in arb_body()) {
        let is_object = serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.is_object());
        for m in METHODS {
            if let Err(e) = call(m, &body) {
                prop_assert!(is_content_error(e.code), "{m}: {e}");
                if !is_object {
                    prop_assert_eq!(e.code, ErrorCode::InvalidParams, "{}", m);
                }
            }
        }
    }

    /// Arbitrary JSON objects and non-objects as params.
    #[test]
    fn params_of_every_method_from_arbitrary_json_fail_only_with_protocol_errors(
        v in prop_oneof![arb_object().prop_map(Value::Object), arb_json()],
    ) {
        let body = serde_json::to_vec(&v).unwrap();
        for m in METHODS {
            if let Err(e) = call(m, &body) {
                prop_assert!(is_content_error(e.code), "{m}: {e}");
                if !v.is_object() {
                    prop_assert_eq!(e.code, ErrorCode::InvalidParams, "{}", m);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(config(300))]

    /// Valid params with members removed, replaced, nudged, added or renamed
    /// at any depth: never a panic, only protocol errors; and the digest
    /// changes exactly when the canonical JSON does.
    #[test]
    fn mutated_valid_params_of_every_method_fail_only_with_protocol_errors(
        method in prop::sample::select(METHODS),
        muts in arb_mutations(),
    ) {
        let original = valid_params(method);
        let mut v = original.clone();
        for (pick, op) in &muts {
            mutate(&mut v, *pick, op);
        }
        let body = serde_json::to_vec(&v).unwrap();
        if let Err(e) = call(method, &body) {
            prop_assert!(is_content_error(e.code), "{method}: {e} for {v}");
        }
        if v.is_object() {
            let same = jcs(&v).unwrap() == jcs(&original).unwrap();
            let d = params_digest(&body).unwrap();
            prop_assert_eq!(same, d == params_digest(&serde_json::to_vec(&original).unwrap()).unwrap());
        }
    }

    /// The idempotency digest of a params object does not depend on how it
    /// is spelled.
    #[test]
    fn params_digest_is_independent_of_spelling(
        method in prop::sample::select(METHODS),
        seed in any::<u64>(),
        numbers in any::<bool>(),
    ) {
        let v = valid_params(method);
        let mut text = String::new();
        respell_with(&v, &mut Lcg(seed), numbers, &mut text);
        let want = params_digest(&serde_json::to_vec(&v).unwrap()).unwrap();
        prop_assert_eq!(params_digest(text.as_bytes()).unwrap(), want);
        match call(method, text.as_bytes()) {
            Ok(()) => {}
            // `1e9` or `3.000` is a float to serde, not an integer member.
            Err(e) if numbers && e.code == ErrorCode::InvalidParams && e.message.contains("floating point") => {}
            Err(e) => prop_assert!(false, "{}: {}", e, text),
        }
    }
}

// ---- signed objects -------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Kind {
    Route,
    Certificate,
    Revocation,
    Envelope,
    Grant,
    Invite,
}

const KINDS: [Kind; 6] = [Kind::Route, Kind::Certificate, Kind::Revocation, Kind::Envelope, Kind::Grant, Kind::Invite];

impl Kind {
    fn tag(self) -> Tag {
        match self {
            Kind::Route => Tag::Route,
            Kind::Certificate => Tag::DeviceCertificate,
            Kind::Revocation => Tag::DeviceRevocation,
            Kind::Envelope => Tag::Envelope,
            Kind::Grant => Tag::ContactGrant,
            Kind::Invite => Tag::ContactInvite,
        }
    }
}

/// Parameters of a valid object: keys, ids and times.
#[derive(Clone, Debug)]
struct Made {
    account_seed: [u8; 32],
    device_seed: [u8; 32],
    device_id: String,
    id: String,
    revision: u64,
    issued: u64,
    expires: Option<u64>,
    ciphertext: Vec<u8>,
    relays: Vec<(String, String)>,
    extra: Option<(String, Value)>,
}

fn arb_made() -> impl Strategy<Value = Made> {
    (
        any::<[u8; 32]>(),
        any::<[u8; 32]>(),
        "[A-Za-z0-9_-]{1,64}",
        "[A-Za-z0-9_-]{16,64}",
        // I-JSON integers: above 2^53 JCS cannot tell neighbours apart (see
        // the test at the end).
        0u64..(1 << 53),
        (NOW - 10_000)..(NOW + TOLERANCE),
        prop::option::of((NOW + 1)..(NOW + 1_000_000)),
        prop::collection::vec(any::<u8>(), 1..64),
        // A route's relay URL is http(s) with a host, without spaces (objects.rs).
        prop::collection::vec(("[a-z0-9.-]{1,64}", "https?://[a-z0-9.-][!-~]{0,36}"), 1..=2),
        prop::option::of(("x-[a-z]{1,8}", arb_json())),
    )
        .prop_map(|(account_seed, device_seed, device_id, id, revision, issued, expires, ciphertext, relays, extra)| {
            Made { account_seed, device_seed, device_id, id, revision, issued, expires, ciphertext, relays, extra }
        })
        .prop_filter("distinct relay ids", |m| m.relays.len() == 1 || m.relays[0].0 != m.relays[1].0)
        // Valid objects are I-JSON: an unknown member with an integer beyond
        // 2^53 is refused (a_signed_integer_above_2_pow_53_… shows why).
        .prop_filter("I-JSON extra member", |m| {
            m.extra.as_ref().is_none_or(|(_, v)| relay_schemas::ijson::check(&v.to_string()).is_ok())
        })
}

impl Made {
    fn account(&self) -> Account {
        Account::from_seed(self.account_seed)
    }
    fn device(&self) -> Device {
        Device::from_seed(&self.device_id, self.device_seed)
    }
    fn grantee(&self) -> String {
        Account::from_seed(self.device_seed).id
    }

    /// The object, with `extra` (an unknown member) covered by the signature.
    fn object(&self, kind: Kind) -> Value {
        let a = self.account();
        let d = self.device();
        let relays: Vec<(&str, &str)> = self.relays.iter().map(|(i, u)| (i.as_str(), u.as_str())).collect();
        let mut v = match kind {
            Kind::Route => a.route(self.revision, &relays, self.issued),
            Kind::Certificate => a.certificate(&d, self.issued, self.expires),
            Kind::Revocation => a.revocation(&self.device_id, self.issued),
            Kind::Envelope => d.envelope(&a.id, &self.grantee(), &self.id, self.issued, &self.ciphertext),
            Kind::Grant => a.grant(&self.device_id, &self.grantee(), self.issued, self.expires),
            Kind::Invite => a.invite(&self.device_id, self.issued, self.expires.unwrap_or(NOW + 1)),
        };
        if let Some((k, x)) = &self.extra {
            let key = match kind {
                Kind::Envelope => &d.key,
                _ => &a.key,
            };
            let mut m = v.as_object().unwrap().clone();
            m.insert(k.clone(), x.clone());
            sign_object(kind.tag(), &mut m, key);
            v = Value::Object(m);
        }
        v
    }

    /// Parses `text` as `kind` and runs every stateless check the relay
    /// applies to it; returns the typed view.
    fn check(&self, kind: Kind, text: &str) -> Result<Value, RelayError> {
        fn wire<T: DeserializeOwned>(text: &str) -> Result<Wire<T>, RelayError> {
            Wire::parse(text).map_err(|e| RelayError::invalid_params(e.to_string()))
        }
        fn typed<T: Serialize>(w: &Wire<T>) -> Value {
            serde_json::to_value(&**w).unwrap()
        }
        let a = self.account();
        let ak = a.key.verifying_key();
        match kind {
            Kind::Route => {
                let w = wire::<Route>(text)?;
                w.check(UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES)?;
                Ok(typed(&w))
            }
            Kind::Certificate => {
                let w = wire::<DeviceCertificate>(text)?;
                w.check(UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES)?;
                Ok(typed(&w))
            }
            Kind::Revocation => {
                let w = wire::<DeviceRevocation>(text)?;
                w.check(&ak, MAX_OBJECT_BYTES)?;
                if w.account_id != a.id {
                    return Err(RelayError::forbidden("another account's revocation"));
                }
                Ok(typed(&w))
            }
            Kind::Envelope => {
                let w = wire::<MessageEnvelope>(text)?;
                w.check_constraints(MAX_CIPHERTEXT)?;
                w.verify(Tag::Envelope, &self.device().key.verifying_key())?;
                Ok(typed(&w))
            }
            Kind::Grant => {
                let w = wire::<ContactGrant>(text)?;
                let t = typed(&w);
                Authorization::ContactGrant(w).check(
                    &self.grantee(),
                    &a.id,
                    &ak,
                    UnixSecs(NOW),
                    TOLERANCE,
                    MAX_OBJECT_BYTES,
                )?;
                Ok(t)
            }
            Kind::Invite => {
                let w = wire::<ContactInvite>(text)?;
                let t = typed(&w);
                Authorization::ContactInvite(w).check(
                    &self.grantee(),
                    &a.id,
                    &ak,
                    UnixSecs(NOW),
                    TOLERANCE,
                    MAX_OBJECT_BYTES,
                )?;
                Ok(t)
            }
        }
    }
}

fn as_map(v: &Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

proptest! {
    #![proptest_config(config(256))]

    /// A mutated signed object either fails with a protocol code or still
    /// verifies only because nothing the signature covers changed: same
    /// signed bytes, same signature, same typed view.
    #[test]
    fn mutated_signed_objects_verify_only_when_unchanged_under_jcs(
        made in arb_made(),
        kind in prop::sample::select(KINDS.to_vec()),
        muts in arb_mutations(),
        respelled in any::<Option<u64>>(),
    ) {
        let original = made.object(kind);
        let want = made.check(kind, &original.to_string()).expect("the unmutated object is valid");
        let mut v = original.clone();
        for (pick, op) in &muts {
            mutate(&mut v, *pick, op);
        }
        let text = match respelled {
            Some(seed) => {
                let mut t = String::new();
                respell(&v, &mut Lcg(seed), &mut t);
                t
            }
            None => v.to_string(),
        };
        match made.check(kind, &text) {
            Ok(got) => {
                prop_assert_eq!(
                    signed_bytes(kind.tag(), &as_map(&v)).ok(),
                    signed_bytes(kind.tag(), &as_map(&original)).ok(),
                    "verified with other signed bytes: {}", text
                );
                prop_assert_eq!(&v["signature"], &original["signature"]);
                prop_assert_eq!(got, want, "verified with another typed view: {}", text);
            }
            Err(e) => prop_assert!(is_content_error(e.code), "{kind:?}: {e} for {text}"),
        }
    }

    /// Spelling a valid object differently (member order, whitespace,
    /// escapes, number notation) keeps it valid.
    #[test]
    fn respelled_signed_objects_still_verify(made in arb_made(), kind in prop::sample::select(KINDS.to_vec()), seed in any::<u64>()) {
        let v = made.object(kind);
        let mut text = String::new();
        respell(&v, &mut Lcg(seed), &mut text);
        let r = made.check(kind, &text);
        // `1e9` or `1.000` is not an integer to the typed view: a type
        // error, which is `invalid_params`; anything else must verify.
        match r {
            Ok(got) => prop_assert_eq!(got, made.check(kind, &v.to_string()).unwrap()),
            Err(e) => prop_assert!(e.code == ErrorCode::InvalidParams && e.message.contains("floating point"), "{e}: {text}"),
        }
    }
}

const TAGS: [Tag; 9] = [
    Tag::DeviceCertificate,
    Tag::DeviceRevocation,
    Tag::Route,
    Tag::Envelope,
    Tag::ContactGrant,
    Tag::ContactInvite,
    Tag::Session,
    Tag::Registration,
    Tag::RelayRequest,
];

/// One valid object of each kind (signing is slow in debug builds).
fn fixed_objects() -> &'static (Made, Vec<Value>) {
    static O: std::sync::OnceLock<(Made, Vec<Value>)> = std::sync::OnceLock::new();
    O.get_or_init(|| {
        let made = Made {
            account_seed: [5; 32],
            device_seed: [6; 32],
            device_id: "phone".into(),
            id: "msg-0000000000000001".into(),
            revision: 3,
            issued: NOW,
            expires: Some(NOW + 60),
            ciphertext: b"ciphertext".to_vec(),
            relays: vec![("relay-a".into(), "https://a".into())],
            extra: Some(("x-ext".into(), json!({"n": 1.5}))),
        };
        let objects = KINDS.iter().map(|k| made.object(*k)).collect();
        (made, objects)
    })
}

proptest! {
    #![proptest_config(config(1000))]

    /// The bytes signed under two domain tags never coincide, for any
    /// object, nor with any relay-request's signed bytes.
    #[test]
    fn signed_bytes_under_distinct_domain_tags_never_coincide(
        obj in arb_object(),
        method in "[a-z./\\n]{0,24}",
        target in "[a-z0-9.\\n-]{0,24}",
        timestamp in any::<u64>(),
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let signed: Vec<Vec<u8>> = TAGS.iter().map(|t| signed_bytes(*t, &obj).unwrap()).collect();
        let relay = relay_schemas::sign::relay_request_bytes(&method, &target, timestamp, &body);
        for (i, a) in signed.iter().enumerate() {
            let prefix = format!("{}\n", TAGS[i].as_str());
            prop_assert!(a.starts_with(prefix.as_bytes()), "{:?}", prefix);
            prop_assert_ne!(a, &relay);
            for b in &signed[i + 1..] {
                prop_assert_ne!(a, b);
            }
        }
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// A signature over one domain tag never verifies under another, for an
    /// arbitrary object and for each real object kind re-signed by its
    /// rightful key under a foreign tag.
    #[test]
    fn a_signature_over_one_domain_tag_never_verifies_under_another(
        seed in any::<[u8; 32]>(),
        obj in arb_object(),
        signer in 0..TAGS.len(),
        shift in 1..TAGS.len(),
        kind in 0..KINDS.len(),
    ) {
        let verifier = TAGS[(signer + shift) % TAGS.len()];
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        let mut o = obj.clone();
        sign_object(TAGS[signer], &mut o, &key);
        let e = verify_object(verifier, &o, &key.verifying_key()).unwrap_err();
        prop_assert_eq!(e.code, ErrorCode::InvalidSignature);

        let (made, objects) = fixed_objects();
        let k = KINDS[kind];
        let foreign = TAGS[(TAGS.iter().position(|t| *t == k.tag()).unwrap() + shift) % TAGS.len()];
        let rightful = match k {
            Kind::Envelope => made.device().key,
            _ => made.account().key,
        };
        let mut m = as_map(&objects[kind]);
        sign_object(foreign, &mut m, &rightful);
        let e = made.check(k, &Value::Object(m).to_string()).unwrap_err();
        prop_assert!(matches!(e.code, ErrorCode::InvalidSignature | ErrorCode::Forbidden), "{}", e);
    }
}

/// A key that is not a canonical point encoding or has small order is
/// refused wherever a key is parsed; arbitrary 32 bytes never panic.
#[test]
fn arbitrary_public_key_bytes_never_panic() {
    proptest!(config(1000), |(bytes in any::<[u8; 32]>(), len in 0usize..48)| {
        let s = b64_encode(&bytes);
        match parse_public_key("k", &s) {
            Ok(k) => prop_assert!(!k.is_weak()),
            Err(e) => prop_assert!(matches!(e.code, ErrorCode::InvalidParams | ErrorCode::InvalidSignature)),
        }
        let short = b64_encode(&vec![1u8; len]);
        if len != 32 {
            prop_assert_eq!(parse_public_key("k", &short).unwrap_err().code, ErrorCode::InvalidParams);
        }
    });
}

// ---- I-JSON: what signatures cannot cover is refused -------------------------------------

/// RFC 8785 works on I-JSON (RFC 7493): numbers are IEEE doubles, so two
/// integers above 2^53 that round to the same double have the same signed
/// bytes. The typed view, though, reads the exact integer: a Route signed
/// with `revision` 2^60 also verifies with `revision` 2^60 + 1, which wins
/// over a genuinely newer route with 2^60 + 1 ... 2^60 + 127. Integers
/// outside ±(2^53 − 1) in a signed object should be `invalid_params`.
#[test]
fn a_signed_integer_above_2_pow_53_cannot_be_changed_without_breaking_the_signature() {
    let made = Made { revision: 1 << 60, ..fixed_objects().0.clone() };
    let route = made.object(Kind::Route);
    // Refused as not I-JSON, as issued and as bumped: neither can win.
    assert!(made.check(Kind::Route, &route.to_string()).is_err(), "an unsafe integer is accepted");
    let mut bumped = route.clone();
    bumped["revision"] = json!((1u64 << 60) + 100);
    let r = made.check(Kind::Route, &bumped.to_string());
    assert!(r.is_err(), "revision {} verifies under the signature made for {}", (1u64 << 60) + 100, 1u64 << 60);
}

/// A member repeated inside a signed object: serde keeps the last one for
/// the signature check, while another parser (a recipient's client) may
/// keep the first. The relay already refuses repeated known members (a
/// serde "duplicate field" error); repeated unknown members pass and are
/// stored and forwarded as they came.
#[test]
fn a_signed_object_with_a_repeated_member_is_invalid_params() {
    let (made, objects) = fixed_objects();
    for (kind, v) in KINDS.iter().zip(objects) {
        let text = v.to_string();
        assert!(text.contains("\"x-ext\":{\"n\":1.5}"), "{text}");
        let repeated = text.replacen("\"x-ext\":", "\"x-ext\":\"first\",\"x-ext\":", 1);
        let r = made.check(*kind, &repeated);
        assert!(r.is_err(), "{kind:?} with a repeated unknown member is accepted: {repeated}");
    }
}

/// The same with a known member: refused (this part holds today).
#[test]
fn a_signed_object_with_a_repeated_known_member_is_invalid_params() {
    let (made, objects) = fixed_objects();
    for (kind, v) in KINDS.iter().zip(objects) {
        let text = v.to_string();
        let repeated = text.replacen("\"signature\":", "\"signature\":\"AAAA\",\"signature\":", 1);
        let e = made.check(*kind, &repeated).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParams, "{kind:?}: {e}");
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// The deliver digest's bytes written from each object's own canonical
    /// bytes (`DeliverParams::jcs`) are the JCS of the whole params, however
    /// the objects are spelled, with their unknown members, with or without
    /// the optional members, and whether an object's bytes were left by its
    /// verification or worked out on demand.
    #[test]
    fn deliver_params_jcs_is_the_jcs_of_the_whole_params(
        made in arb_made(),
        seed in any::<u64>(),
        boxes in 0usize..3,
        route in any::<bool>(),
        authorization in 0u8..3,
        verify_first in any::<bool>(),
    ) {
        let rng = &mut Lcg(seed);
        // Integers keep their spelling: the typed view takes no `1e9`.
        let mut spell = |v: &Value| {
            let mut text = String::new();
            respell_with(v, rng, false, &mut text);
            text
        };
        let envelope = spell(&made.object(Kind::Envelope));
        let boxes: Vec<String> = (0..boxes)
            .map(|i| spell(&relay_schemas::client::key_box(&format!("d{i}"), &[i as u8; 40])))
            .collect();
        let certificate = spell(&made.object(Kind::Certificate));
        let route = route.then(|| spell(&made.object(Kind::Route)));
        let authorization = match authorization {
            1 => Some(format!("{{\"contact_grant\":{}}}", spell(&made.object(Kind::Grant)))),
            2 => Some(format!("{{\"contact_invite\":{}}}", spell(&made.object(Kind::Invite)))),
            _ => None,
        };
        let mut body = format!("{{\"envelope\":{envelope},\"recipient_boxes\":[{}]", boxes.join(","));
        body += &format!(",\"sender_device_certificate\":{certificate}");
        if let Some(r) = &route {
            body += &format!(",\"sender_route\":{r}");
        }
        if let Some(a) = &authorization {
            body += &format!(",\"authorization\":{a}");
        }
        body.push('}');
        let p: DeliverParams = serde_json::from_str(&body).map_err(|e| TestCaseError::fail(format!("{e}: {body}")))?;
        if verify_first {
            p.envelope.verify(Tag::Envelope, &made.device().key.verifying_key()).expect("a valid envelope");
        }
        let whole: Value = serde_json::from_str(&body).unwrap();
        prop_assert_eq!(
            String::from_utf8(p.jcs().unwrap()).unwrap(),
            String::from_utf8(jcs(&whole).unwrap()).unwrap()
        );
        prop_assert_eq!(p.jcs().unwrap(), jcs(&p).unwrap(), "the params as serde writes them");
    }
}
