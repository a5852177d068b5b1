//! The client encryption profile `relay-e2e/v1` (PROTOCOL §8), as the
//! project's own clients use it. Relays never call this: ciphertext and key
//! boxes are opaque to them.
//!
//! Pure like the rest of the crate: the caller supplies every random value
//! (content key, nonces, ephemeral secrets), which is also what makes the
//! shared test vectors (`web/vectors/relay-e2e-v1.json`) possible.

use crate::encoding::{b64_decode, jcs};
use crate::sign::{verify_object, Tag};
use crate::RelayError;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use hkdf::Hkdf;
use serde_json::{json, Value};
use sha2::Sha256;

pub const PROFILE: &str = "relay-e2e/v1";
const KEY_BOX_INFO: &[u8] = b"relay/v1/key-box";
const NONCE: usize = 24;
const TAG: usize = 16;

/// Random values one message needs: the content key `K`, the content nonce
/// `n`, and per key box an ephemeral X25519 secret `e` and a nonce `m`.
pub struct Randomness<'a> {
    pub content_key: [u8; 32],
    pub nonce: [u8; NONCE],
    /// One `(ephemeral secret, box nonce)` per recipient device, in order.
    pub boxes: &'a [([u8; 32], [u8; NONCE])],
}

/// The X25519 public key (`box_key`) of a box secret.
pub fn box_public(secret: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::x25519(*secret, x25519_dalek::X25519_BASEPOINT_BYTES)
}

fn aead(key: &[u8; 32]) -> XChaCha20Poly1305 {
    XChaCha20Poly1305::new(&(*key).into())
}

fn undecryptable(what: &str) -> RelayError {
    RelayError::invalid_params(format!("{what}: does not decrypt under relay-e2e/v1"))
}

/// `n ‖ XChaCha20-Poly1305(K, n, plaintext, aad = message_id)`.
pub fn seal(message_id: &str, key: &[u8; 32], nonce: &[u8; NONCE], plaintext: &[u8]) -> Vec<u8> {
    let sealed = aead(key)
        .encrypt(&(*nonce).into(), Payload { msg: plaintext, aad: message_id.as_bytes() })
        .expect("XChaCha20-Poly1305 seals any length the protocol allows");
    [nonce.as_slice(), &sealed].concat()
}

/// The plaintext of a `ciphertext` sealed by [`seal`].
pub fn open(message_id: &str, key: &[u8; 32], ciphertext: &[u8]) -> Result<Vec<u8>, RelayError> {
    if ciphertext.len() < NONCE + TAG {
        return Err(undecryptable("ciphertext"));
    }
    let (nonce, sealed) = ciphertext.split_at(NONCE);
    let nonce: [u8; NONCE] = nonce.try_into().expect("split at NONCE");
    aead(key)
        .decrypt(&nonce.into(), Payload { msg: sealed, aad: message_id.as_bytes() })
        .map_err(|_| undecryptable("ciphertext"))
}

/// `kek = HKDF-SHA256(X25519(secret, public), salt = E ‖ box_key, info)`.
/// An all-zero shared secret (a low-order point) is refused, as the browser
/// library does.
fn kek(secret: &[u8; 32], public: &[u8; 32], ephemeral: &[u8; 32], box_key: &[u8; 32]) -> Option<[u8; 32]> {
    let shared = x25519_dalek::x25519(*secret, *public);
    if shared == [0; 32] {
        return None;
    }
    let salt = [ephemeral.as_slice(), box_key].concat();
    let mut kek = [0; 32];
    Hkdf::<Sha256>::new(Some(&salt), &shared).expand(KEY_BOX_INFO, &mut kek).expect("32 bytes is a valid length");
    Some(kek)
}

fn box_aad(message_id: &str, device_id: &str) -> Vec<u8> {
    [message_id.as_bytes(), b"\n", device_id.as_bytes()].concat()
}

