// relay-e2e/v1 (PROTOCOL §8) and the protocol's signed objects (§1, §2),
// on the audited noble libraries: no hand-written cryptography here.
// Pure: callers may pass every random value (the shared test vectors do).

import { ed25519, x25519 } from '@noble/curves/ed25519.js';
import { blake3 } from '@noble/hashes/blake3.js';
import { sha256 } from '@noble/hashes/sha2.js';
import { hkdf } from '@noble/hashes/hkdf.js';
import { randomBytes, bytesToHex, concatBytes } from '@noble/hashes/utils.js';
import { xchacha20poly1305 } from '@noble/ciphers/chacha.js';
import canonicalize from 'canonicalize';

export const PROFILE = 'relay-e2e/v1';
const enc = new TextEncoder();
const dec = new TextDecoder('utf-8', { fatal: true });

export const utf8 = (s) => enc.encode(s);
export const random = randomBytes;

export function b64uEncode(bytes) {
  let s = '';
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

export function b64uDecode(str) {
  if (typeof str !== 'string' || !/^[A-Za-z0-9_-]*$/.test(str) || str.length % 4 === 1) {
    throw new Error('not base64url without padding');
  }
  const bin = atob(str.replace(/-/g, '+').replace(/_/g, '/'));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

/** RFC 8785 bytes of a JSON value. */
export const jcs = (value) => utf8(canonicalize(value));

/** blake3 of `bytes`, `length` bytes long. */
export const digest = (bytes, length = 32) => blake3(bytes, { dkLen: length });

/**
 * The safety number of two accounts: 60 digits from both account keys
 * (base64url, in either order), the same on both sides; comparing them
 * finds a key swapped on the way.
 */
export function safetyNumber(keyA, keyB) {
  const [a, b] = [keyA, keyB].sort();
  const h = digest(utf8(`relay/v1/safety-number\n${a}\n${b}`), 48);
  const v = new DataView(h.buffer, h.byteOffset, h.byteLength);
  return Array.from({ length: 12 }, (_, i) => String(v.getUint32(i * 4) % 100000).padStart(5, '0')).join(' ');
}

/** Six digits both browsers show while linking, from the new browser's one-time key. */
export function linkCode(linkKey) {
  const v = new DataView(digest(utf8(`relay/v1/link-code\n${linkKey}`), 4).buffer);
  return String(v.getUint32(0) % 1_000_000).padStart(6, '0').replace(/(\d{3})(\d{3})/, '$1 $2');
}

/** `account_id`: the first 16 bytes of blake3(account_key), hex. */
export const accountIdOf = (publicKey) => bytesToHex(blake3(publicKey).slice(0, 16));

export const publicKeyOf = (secret) => ed25519.getPublicKey(secret);
export const boxKeyOf = (secret) => x25519.getPublicKey(secret);

function signedBytes(tag, object) {
  const { signature: _, ...rest } = object;
  return concatBytes(utf8(`${tag}\n`), jcs(rest));
}

/** The object with its `signature` under `secret` (domain-tagged, §1). */
export function sign(tag, object, secret) {
  return { ...object, signature: b64uEncode(ed25519.sign(signedBytes(tag, object), secret)) };
}

/** Strict RFC 8032 verification, as the relays do (no ZIP-215 leniency). */
export function verify(tag, object, publicKey) {
  try {
    const sig = b64uDecode(object.signature);
    return ed25519.verify(sig, signedBytes(tag, object), publicKey, { zip215: false });
  } catch {
    return false;
  }
}

/** The `session.open` proof over {account_id, device_id, challenge, relay_id}. */
export function sessionProof(secret, body) {
  return b64uEncode(ed25519.sign(concatBytes(utf8('relay/v1/session\n'), jcs(body)), secret));
}

/** `n ‖ XChaCha20-Poly1305(K, n, plaintext, aad = message_id)`. */
export function seal(messageId, key, nonce, plaintext) {
  return concatBytes(nonce, xchacha20poly1305(key, nonce, utf8(messageId)).encrypt(plaintext));
}

export function open(messageId, key, ciphertext) {
  if (ciphertext.length < 24 + 16) throw new Error('ciphertext too short');
  return xchacha20poly1305(key, ciphertext.subarray(0, 24), utf8(messageId)).decrypt(ciphertext.subarray(24));
}

const boxAad = (messageId, deviceId) => utf8(`${messageId}\n${deviceId}`);

function kek(secret, publicKey, ephemeral, boxKey) {
  // noble refuses low-order points (an all-zero shared secret) by throwing.
  const shared = x25519.getSharedSecret(secret, publicKey);
  return hkdf(sha256, shared, concatBytes(ephemeral, boxKey), utf8('relay/v1/key-box'), 32);
}

/** `E ‖ m ‖ XChaCha20-Poly1305(kek, m, K, aad = message_id ‖ "\n" ‖ device_id)`. */
export function sealBox(messageId, deviceId, boxKey, contentKey, ephemeralSecret, nonce) {
  const ephemeral = x25519.getPublicKey(ephemeralSecret);
  const k = kek(ephemeralSecret, boxKey, ephemeral, boxKey);
  return concatBytes(ephemeral, nonce, xchacha20poly1305(k, nonce, boxAad(messageId, deviceId)).encrypt(contentKey));
}

export function openBox(messageId, deviceId, boxSecret, box) {
  if (box.length !== 32 + 24 + 32 + 16) throw new Error('key box has the wrong length');
  const ephemeral = box.subarray(0, 32);
  const k = kek(boxSecret, ephemeral, ephemeral, x25519.getPublicKey(boxSecret));
  return xchacha20poly1305(k, box.subarray(32, 56), boxAad(messageId, deviceId)).decrypt(box.subarray(56));
}

/**
 * Seals `plaintext` for `devices` ([{device_id, box_key: Uint8Array}]):
 * {ciphertext, boxes: [{device_id, box}]} (base64url). `rnd` fixes the
 * random values ({content_key, nonce, boxes: [[e, m], …]}); fresh otherwise.
 */
export function encrypt(messageId, plaintext, devices, rnd) {
  const r = rnd ?? {
    content_key: random(32),
    nonce: random(24),
    boxes: devices.map(() => [random(32), random(24)]),
  };
  const ciphertext = seal(messageId, r.content_key, r.nonce, plaintext);
  const boxes = devices.map((d, i) => ({
    device_id: d.device_id,
    box: b64uEncode(sealBox(messageId, d.device_id, d.box_key, r.content_key, r.boxes[i][0], r.boxes[i][1])),
  }));
  return { ciphertext: b64uEncode(ciphertext), boxes };
}

/**
 * The plaintext of a timeline record for this device. The envelope's
 * signature is checked under the sending device's key first: nothing
 * unverified is shown.
 */
export function openRecord(record, senderDeviceKey, deviceId, boxSecret) {
  const env = record.envelope;
  if (!verify('relay/v1/envelope', env, senderDeviceKey)) throw new Error('envelope signature does not verify');
  if (record.box?.device_id !== deviceId) throw new Error('the box is for another device');
  const key = openBox(env.message_id, deviceId, boxSecret, b64uDecode(record.box.box));
  return open(env.message_id, key, b64uDecode(env.ciphertext));
}

/** UTF-8 JCS of {"type":"text","text":…}, with any extra members (e.g. a reply grant). */
export const textPlaintext = (text, extra = {}) => jcs({ ...extra, type: 'text', text });

/** The message a plaintext holds: {type, text?, …}; throws when it is not JSON. */
export function readPlaintext(bytes) {
  const m = JSON.parse(dec.decode(bytes));
  if (typeof m !== 'object' || m === null || typeof m.type !== 'string') throw new Error('plaintext has no type');
  return m;
}
