// The encrypted account backup: the browser's state (keys, contacts,
// messages) as JSON, under XChaCha20-Poly1305 with a key stretched from a
// passphrase by scrypt (memory-hard: N = 2^17, r = 8 → 128 MiB per guess).

import { scryptAsync } from '@noble/hashes/scrypt.js';
import { xchacha20poly1305 } from '@noble/ciphers/chacha.js';
import { b64uDecode, b64uEncode, random, utf8 } from './e2e.js';

export const FORMAT = 'relay-web-backup/v1';
const KDF = { name: 'scrypt', N: 2 ** 17, r: 8, p: 1 };
// The format string binds the ciphertext to this file format.
const aad = utf8(FORMAT);

const derive = (pass, kdf, salt) => scryptAsync(utf8(pass.normalize('NFKC')), salt, { N: kdf.N, r: kdf.r, p: kdf.p, dkLen: 32 });

/** The backup file's text for `state` under `pass`. */
export async function seal(pass, state) {
  const salt = random(16);
  const nonce = random(24);
  const key = await derive(pass, KDF, salt);
  const ciphertext = xchacha20poly1305(key, nonce, aad).encrypt(utf8(JSON.stringify(state)));
  return JSON.stringify({ format: FORMAT, kdf: { ...KDF, salt: b64uEncode(salt) }, nonce: b64uEncode(nonce), ciphertext: b64uEncode(ciphertext) });
}

/** The state in a backup file; throws on a wrong passphrase or a damaged file. */
export async function open(pass, text) {
  let file;
  try {
    file = JSON.parse(text);
  } catch {
    throw new Error('this is not a relay backup file');
  }
  if (file?.format !== FORMAT || file.kdf?.name !== 'scrypt') throw new Error('this is not a relay backup file');
  // Bounds on what a file may ask of this browser (N up to 2^20 = 1 GiB).
  const { N, r, p } = file.kdf;
  if (!(Number.isInteger(N) && N >= 2 ** 14 && N <= 2 ** 20 && r === 8 && p >= 1 && p <= 4)) throw new Error('the backup asks for unsupported scrypt parameters');
  const key = await derive(pass, file.kdf, b64uDecode(file.kdf.salt));
  let plain;
  try {
    plain = xchacha20poly1305(key, b64uDecode(file.nonce), aad).decrypt(b64uDecode(file.ciphertext));
  } catch {
    throw new Error('wrong passphrase, or the file is damaged');
  }
  return JSON.parse(new TextDecoder().decode(plain));
}