/// `E ‖ m ‖ XChaCha20-Poly1305(kek, m, K, aad = message_id ‖ "\n" ‖ device_id)`.
pub fn seal_box(
    message_id: &str,
    device_id: &str,
    box_key: &[u8; 32],
    content_key: &[u8; 32],
    ephemeral_secret: &[u8; 32],
    nonce: &[u8; NONCE],
) -> Result<Vec<u8>, RelayError> {
    let ephemeral = box_public(ephemeral_secret);
    let kek = kek(ephemeral_secret, box_key, &ephemeral, box_key)
        .ok_or_else(|| RelayError::invalid_params(format!("box_key of {device_id}: a low-order point")))?;
    let aad = box_aad(message_id, device_id);
    let sealed = aead(&kek)
        .encrypt(&(*nonce).into(), Payload { msg: content_key, aad: &aad })
        .expect("a 32-byte key always seals");
    Ok([ephemeral.as_slice(), nonce, &sealed].concat())
}

/// The content key in a box sealed by [`seal_box`] for this device.
pub fn open_box(
    message_id: &str,
    device_id: &str,
    box_secret: &[u8; 32],
    key_box: &[u8],
) -> Result<[u8; 32], RelayError> {
    if key_box.len() != 32 + NONCE + 32 + TAG {
        return Err(undecryptable("box"));
    }
    let ephemeral: [u8; 32] = key_box[..32].try_into().expect("32 bytes");
    let nonce: [u8; NONCE] = key_box[32..32 + NONCE].try_into().expect("NONCE bytes");
    let kek = kek(box_secret, &ephemeral, &ephemeral, &box_public(box_secret)).ok_or_else(|| undecryptable("box"))?;
    let key = aead(&kek)
        .decrypt(&nonce.into(), Payload { msg: &key_box[32 + NONCE..], aad: &box_aad(message_id, device_id) })
        .map_err(|_| undecryptable("box"))?;
    key.try_into().map_err(|_| undecryptable("box"))
}

/// A message sealed for a set of devices: the envelope's `ciphertext` and
/// one `(device_id, box)` per device.
pub struct Sealed {
    pub ciphertext: Vec<u8>,
    pub boxes: Vec<(String, Vec<u8>)>,
}

/// Seals `plaintext` for `devices` (`(device_id, box_key)`), taking
/// `random.boxes[i]` for device `i`.
pub fn encrypt(
    message_id: &str,
    plaintext: &[u8],
    devices: &[(&str, [u8; 32])],
    random: &Randomness<'_>,
) -> Result<Sealed, RelayError> {
    if random.boxes.len() != devices.len() {
        return Err(RelayError::invalid_params("one ephemeral secret and nonce per device"));
    }
    let ciphertext = seal(message_id, &random.content_key, &random.nonce, plaintext);
    let boxes = devices
        .iter()
        .zip(random.boxes)
        .map(|((device_id, box_key), (e, m))| {
            Ok((device_id.to_string(), seal_box(message_id, device_id, box_key, &random.content_key, e, m)?))
        })
        .collect::<Result<_, RelayError>>()?;
    Ok(Sealed { ciphertext, boxes })
}

/// Opens a received message with this device's box: the plaintext.
pub fn decrypt(
    message_id: &str,
    device_id: &str,
    box_secret: &[u8; 32],
    key_box: &[u8],
    ciphertext: &[u8],
) -> Result<Vec<u8>, RelayError> {
    let key = open_box(message_id, device_id, box_secret, key_box)?;
    open(message_id, &key, ciphertext)
}

