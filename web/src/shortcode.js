// Short codes: ten characters a person can type (or a small QR code) that
// stand for a contact link or a device-link request, within the protocol as
// it is (no relay method looks anything up by a short name).
//
// A code is the secret from which a "pointer" account's keys are derived
// (scrypt, so that the account id the relay sees does not give the code
// away cheaply). Its holder registers that account with `account.register`;
// its signed Route carries what the code stands for in a member of its own
// (`short_code`: unknown members are signed and kept byte for byte,
// PROTOCOL §1); whoever types the code derives the same account id and
// reads the route with `route.get`. The route is registered at the last
// revision a route can have (2^53 − 1, the I-JSON bound the relay
// enforces), so someone who learns the code cannot replace what it names:
// a higher revision cannot exist and an equal one with other content is
// `state_conflict`.

import { scrypt } from '@noble/hashes/scrypt.js';
import * as e2e from './e2e.js';

/** Crockford's base32: no I, L, O, U; typed in either case. */
export const ALPHABET = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
/** 10 characters of 5 bits: 50 bits, against guessing over `route.get`. */
export const LENGTH = 10;
export const FINAL_REVISION = Number.MAX_SAFE_INTEGER;
/** The pointer account's one device, whose session reads the mailbox. */
export const DEVICE_ID = 'code';
const SALT = e2e.utf8('relay/v1/short-code');
const KDF = { N: 2 ** 14, r: 8, p: 1, dkLen: 64 };
/** Base64url characters of an answer per message: under the relay's 64 KiB ciphertext limit. */
export const PART = 60_000;

export function newCode(random = e2e.random) {
  // 32 divides 256: the low five bits of a random byte are uniform.
  return [...random(LENGTH)].map((b) => ALPHABET[b & 31]).join('');
}

export const format = (code) => `${code.slice(0, 5)}-${code.slice(5)}`;

/** A typed code, normalized (case, dashes, spaces, O→0, I/L→1), or null. */
export function parse(input) {
  const s = String(input).trim().toUpperCase().replace(/[\s-]/g, '').replace(/O/g, '0').replace(/[IL]/g, '1');
  return s.length === LENGTH && [...s].every((c) => ALPHABET.includes(c)) ? s : null;
}

/** The pointer account of `code`: the same on every device that knows it. */
export function keysOf(code) {
  const k = scrypt(e2e.utf8(code), SALT, KDF);
  const accountSeed = k.slice(0, 32);
  const deviceSeed = k.slice(32);
  const accountKey = e2e.publicKeyOf(accountSeed);
  return { accountSeed, deviceSeed, accountKey, accountId: e2e.accountIdOf(accountKey) };
}

/**
 * `account.register` params for the pointer of `code` on `relay`, naming
 * `body`; its device's `box_key` is `boxKey` (a device-link request's
 * one-time key, so the answer sent to the pointer opens only there).
 */
export function pointer(k, relay, body, boxKey, issuedAt) {
  const account_key = e2e.b64uEncode(k.accountKey);
  const route = e2e.sign(
    'relay/v1/route',
    {
      account_id: k.accountId,
      account_key,
      revision: FINAL_REVISION,
      relays: [{ id: relay.relay_id, url: relay.public_url }],
      issued_at: issuedAt,
      short_code: body,
    },
    k.accountSeed,
  );
  const device_certificate = e2e.sign(
    'relay/v1/device-certificate',
    {
      account_id: k.accountId,
      account_key,
      device_id: DEVICE_ID,
      device_key: e2e.b64uEncode(e2e.publicKeyOf(k.deviceSeed)),
      box_key: boxKey,
      issued_at: issuedAt,
    },
    k.accountSeed,
  );
  const registration = e2e.sign(
    'relay/v1/registration',
    { account_id: k.accountId, relay_id: relay.relay_id, public_discovery: false, issued_at: issuedAt },
    k.accountSeed,
  );
  return { route, device_certificate, registration };
}

/** What a pointer route found for `k` names, when it is one of `kind`; throws otherwise. */
export function read(route, k, kind) {
  if (route.account_id !== k.accountId || route.account_key !== e2e.b64uEncode(k.accountKey) || !e2e.verify('relay/v1/route', route, k.accountKey)) {
    throw new Error('the code names a route that does not verify');
  }
  if (route.revision !== FINAL_REVISION) throw new Error('the code names a route that could still be replaced');
  if (route.short_code?.kind !== kind) throw new Error(`that code is not a ${kind === 'contact' ? 'contact' : 'device-link'} code`);
  return route.short_code;
}

/** `bytes` as base64url in parts of at most PART characters. */
export function split(bytes, size = PART) {
  const s = e2e.b64uEncode(bytes);
  const parts = [];
  for (let i = 0; i < s.length; i += size) parts.push(s.slice(i, i + size));
  return parts.length ? parts : [''];
}

/** The bytes of parts `{part, parts, data}` received in any order, or null while one is missing. */
export function join(received) {
  const n = received[0]?.parts;
  if (!Number.isInteger(n) || n < 1) return null;
  const data = new Array(n);
  for (const p of received) if (p.parts === n && Number.isInteger(p.part) && p.part >= 0 && p.part < n) data[p.part] = p.data;
  for (let i = 0; i < n; i++) if (typeof data[i] !== 'string') return null;
  return e2e.b64uDecode(data.join(''));
}
