// Web Push in the web client (PROTOCOL §9), in headless Chromium against one
// relay on loopback and a push-service stand-in (a node HTTP server on
// 127.0.0.1):
//
//   node web/test/push.mjs --relay target/debug/relay --dir <scratch dir> --out <screenshot dir>
//
// Run by tests/it/browser.rs. What runs for real: the client registers its
// service worker (/sw.js, served by the relay), asks for notification
// permission (granted by the test), fetches push.vapid_key, calls
// pushManager.subscribe with that key and hands the subscription to the
// relay (push.subscribe); with its page closed, a message from another
// browser makes the relay POST an RFC 8291 push with a VAPID header to the
// stand-in, which decrypts it here with the subscription's private key; the
// decrypted payload is delivered to the real service worker (DevTools
// ServiceWorker.deliverPushMessage), which shows "New message"; reopening
// the page syncs and decrypts the message; signing out unsubscribes at the
// relay and at the push manager.
//
// What is stubbed: PushManager.subscribe/getSubscription. Headless Chromium
// reaches no push service (and this machine reaches nothing beyond loopback),
// so the stub answers with a subscription whose endpoint is the stand-in and
// whose keys this script made; it records the applicationServerKey the
// client passed.

import { execFileSync } from 'node:child_process';
import { createECDH, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import * as harness from './harness.mjs';
import { arg, sleep, logger, relayNet, launch, until } from './harness.mjs';

const RELAY = arg('relay');
const DIR = arg('dir');
const OUT = arg('out');
const log = logger('push');
const assert = (cond, what) => harness.assert(cond, what, log);
const b64u = (buf) => Buffer.from(buf).toString('base64url');

/** Polls `fn` (async) until it returns something truthy, at most `ms`. */
async function eventually(fn, what, ms = 20_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`);
    await sleep(50);
  }
}

// ---- the push service stand-in ------------------------------------------------

const pushes = [];
function startPushService() {
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      pushes.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks), at: Date.now() });
      res.writeHead(201, { 'content-length': '0' });
      res.end();
    });
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

/**
 * RFC 8291 decryption, as a user agent does it: ECDH with the sender's key
 * from the header, HKDF with the auth secret, then RFC 8188 aes128gcm (one
 * record, padding delimiter 0x02).
 */
function decrypt(body, ecdh, auth) {
  const salt = body.subarray(0, 16);
  const idlen = body[20];
  const asPublic = body.subarray(21, 21 + idlen);
  const ciphertext = body.subarray(21 + idlen);
  const shared = ecdh.computeSecret(asPublic);
  const keyInfo = Buffer.concat([Buffer.from('WebPush: info\0'), ecdh.getPublicKey(), asPublic]);
  const ikm = Buffer.from(hkdfSync('sha256', shared, auth, keyInfo, 32));
  const cek = Buffer.from(hkdfSync('sha256', ikm, salt, Buffer.from('Content-Encoding: aes128gcm\0'), 16));
  const nonce = Buffer.from(hkdfSync('sha256', ikm, salt, Buffer.from('Content-Encoding: nonce\0'), 12));
  const d = createDecipheriv('aes-128-gcm', cek, nonce);
  d.setAuthTag(ciphertext.subarray(ciphertext.length - 16));
  const padded = Buffer.concat([d.update(ciphertext.subarray(0, ciphertext.length - 16)), d.final()]);
  let end = padded.length - 1;
  while (end >= 0 && padded[end] === 0) end--;
  if (padded[end] !== 2) throw new Error('not a last record');
  return padded.subarray(0, end).toString('utf8');
}

/** The VAPID header's parts (RFC 8292): claims and key. */
function vapid(header) {
  const m = /^vapid t=([^,]+), k=(.+)$/.exec(header ?? '');
  if (!m) throw new Error(`not a VAPID header: ${header}`);
  const [h, c] = m[1].split('.');
  return { header: JSON.parse(Buffer.from(h, 'base64url')), claims: JSON.parse(Buffer.from(c, 'base64url')), k: m[2] };
}

// ---- the stub PushManager (page world, before the client's script) ------------

function stubPushManager(endpoint, p256dh, auth) {
  let current = null;
  const record = (k, v) => localStorage.setItem(k, JSON.stringify(v));
  PushManager.prototype.getSubscription = async function () {
    return current;
  };
  PushManager.prototype.subscribe = async function (options) {
    const key = new Uint8Array(options.applicationServerKey);
    record('stub.subscribe', { key: btoa(String.fromCharCode(...key)), userVisibleOnly: options.userVisibleOnly });
    current = {
      endpoint,
      expirationTime: null,
      options: { userVisibleOnly: options.userVisibleOnly, applicationServerKey: key.buffer },
      toJSON: () => ({ endpoint, expirationTime: null, keys: { p256dh, auth } }),
      unsubscribe: async () => {
        current = null;
        record('stub.unsubscribed', true);
        return true;
      },
    };
    return current;
  };
}

// ---- the test ------------------------------------------------------------------

async function main() {
  rmSync(DIR, { recursive: true, force: true });
  mkdirSync(DIR, { recursive: true });
  mkdirSync(OUT, { recursive: true });
  const service = await startPushService();
  const serviceUrl = `http://127.0.0.1:${service.address().port}`;
  // The stand-in is plain http on loopback.
  const net = await relayNet(RELAY, DIR, ['relay-a'], log, '[push]\nallow_http_endpoints = true\nallow_private_endpoints = true\nmin_interval = "1s"\n');
  await net.start('relay-a');
  const { url, config } = net.relays['relay-a'];
  const rpc = async (method, params) => (await fetch(`${url}/v1/rpc/${method}`, { method: 'POST', body: JSON.stringify(params) })).json();
  const metric = async (name) => {
    const text = await (await fetch(`${url}/metrics`)).text();
    const line = text.split('\n').find((l) => l.startsWith(name));
    return line ? Number(line.split(' ').pop()) : 0;
  };
  const vapidKey = (await rpc('push.vapid_key', {})).public_key;
  log(`relay at ${url}, VAPID key ${vapidKey.slice(0, 12)}…, push service at ${serviceUrl}`);

  // Alice's browser's subscription: keys made here, endpoint the stand-in.
  const ecdh = createECDH('prime256v1');
  ecdh.generateKeys();
  const auth = randomBytes(16);
  const endpoint = `${serviceUrl}/push/alice`;

  const browser = await launch(DIR);
  try {
    const aliceCtx = await browser.createBrowserContext();
    await aliceCtx.overridePermissions(url, ['notifications']);
    const openAlice = async () => {
      const page = await aliceCtx.newPage();
      page.on('pageerror', (e) => log(`page error (alice): ${e.message}`));
      page.on('dialog', (d) => d.accept());
      await page.evaluateOnNewDocument(stubPushManager, endpoint, b64u(ecdh.getPublicKey()), b64u(auth));
      await page.goto(`${url}/`);
      await until(page, () => document.body.dataset.ready === 'true');
      return page;
    };
    let alice = await openAlice();
    await alice.click('#create');
    await until(alice, () => document.getElementById('conn').dataset.state === 'online');
    const aliceId = await alice.$eval('#account-id', (e) => e.textContent);

    await alice.click('#open-settings');
    await alice.click('#push-enable');
    await until(alice, () => ['on', 'failed'].includes(document.getElementById('push-state').dataset.state));
    const state = await alice.$eval('#push-state', (e) => e.textContent);
    assert(state === 'on', `Enable notifications: "${state}"`);
    const worker = await alice.evaluate(async () => {
      const reg = await navigator.serviceWorker.getRegistration('/');
      return { script: reg?.active?.scriptURL, scope: reg?.scope };
    });
    assert(worker.script === `${url}/sw.js` && worker.scope === `${url}/`, `the service worker is registered and active (${worker.script})`);
    const call = await alice.evaluate(() => JSON.parse(localStorage.getItem('stub.subscribe')));
    assert(b64u(Buffer.from(call.key, 'base64')) === vapidKey && call.userVisibleOnly === true, 'pushManager.subscribe got the relay\'s VAPID key, userVisibleOnly');
    await alice.screenshot({ path: join(OUT, 'alice-push-on.png') });

    // Bob, in another browser, adds Alice from her link.
    const bobCtx = await browser.createBrowserContext();
    const bob = await bobCtx.newPage();
    page_errors(bob, 'bob');
    await bob.goto(`${url}/`);
    await until(bob, () => document.body.dataset.ready === 'true');
    await bob.click('#create');
    await until(bob, () => document.getElementById('conn').dataset.state === 'online');
    const link = await alice.$eval('#contact-link', (e) => e.value);
    await bob.type('#add-link', link);
    await bob.click('#add-contact');
    await until(bob, (id) => document.getElementById('peer').dataset.accountId === id, aliceId);

    // Alice closes her page: her device has no socket any more.
    await alice.close();
    await eventually(async () => (await metric('relay_websocket_connections')) === 1, 'Alice\'s socket closed');
    const text = `Wake up, Alice ${Date.now()}`;
    await bob.type('#text', text);
    await bob.click('#send-form button');
    const push = await eventually(() => pushes.find((p) => p.path === '/push/alice'), 'a push to Alice\'s endpoint');
    assert(push.headers['content-encoding'] === 'aes128gcm' && push.headers.urgency === 'high' && Number(push.headers.ttl) > 0, 'the push is aes128gcm, Urgency: high, with a TTL');
    const v = vapid(push.headers.authorization);
    assert(v.k === vapidKey && v.header.alg === 'ES256' && v.claims.aud === serviceUrl, `VAPID: ES256 by the relay's key for ${v.claims.aud}`);
    const plain = decrypt(push.body, ecdh, auth);
    const payload = JSON.parse(plain);
    assert(
      JSON.stringify(Object.keys(payload).sort()) === '["account_id","sequence","type"]' && payload.type === 'timeline.changed' && payload.account_id === aliceId,
      `the push decrypts to ${plain}`,
    );
    assert(!plain.includes(text) && !push.body.includes(Buffer.from(text)), 'no message content in the push');

    // The real service worker gets that payload as a push and shows "New message".
    const blank = await aliceCtx.newPage();
    const cdp = await blank.createCDPSession();
    const registrations = new Map();
    cdp.on('ServiceWorker.workerRegistrationUpdated', (e) => {
      for (const r of e.registrations) registrations.set(r.scopeURL, r.registrationId);
    });
    await cdp.send('ServiceWorker.enable');
    const registrationId = await eventually(() => registrations.get(`${url}/`), 'the service worker registration');
    // DevTools can lose a push it delivers while the worker is (re)starting
    // (seen on a loaded machine): it is delivered again every 5 s until its
    // notification shows. One tag per account, so still one notification.
    let deliveredAt = 0;
    const deliver = async () => {
      deliveredAt = Date.now();
      await cdp.send('ServiceWorker.deliverPushMessage', { origin: url, registrationId, data: plain });
    };
    await deliver();
    const swTarget = await browser.waitForTarget((t) => t.type() === 'service_worker' && t.url() === `${url}/sw.js`, { timeout: 20_000 });
    const sw = await swTarget.worker();
    const notes = await eventually(
      async () => {
        const n = await sw.evaluate(async () => (await self.registration.getNotifications()).map((x) => ({ title: x.title, body: x.body, data: x.data })));
        if (n.length) return n;
        if (Date.now() - deliveredAt > 5_000) await deliver();
        return null;
      },
      'a notification',
      40_000,
    );
    log(`notifications: ${JSON.stringify(notes)}`);
    assert(notes[0].title === 'New message' && notes[0].data.sequence === payload.sequence && !JSON.stringify(notes).includes(text), 'the service worker shows "New message" (no content)');
    await blank.close();

    // Opening the client fetches and decrypts the message.
    alice = await openAlice();
    await until(alice, (t) => [...document.querySelectorAll('.msg .text')].some((x) => x.textContent === t), text);
    assert(true, 'the reopened client syncs and decrypts the message');
    await until(alice, () => document.getElementById('push-state').dataset.state === 'on');
    assert(true, 'the reopened client hands the relay its subscription again');
    await alice.screenshot({ path: join(OUT, 'alice-after-push.png') });

    // Sign-out unsubscribes (relay and push manager) and forgets the keys.
    await alice.click('#open-settings');
    await alice.click('#sign-out');
    await until(alice, () => !document.getElementById('setup').classList.contains('hidden') && document.body.dataset.ready === 'true');
    const unsubscribed = await alice.evaluate(() => localStorage.getItem('stub.unsubscribed'));
    assert(unsubscribed === 'true', 'sign-out unsubscribed at the push manager');
    const before = pushes.length;
    await bob.type('#text', `After sign-out ${Date.now()}`);
    await bob.click('#send-form button');
    await until(bob, () => [...document.querySelectorAll('.ticks')].at(-1)?.dataset.status === 'target_accepted');
    await browser.close();
    await net.stop('relay-a');
    // The relay's own record: subscribed once, then unsubscribed by the client.
    const events = execFileSync(RELAY, ['audit', '--config', config, 'export', '--stream', `account/${aliceId}`])
      .toString()
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    const push_events = events.filter((e) => e.type.startsWith('push_')).map((e) => `${e.type}:${e.data[e.type].reason ?? e.data[e.type].subscription?.endpoint}`);
    log(`push events of Alice's account: ${push_events.join(', ')}`);
    assert(push_events[0] === `push_subscribed:${endpoint}` && push_events.at(-1) === 'push_unsubscribed:unsubscribed', 'the relay stored the subscription and its removal at sign-out');
    assert(pushes.length === before, 'no push after sign-out');
  } finally {
    await browser.close().catch(() => {});
    await net.stopAll('SIGKILL');
    service.close();
  }
}

function page_errors(page, who) {
  page.on('pageerror', (e) => log(`page error (${who}): ${e.message}`));
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error('[push] FAILED:', e);
    process.exit(1);
  },
);