/// The plaintext of a timeline record (PROTOCOL §2) for this device: the
/// envelope's signature is checked under the sending device's key first, so
/// nothing unverified is ever shown.
pub fn open_record(
    record: &Value,
    sender_device_key: &ed25519_dalek::VerifyingKey,
    device_id: &str,
    box_secret: &[u8; 32],
) -> Result<Vec<u8>, RelayError> {
    let envelope = record["envelope"].as_object().ok_or_else(|| RelayError::invalid_params("record: no envelope"))?;
    verify_object(Tag::Envelope, envelope, sender_device_key)?;
    let field = |v: &Value, name: &str| {
        v[name].as_str().ok_or_else(|| RelayError::invalid_params(format!("record: no {name}"))).map(str::to_owned)
    };
    let message_id = field(&record["envelope"], "message_id")?;
    if field(&record["box"], "device_id")? != device_id {
        return Err(RelayError::invalid_params("record: the box is for another device"));
    }
    let key_box = b64_decode("box", &field(&record["box"], "box")?)?;
    let ciphertext = b64_decode("ciphertext", &field(&record["envelope"], "ciphertext")?)?;
    decrypt(&message_id, device_id, box_secret, &key_box, &ciphertext)
}

/// The plaintext of a text message: UTF-8 JCS of `{"type":"text","text":…}`.
pub fn text(text: &str) -> Vec<u8> {
    jcs(&json!({"type": "text", "text": text})).expect("a string canonicalizes")
}

/// A text message with extra members beside `type` and `text` (the web
/// client and the chat example put a reply grant there).
pub fn text_with(text: &str, extra: Value) -> Vec<u8> {
    let mut m = match extra {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    m.insert("type".into(), json!("text"));
    m.insert("text".into(), json!(text));
    jcs(&m).expect("JSON canonicalizes")
}

/// What a plaintext says: the text of a `text` message, `None` for a type
/// this client does not know (shown as unsupported).
pub fn read_text(plaintext: &[u8]) -> Result<Option<String>, RelayError> {
    let v: Value = serde_json::from_slice(plaintext).map_err(|_| RelayError::invalid_params("plaintext: not JSON"))?;
    match (v["type"].as_str(), v["text"].as_str()) {
        (Some("text"), Some(t)) => Ok(Some(t.to_owned())),
        (Some("text"), None) => Err(RelayError::invalid_params("plaintext: text without a string `text`")),
        (Some(_), _) => Ok(None),
        (None, _) => Err(RelayError::invalid_params("plaintext: no `type`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MID: &str = "AAAAAAAAAAAAAAAAAAAAAA";

    #[test]
    fn a_box_opens_only_for_its_device_and_message() {
        let secret = [7u8; 32];
        let public = box_public(&secret);
        let random = Randomness { content_key: [1; 32], nonce: [2; 24], boxes: &[([3; 32], [4; 24])] };
        let sealed = encrypt(MID, &text("hi"), &[("laptop", public)], &random).unwrap();
        let (_, b) = &sealed.boxes[0];
        let plain = decrypt(MID, "laptop", &secret, b, &sealed.ciphertext).unwrap();
        assert_eq!(read_text(&plain).unwrap().as_deref(), Some("hi"));
        assert!(decrypt(MID, "phone", &secret, b, &sealed.ciphertext).is_err());
        assert!(decrypt("BBBBBBBBBBBBBBBBBBBBBB", "laptop", &secret, b, &sealed.ciphertext).is_err());
        assert!(decrypt(MID, "laptop", &[8; 32], b, &sealed.ciphertext).is_err());
        let mut tampered = sealed.ciphertext.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(decrypt(MID, "laptop", &secret, b, &tampered).is_err());
    }

    #[test]
    fn a_low_order_box_key_is_refused() {
        assert!(seal_box(MID, "d", &[0; 32], &[1; 32], &[3; 32], &[4; 24]).is_err());
    }

    #[test]
    fn unknown_types_are_unsupported_not_errors() {
        assert_eq!(read_text(br#"{"type":"image"}"#).unwrap(), None);
        assert!(read_text(b"not json").is_err());
        assert_eq!(text("a\"b"), br#"{"text":"a\"b","type":"text"}"#);
    }
}
