// The client's pure rules in Node, on a fixed clock: day separators and
// times, which errors keep a message queued, safety numbers and link
// codes, and the backup file (round trip, wrong passphrase, tampering).
//
//   node test/unit.mjs

import * as e2e from '../src/e2e.js';
import * as backup from '../src/backup.js';
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
