// The client's pure rules in Node, on a fixed clock: day separators and
// times, which errors keep a message queued, safety numbers and link
// codes, short codes and their pointer routes, and the backup file (round
// trip, wrong passphrase, tampering).
//
//   node test/unit.mjs

import * as e2e from '../src/e2e.js';
import * as backup from '../src/backup.js';
import * as shortcode from '../src/shortcode.js';
import { dayLabel, listTime, retryable } from '../src/rules.js';

let checks = 0;
function ok(cond, what) {
  if (!cond) throw new Error(`failed: ${what}`);
  checks++;
  console.log(`[unit] ok: ${what}`);
}
async function rejects(p, re, what) {
  try {
    await p;
  } catch (e) {
    return ok(re.test(e.message), `${what} (${e.message})`);
  }
  throw new Error(`failed: ${what}: no error`);
}

// Local times, whatever the machine's zone.
const at = (y, m, d, h, min = 0) => Math.floor(new Date(y, m - 1, d, h, min).getTime() / 1000);
const now = at(2026, 12, 5, 9, 30);
ok(dayLabel(at(2026, 12, 5, 0, 1), now) === 'Today', 'a message from after midnight is today');
ok(dayLabel(at(2026, 12, 4, 23, 59), now) === 'Yesterday', 'one from a minute before midnight is yesterday');
ok(dayLabel(at(2026, 12, 3, 12), now).includes('2026'), 'an older one shows its date');
ok(dayLabel(at(2026, 3, 29, 12), at(2026, 3, 30, 12)) === 'Yesterday', 'a 23-hour day (clock change) is still one day');
ok(/\d/.test(listTime(at(2026, 12, 5, 8), now)) && listTime(at(2026, 12, 5, 8), now) !== listTime(at(2026, 12, 1, 8), now), 'the list shows a time today, a date before');

for (const code of ['offline', undefined, 'rate_limited', 'bad_gateway', 'temporarily_unavailable', 'route_not_found', 'unauthorized']) {
  ok(retryable(code), `${code ?? 'no code'} keeps a message queued`);
}
for (const code of ['forbidden', 'invalid_params', 'invalid_signature', 'state_conflict', 'device_unknown', 'clock_skew', 'payload_too_large']) {
  ok(!retryable(code), `${code} is final (✗ and a retry by hand)`);
}

const k = (n) => e2e.b64uEncode(e2e.publicKeyOf(new Uint8Array(32).fill(n)));
const ab = e2e.safetyNumber(k(1), k(2));
ok(/^(\d{5} ){11}\d{5}$/.test(ab), `a safety number is 60 digits (${ab})`);
ok(ab === e2e.safetyNumber(k(2), k(1)), 'both sides compute the same safety number');
ok(ab !== e2e.safetyNumber(k(1), k(3)), 'another key, another number');
ok(/^\d{3} \d{3}$/.test(e2e.linkCode(k(4))) && e2e.linkCode(k(4)) !== e2e.linkCode(k(5)), 'a link code is six digits of the one-time key');

// Short codes (shortcode.js).
const code = shortcode.newCode();
ok(shortcode.parse(code) === code && /^[0-9A-HJKMNP-TV-Z]{10}$/.test(code), `a short code is ten Crockford base32 characters (${shortcode.format(code)})`);
ok(shortcode.parse(' 7kq2m-xd4ra ') === '7KQ2MXD4RA' && shortcode.parse('OIL23-45678') === '01123' + '45678', 'a typed code is read in any case, with dashes and spaces, O as 0, I and L as 1');
ok(shortcode.parse('7KQ2M-XD4R') === null && shortcode.parse('7KQ2M-XD4RU') === null && shortcode.parse('http://x/#contact=abc') === null, 'a short, misspelt or foreign input is no code');
const kA = shortcode.keysOf('7KQ2MXD4RA');
ok(kA.accountId === shortcode.keysOf(shortcode.parse('7kq2m-xd4ra')).accountId && kA.accountId !== shortcode.keysOf('7KQ2MXD4RB').accountId, 'a code derives the same pointer account on both sides, another code another one');
const relayInfo = { relay_id: 'relay-a', public_url: 'http://127.0.0.1:7801' };
const reg = shortcode.pointer(kA, relayInfo, { kind: 'contact', invite: { invite_id: 'x' } }, k(9), 1764400000);
ok(reg.route.revision === 2 ** 53 - 1 && reg.device_certificate.device_id === 'code' && reg.device_certificate.box_key === k(9), 'a pointer route is at the last revision a route can have');
ok(shortcode.read(reg.route, kA, 'contact').invite.invite_id === 'x', 'a pointer route gives back what it names');
const throws = (f, re, what) => {
  try {
    f();
  } catch (e) {
    return ok(re.test(e.message), `${what} (${e.message})`);
  }
  throw new Error(`failed: ${what}: no error`);
};
throws(() => shortcode.read(reg.route, kA, 'device-link'), /not a device-link code/, 'a contact code is refused where a device-link code is asked for');
throws(() => shortcode.read(reg.route, shortcode.keysOf('7KQ2MXD4RB'), 'contact'), /does not verify/, 'a route of another code is refused');
throws(() => shortcode.read({ ...reg.route, short_code: { kind: 'contact', invite: { invite_id: 'y' } } }, kA, 'contact'), /does not verify/, 'a pointer route changed on the way is refused');
const lower = shortcode.pointer(kA, relayInfo, { kind: 'contact' }, k(9), 1764400000);
const replaceable = e2e.sign('relay/v1/route', { ...lower.route, signature: undefined, revision: 7 }, kA.accountSeed);
throws(() => shortcode.read(replaceable, kA, 'contact'), /could still be replaced/, 'a pointer route below the last revision is refused (whoever knows the code could replace it)');
const big = Uint8Array.from({ length: 150_000 }, (_, i) => (i * 7919) & 255);
const parts = shortcode.split(big).map((data, part, all) => ({ part, parts: all.length, data }));
ok(parts.length === 4 && parts.every((p) => p.data.length <= shortcode.PART), 'a 150 kB answer goes in four parts under the ciphertext limit');
const joined = shortcode.join([parts[2], parts[0], parts[3], parts[1]]);
ok(joined && joined.length === big.length && joined.every((b, i) => b === big[i]), 'the parts of an answer join in any order');
ok(shortcode.join(parts.slice(1)) === null && shortcode.join([parts[0], parts[0], parts[1], parts[2]]) === null, 'an answer with a part missing is not taken');

const state = { identity: { account_id: 'a'.repeat(32) }, messages: [{ text: 'secret words' }] };
const file = await backup.seal('a long passphrase', state);
ok(!file.includes('secret words') && !file.includes('a'.repeat(32)), 'the backup file holds no plaintext');
ok(JSON.stringify(await backup.open('a long passphrase', file)) === JSON.stringify(state), 'the passphrase opens it');
await rejects(backup.open('another passphrase', file), /wrong passphrase/, 'a wrong passphrase is refused');
const f = JSON.parse(file);
// A character in the middle: all its bits count (the last one may have unused bits).
const flip = (t, i) => `${t.slice(0, i)}${t[i] === 'A' ? 'B' : 'A'}${t.slice(i + 1)}`;
const tampered = JSON.stringify({ ...f, ciphertext: flip(f.ciphertext, 40) });
await rejects(backup.open('a long passphrase', tampered), /wrong passphrase|damaged/, 'a changed byte is refused');
await rejects(backup.open('x', JSON.stringify({ ...f, kdf: { ...f.kdf, N: 2 ** 30 } })), /unsupported scrypt/, 'a file asking for 128 GiB of scrypt is refused');
await rejects(backup.open('x', 'not json'), /not a relay backup/, 'a file of another kind is refused');
console.log(`[unit] ${checks} checks passed`);
