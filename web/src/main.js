// The relay web client: one account per browser profile, its keys in
// IndexedDB, messages end-to-end encrypted with relay-e2e/v1, realtime over
// the relay's WebSocket with SHiNE's delivery ticks.
//
// Nothing typed is lost: a message is stored in the outbox (IndexedDB)
// before anything touches the network, sealed once, and sent with the same
// message_id and bytes until a relay accepts it (message.send is idempotent
// on identical content), across reconnects and reloads.

import encodeQR from 'qr';
import * as e2e from './e2e.js';
import * as db from './store.js';
import * as backup from './backup.js';
import * as shortcode from './shortcode.js';
import { retryable, dayLabel, clockTime, listTime } from './rules.js';

const { b64uEncode: b64, b64uDecode: unb64 } = e2e;
const $ = (id) => document.getElementById(id);
const now = () => Math.floor(Date.now() / 1000);
const randomId = (bytes = 16) => b64(e2e.random(bytes));
const DAY = 86400;
const base = () => relay.public_url.replace(/\/$/, '');
// The QR decoder, loaded only where the browser has no BarcodeDetector (a
// name, not a literal: the bundler leaves it to load at run time).
const SCAN_MODULE = '/scan.js';
// How far a status has come: it never goes back (a late sync page or a
// notification overtaken by a newer one).
const RANK = { sending: 0, delivering: 1, target_accepted: 2, failed: 2 };
let relay; // {relay_id, public_url}
let me; // identity: seeds, ids and the display name
// account_id -> {account_id, account_key, state: accepted|request|blocked,
// nickname?, profile_name?, invite?, grant_from_them?, my_grant?, devices?, verified?}
let contacts = {};
let selected = null;
let ws = null;
let stopped = false; // signed out or revoked: no reconnect, no sending
const early = new Map(); // delivery notifications that overtook their send answer
// Messages show in the order this browser learned of them (the timeline's
// order for synced records); clocks of two machines do not order them.
let counter = 0;
const order = () => Date.now() * 1000 + (counter++ % 1000);

function showError(e) {
  const text = e ? String(e.message ?? e) : '';
  $('error-text').textContent = text;
  $('error').classList.toggle('hidden', !text);
}

// ---- transport -------------------------------------------------------------

async function http(method, params, token) {
  const headers = { 'content-type': 'application/json' };
  if (token) headers.authorization = `Bearer ${token}`;
  let r;
  try {
    r = await fetch(`/v1/rpc/${method}`, { method: 'POST', headers, body: JSON.stringify(params) });
  } catch {
    throw Object.assign(new Error(`${method}: the relay is unreachable`), { code: 'offline' });
  }
  const body = await r.json();
  if (!r.ok) throw Object.assign(new Error(`${method}: ${body.error?.code}: ${body.error?.message}`), body.error);
  return body;
}

/** A WebSocket with request ids; notifications go to `onNotify`. */
class Socket {
  constructor(url, onNotify, onClose) {
    this.next = 0;
    this.waiting = new Map();
    this.ready = new Promise((resolve, reject) => {
      this.ws = new WebSocket(url);
      this.ws.onopen = resolve;
      this.ws.onerror = () => reject(Object.assign(new Error('websocket failed'), { code: 'offline' }));
    });
    this.ws.onmessage = (ev) => {
      const f = JSON.parse(ev.data);
      if (f.id !== undefined && this.waiting.has(f.id)) {
        const { resolve, reject, method } = this.waiting.get(f.id);
        this.waiting.delete(f.id);
        if (f.error) reject(Object.assign(new Error(`${method}: ${f.error.code}: ${f.error.message}`), f.error));
        else resolve(f.result);
      } else if (f.method) {
        onNotify(f);
      }
    };
    this.ws.onclose = (ev) => {
      for (const { reject } of this.waiting.values()) reject(Object.assign(new Error('connection closed'), { code: 'offline' }));
      this.waiting.clear();
      onClose(ev);
    };
  }

  call(method, params) {
    const id = ++this.next;
    return new Promise((resolve, reject) => {
      this.waiting.set(id, { resolve, reject, method });
      this.ws.send(JSON.stringify({ id, method, params }));
    });
  }
}

const call = async (method, params) => {
  if (!ws) throw Object.assign(new Error('offline: the relay is unreachable'), { code: 'offline' });
  return ws.call(method, params);
};

// ---- identity ----------------------------------------------------------------

function keys() {
  if (!me.account_seed) throw new Error('this device was removed from the account');
  return {
    account: unb64(me.account_seed),
    device: unb64(me.device_seed),
    box: unb64(me.box_secret),
  };
}

function certificate(accountSeed, device) {
  const accountKey = e2e.publicKeyOf(accountSeed);
  return e2e.sign(
    'relay/v1/device-certificate',
    {
      account_id: e2e.accountIdOf(accountKey),
      account_key: b64(accountKey),
      device_id: device.device_id,
      device_key: device.device_key,
      box_key: device.box_key,
      issued_at: now(),
    },
    accountSeed,
  );
}

function newDevice() {
  const device_seed = e2e.random(32);
  const box_secret = e2e.random(32);
  return {
    device_id: `web-${randomId(6)}`,
    device_seed: b64(device_seed),
    box_secret: b64(box_secret),
    device_key: b64(e2e.publicKeyOf(device_seed)),
    box_key: b64(e2e.boxKeyOf(box_secret)),
  };
}

async function createAccount() {
  const accountSeed = e2e.random(32);
  const device = newDevice();
  const accountKey = e2e.publicKeyOf(accountSeed);
  const accountId = e2e.accountIdOf(accountKey);
  const issued = now();
  const route = e2e.sign(
    'relay/v1/route',
    {
      account_id: accountId,
      account_key: b64(accountKey),
      revision: 1,
      relays: [{ id: relay.relay_id, url: relay.public_url }],
      issued_at: issued,
    },
    accountSeed,
  );
  const registration = e2e.sign(
    'relay/v1/registration',
    { account_id: accountId, relay_id: relay.relay_id, public_discovery: false, issued_at: issued },
    accountSeed,
  );
  await http('account.register', {
    route,
    device_certificate: certificate(accountSeed, device),
    registration,
  });
  me = {
    account_id: accountId,
    account_key: b64(accountKey),
    account_seed: b64(accountSeed),
    device_id: device.device_id,
    device_seed: device.device_seed,
    box_secret: device.box_secret,
  };
  await db.put('identity', me);
  await start();
}

/** This account's contact link: a signed ContactInvite in the URL fragment. */
async function contactLink(fresh = false) {
  let invite = await db.get('invite');
  if (fresh || !invite || invite.expires_at < now() + DAY) {
    invite = e2e.sign(
      'relay/v1/contact-invite',
      { invite_id: randomId(), issuer: me.account_id, issued_at: now(), expires_at: now() + 30 * DAY },
      keys().account,
    );
    await db.put('invite', invite);
  }
  return `${base()}/#contact=${b64(e2e.utf8(JSON.stringify(invite)))}`;
}

async function showContactLink(fresh) {
  const link = await contactLink(fresh);
  $('contact-link').value = link;
  $('contact-qr').innerHTML = encodeQR(link, 'svg');
  await showContactCode();
}

/** The short code of the contact link, while it names the current invite. */
async function showContactCode() {
  const invite = await db.get('invite');
  const c = await db.get('contact-code');
  const live = c && invite && c.invite_id === invite.invite_id;
  $('contact-code').textContent = live ? shortcode.format(c.code) : '';
  $('contact-code-box').classList.toggle('hidden', !live);
  $('make-contact-code').textContent = live ? 'New short code' : 'Make a short code';
}

/**
 * A short code for the contact link: a pointer account on this relay
 * whose route carries the invite (see shortcode.js). It dies with the
 * invite (expiry, or a block that rotates the link).
 */
async function makeContactCode() {
  await contactLink();
  const invite = await db.get('invite');
  const code = shortcode.newCode();
  const k = shortcode.keysOf(code);
  await http('account.register', shortcode.pointer(k, relay, { kind: 'contact', invite }, b64(e2e.boxKeyOf(k.deviceSeed)), now()));
  await db.put('contact-code', { code, invite_id: invite.invite_id });
  await showContactCode();
}

/** What `code` names, from its pointer's route (looked up through this relay and its peers). */
async function lookup(code, kind) {
  const k = shortcode.keysOf(code);
  let route;
  try {
    route = await call('route.get', { account_id: k.accountId });
  } catch (e) {
    if (e.code === 'route_not_found' || e.code === 'not_found') throw new Error(`no ${shortcode.format(code)} is known: check the code`);
    throw e;
  }
  return { k, body: shortcode.read(route, k, kind) };
}

// ---- contacts ----------------------------------------------------------------

/** A contact's name as this person knows it; a short id only when none is known. */
const nameOf = (id) => contacts[id]?.nickname || contacts[id]?.profile_name || `${id.slice(0, 8)}…`;

/** The account key of `accountId`, from its signed route (checked here). */
async function accountKey(accountId) {
  if (contacts[accountId]?.account_key) return unb64(contacts[accountId].account_key);
  if (accountId === me.account_id && me.account_key) return unb64(me.account_key);
  const route = await call('route.get', { account_id: accountId });
  const key = unb64(route.account_key);
  if (route.account_id !== accountId || e2e.accountIdOf(key) !== accountId || !e2e.verify('relay/v1/route', route, key)) {
    throw new Error(`the route of ${accountId} does not verify`);
  }
  return key;
}

async function saveContacts() {
  await db.put('contacts', contacts);
}

/** The contact `accountId` (its key looked up once), created in `state`. */
async function ensureContact(accountId, state) {
  if (!contacts[accountId]) {
    const key = await accountKey(accountId);
    contacts[accountId] = { account_id: accountId, account_key: b64(key), state, added_at: order() };
    await saveContacts();
  }
  return contacts[accountId];
}

/** The grant that lets `c` write to this account; it rides along with what we send them. */
function grantFor(c) {
  c.my_grant ??= e2e.sign(
    'relay/v1/contact-grant',
    { grant_id: randomId(), grantor: me.account_id, grantee: c.account_id, issued_at: now() },
    keys().account,
  );
  return c.my_grant;
}

/** Adds the contact a link, a short code or a short-code link names. */
async function addContact(link, nickname) {
  const m = /#contact=([A-Za-z0-9_-]+)/.exec(link.trim());
  const code = shortcode.parse(m ? m[1] : link);
  let invite;
  if (code) invite = (await lookup(code, 'contact')).body.invite;
  else if (m) invite = JSON.parse(new TextDecoder().decode(unb64(m[1])));
  else throw new Error('not a contact link or code');
  if (invite.issuer === me.account_id) throw new Error('that is your own link');
  const key = await accountKey(invite.issuer);
  if (!e2e.verify('relay/v1/contact-invite', invite, key)) throw new Error('the invite does not verify');
  if (invite.expires_at <= now()) throw new Error('the invite has expired');
  const c = await ensureContact(invite.issuer, 'accepted');
  // Unblocking by adding them again: the grant they had was revoked.
  if (c.state === 'blocked') delete c.my_grant;
  Object.assign(c, { invite, state: 'accepted' });
  if (nickname) c.nickname = nickname;
  await saveContacts();
  open(invite.issuer);
}

/** Accepting a request: they get our grant (and name) in a `profile` message. */
async function accept(id) {
  contacts[id].state = 'accepted';
  await saveContacts();
  await queue(id, 'profile');
}

/**
 * Blocking: the relays refuse their next message. The grant we gave them
 * is revoked; when they reached us through our contact link (a request),
 * that link is revoked too and a new one made (an invite cannot be revoked
 * for one holder only).
 */
async function block(id) {
  const c = contacts[id];
  if (!confirm(`Block ${nameOf(id)}? They can no longer write to you.`)) return;
  if (c.my_grant) await call('contact.revoke', { grant_id: c.my_grant.grant_id });
  if (!c.invite) {
    const invite = await db.get('invite');
    if (invite) await call('contact.revoke', { invite_id: invite.invite_id });
    await showContactLink(true);
  }
  c.state = 'blocked';
  await saveContacts();
  selected = null;
  setView('list');
  render();
}

/**
 * The devices of an account that may receive, with certificates checked
 * under its account key. Kept per contact: when the contact's relay is down
 * this relay cannot ask it, and the message must still be accepted.
 */
async function devicesOf(accountId) {
  const key = await accountKey(accountId);
  let list;
  try {
    list = await call('account.devices.get', { account_id: accountId });
  } catch (e) {
    const cached = accountId === me.account_id ? await db.get('own-devices') : contacts[accountId]?.devices;
    if (cached) return cached;
    throw e;
  }
  const revoked = new Set(
    list.revocations.filter((r) => e2e.verify('relay/v1/device-revocation', r, key)).map((r) => r.device_id),
  );
  const devices = list.certificates.filter(
    (c) => c.account_id === accountId && !revoked.has(c.device_id) && e2e.verify('relay/v1/device-certificate', c, key),
  );
  if (accountId === me.account_id) await db.put('own-devices', devices);
  else if (contacts[accountId]) {
    contacts[accountId].devices = devices;
    await saveContacts();
  }
  return devices;
}

// ---- outbox ------------------------------------------------------------------

/** Stores a message to `peer` first (so nothing is lost), then lets the outbox send it. */
async function queue(peer, kind, text) {
  const m = { message_id: randomId(), peer, direction: 'sent', kind, text, at: order(), ts: now(), status: 'sending', read: true };
  await db.putMessage(m);
  render();
  flush();
  return m;
}

/** The plaintext of an outgoing message: our grant and name ride along. */
function plaintextOf(m, c) {
  const grant = grantFor(c);
  const profile = me.name ? { name: me.name } : undefined;
  if (m.kind === 'profile') return e2e.jcs({ type: 'profile', name: me.name ?? null, grant });
  return e2e.textPlaintext(m.text, profile ? { grant, profile } : { grant });
}

/** The `message.send` params of `m`, sealed once and kept: a retry sends the same bytes. */
async function sealed(m) {
  if (m.params) return m.params;
  const c = contacts[m.peer];
  const [theirs, mine] = await Promise.all([devicesOf(c.account_id), devicesOf(me.account_id)]);
  const target = (list) => list.map((d) => ({ device_id: d.device_id, box_key: unb64(d.box_key) }));
  const all = [...target(theirs), ...target(mine)];
  const box = e2e.encrypt(m.message_id, plaintextOf(m, c), all);
  const envelope = e2e.sign(
    'relay/v1/envelope',
    { message_id: m.message_id, from: me.account_id, from_device_id: me.device_id, to: c.account_id, created_at: now(), ciphertext: box.ciphertext },
    keys().device,
  );
  const params = { envelope, recipient_boxes: box.boxes.slice(0, theirs.length), sender_boxes: box.boxes.slice(theirs.length) };
  if (c.grant_from_them) params.authorization = { contact_grant: c.grant_from_them };
  else if (c.invite) params.authorization = { contact_invite: c.invite };
  await saveContacts(); // the grant made for it
  m.params = params;
  await db.putMessage(m);
  return params;
}

let flushing = null;
let flushAgain = false;
let flushTimer = null;
/** Sends every queued message in order; stops at the first transient failure (retried later). */
function flush() {
  if (flushing) {
    flushAgain = true;
    return flushing;
  }
  flushing = (async () => {
    do {
      flushAgain = false;
      // One sender per browser profile: another tab of it seals and sends
      // under the same lock, so a message is sealed once (twice would be
      // two ciphertexts under one message_id: state_conflict).
      await navigator.locks.request('relay-outbox', flushOnce);
    } while (flushAgain);
  })().finally(() => {
    flushing = null;
  });
  return flushing;
}

async function flushOnce() {
  if (stopped || !ws) return;
  const queued = (await db.messages()).filter((m) => m.direction === 'sent' && m.status === 'sending').sort((a, b) => a.at - b.at);
  for (const m of queued) {
    try {
      const status = await call('message.send', await sealed(m));
      await setStatus(m.message_id, status.status, status.error);
    } catch (e) {
      const code = e.code ?? 'offline';
      // An expired session: a new connection opens a new one.
      if (code === 'unauthorized') ws?.ws.close();
      if (retryable(code)) {
        // Stays queued: the next connection, or this timer, sends it again.
        clearTimeout(flushTimer);
        flushTimer = setTimeout(flush, code === 'rate_limited' ? 1000 * (e.data?.retry_after ?? 5) : 3000);
        return;
      }
      await setStatus(m.message_id, 'failed', { code, message: e.message });
    }
  }
}

/** A failed message, tried again: a new message_id, sealed anew (the relay refused the old one). */
async function retry(messageId) {
  const m = await db.message(messageId);
  await db.deleteMessage(messageId);
  await db.putMessage({ ...m, message_id: randomId(), params: undefined, status: 'sending', error: null, at: order(), ts: now() });
  render();
  flush();
}

async function setStatus(messageId, status, error) {
  const m = await db.message(messageId);
  if (!m) {
    early.set(messageId, { status, error });
    return;
  }
  if (RANK[status] < RANK[m.status]) return;
  m.status = status;
  m.error = error ?? null;
  if (status !== 'sending') delete m.params;
  await db.putMessage(m);
  render();
}

// ---- receiving ---------------------------------------------------------------

/** Reads one timeline record: verified, decrypted, stored. Returns a message to announce, if any. */
async function readRecord(r) {
  const env = r.envelope;
  const peer = r.direction === 'sent' ? env.to : env.from;
  if (contacts[peer]?.state === 'blocked') return null;
  const known = await db.message(env.message_id);
  let text;
  let kind = 'text';
  try {
    const senders = await devicesOf(env.from);
    const cert = senders.find((d) => d.device_id === env.from_device_id);
    if (!cert) throw new Error('no certificate for the sending device');
    const plain = e2e.openRecord(r, unb64(cert.device_key), me.device_id, keys().box);
    const msg = e2e.readPlaintext(plain);
    if (msg.type === 'text' && typeof msg.text === 'string') text = msg.text;
    else if (msg.type === 'profile') kind = 'profile';
    else kind = 'unsupported';
    // Someone who writes first is a request until accepted.
    const c = await ensureContact(peer, r.direction === 'received' ? 'request' : 'accepted');
    if (r.direction === 'received') {
      const g = msg.grant;
      if (g && g.grantor === env.from && g.grantee === me.account_id && e2e.verify('relay/v1/contact-grant', g, await accountKey(env.from))) {
        c.grant_from_them = g;
      }
      const name = kind === 'profile' ? msg.name : msg.profile?.name;
      if (typeof name === 'string' && name.trim()) c.profile_name = name.trim().slice(0, 64);
      await saveContacts();
    }
  } catch (e) {
    kind = 'unreadable';
    text = `cannot be shown: ${e.message}`;
  }
  const m = known ?? { message_id: env.message_id, peer, direction: r.direction, at: order(), ts: env.created_at, status: null, read: r.direction === 'sent' };
  if (!known || kind !== 'text' || known.text === undefined) Object.assign(m, { text, kind });
  if (r.delivery && RANK[r.delivery.status] >= RANK[m.status ?? 'sending']) {
    m.status = r.delivery.status;
    m.error = r.delivery.error ?? null;
  }
  const e = early.get(env.message_id);
  if (e && RANK[e.status] >= RANK[m.status ?? 'sending']) Object.assign(m, { status: e.status, error: e.error ?? null });
  early.delete(env.message_id);
  if (m.status && m.status !== 'sending') delete m.params; // accepted: the outbox is done with it
  await db.putMessage(m);
  if (!selected && r.direction === 'received') selected = peer;
  return !known && r.direction === 'received' && kind !== 'profile' ? m : null;
}

let syncing = Promise.resolve();
/** Syncs from the acked cursor and acks what was stored (one at a time). */
function sync() {
  syncing = syncing
    .then(async () => {
      let cursor = (await db.get('cursor')) ?? 0;
      for (;;) {
        const page = await call('message.timeline.sync', { after: cursor, limit: 100 });
        for (const r of page.records) {
          const fresh = await readRecord(r);
          if (fresh) announce(fresh);
        }
        if (page.next > cursor) {
          await call('message.timeline.ack', { through: page.next });
          cursor = page.next;
          await db.put('cursor', cursor);
        }
        render();
        if (!page.has_more) return;
      }
    })
    .catch(showError);
  return syncing;
}

/** A desktop notification for a new message while this tab is hidden. */
function announce(m) {
  if (document.visibilityState !== 'hidden' || !('Notification' in window) || Notification.permission !== 'granted') return;
  const c = contacts[m.peer];
  if (!c || c.state === 'blocked') return;
  const n = new Notification(c.state === 'request' ? `Request from ${nameOf(m.peer)}` : nameOf(m.peer), {
    body: m.kind === 'text' ? m.text : 'New message',
    tag: `relay-${m.peer}`,
  });
  n.onclick = () => {
    window.focus();
    open(m.peer);
  };
}

// ---- session -----------------------------------------------------------------

async function openSession(account_id, device_id, deviceSeed) {
  const ch = await http('session.challenge', { account_id, device_id });
  const body = { account_id, device_id, challenge: ch.challenge, relay_id: relay.relay_id };
  const s = await http('session.open', { account_id, device_id, challenge: ch.challenge, signature: e2e.sessionProof(deviceSeed, body) });
  return s.token;
}

function wsUrl() {
  const url = new URL('/v1/ws', location.href);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  return url;
}

function setConn(text) {
  $('conn').textContent = text;
  $('conn').dataset.state = text;
}

/** Connects and attaches; on any close, reconnects, syncs from the cursor and sends the outbox. */
async function connect() {
  if (stopped) return;
  try {
    const token = await openSession(me.account_id, me.device_id, keys().device);
    const socket = new Socket(wsUrl(), onNotify, () => {
      if (ws === socket) ws = null;
      if (stopped) return;
      setConn('offline');
      setTimeout(connect, 1000);
    });
    await socket.ready;
    await socket.call('session.attach', { token });
    ws = socket;
    setConn('online');
    flush();
    await sync();
    renderDevices().catch(showError);
    // Subscribed before (permission granted): hand the relay the current
    // subscription again (it may be new, or the relay may have dropped it).
    if (pushSupported() && Notification.permission === 'granted') enablePush().catch(pushFailed);
  } catch (e) {
    if (e.code === 'device_unknown') return revoked();
    setConn('offline');
    if (e.code === 'unauthorized') showError(`this device cannot sign in: ${e.message}`);
    setTimeout(connect, 2000);
  }
}

/**
 * The relay no longer knows this device (revoked from another one): it
 * stops, forgets the account key it was given (it can no longer sign for
 * the account) and marks its queued messages as not sent.
 */
async function revoked() {
  stopped = true;
  setConn('revoked');
  $('banner').textContent = 'This device was removed from the account. It can no longer send or receive; the messages already here stay readable.';
  $('banner').classList.remove('hidden');
  $('text').disabled = true;
  $('text').placeholder = 'This device was removed from the account';
  if (me.account_seed) {
    delete me.account_seed;
    await db.put('identity', me);
  }
  for (const m of await db.messages()) {
    if (m.direction === 'sent' && m.status === 'sending') {
      await setStatus(m.message_id, 'failed', { code: 'device_revoked', message: 'this device was removed from the account' });
    }
  }
  render();
}

function onNotify(n) {
  if (n.method === 'message.timeline.changed') sync();
  else if (n.method === 'message.delivery.changed') setStatus(n.params.message_id, n.params.status, n.params.error).catch(showError);
}

// ---- Web Push (PROTOCOL §9) ----------------------------------------------------

const pushSupported = () => 'serviceWorker' in navigator && 'PushManager' in window && 'Notification' in window;

function setPush(state, detail) {
  $('push-state').textContent = detail ? `${state}: ${detail}` : state;
  $('push-state').dataset.state = state;
}

function pushFailed(e) {
  setPush('failed', e.message ?? String(e));
}

/** The service worker (`/sw.js`, served by the relay), registered once: push, and the page offline. */
let worker = null;
function registerWorker() {
  if (!('serviceWorker' in navigator)) return null;
  worker ??= navigator.serviceWorker.register('/sw.js', { scope: '/' }).then(() => navigator.serviceWorker.ready);
  return worker;
}

const sameKey = (a, b) => {
  if (!a || a.byteLength !== b.byteLength) return false;
  const x = new Uint8Array(a);
  return x.every((v, i) => v === b[i]);
};

/**
 * Subscribes this browser with the relay's VAPID key (an old subscription
 * under another key is replaced) and binds it to this device at the relay.
 * The relay then wakes this browser when a record for this device arrives
 * and no page of it is connected.
 */
async function enablePush() {
  if (!pushSupported()) throw new Error('this browser has no Web Push');
  setPush('subscribing');
  const permission = await Notification.requestPermission();
  if (permission !== 'granted') throw new Error(`notifications are ${permission}`);
  const reg = await registerWorker();
  const { public_key } = await call('push.vapid_key', {});
  const key = unb64(public_key);
  let sub = await reg.pushManager.getSubscription();
  if (sub && !sameKey(sub.options?.applicationServerKey, key)) {
    await sub.unsubscribe();
    sub = null;
  }
  sub ??= await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key });
  const { endpoint, keys: k } = sub.toJSON();
  await call('push.subscribe', { endpoint, keys: { p256dh: k.p256dh, auth: k.auth } });
  setPush('on');
}

/** Stops pushes to this browser: at the relay, then at the push service. */
async function disablePush() {
  try {
    if (ws) await call('push.unsubscribe', {});
  } finally {
    // Whatever the relay answered: the browser's subscription must not
    // outlive the account here (the next account would inherit it).
    const reg = pushSupported() ? await navigator.serviceWorker.getRegistration('/') : null;
    const sub = await reg?.pushManager.getSubscription();
    await sub?.unsubscribe();
    setPush('off');
  }
}

/**
 * Sign-out: this browser stops getting pushes and forgets the account's
 * keys, contacts and messages (other devices of the account keep theirs).
 */
async function signOut() {
  if (!confirm('Sign out? This browser forgets the account keys and messages; another device of the account can link it again.')) return;
  try {
    await disablePush();
  } catch (e) {
    // Signing out goes on: the relay drops the subscription when the
    // device is revoked, or when the push service reports it gone.
    console.warn('push unsubscribe', e);
  }
  stopped = true;
  ws?.ws.close();
  await db.wipe();
  location.replace('/');
}

// ---- devices -----------------------------------------------------------------

async function renderDevices() {
  const list = await devicesOf(me.account_id);
  const ul = $('devices');
  ul.replaceChildren();
  for (const d of list) {
    const li = document.createElement('li');
    li.dataset.deviceId = d.device_id;
    li.append(Object.assign(document.createElement('code'), { textContent: d.device_id }));
    if (d.device_id === me.device_id) li.append(' (this browser)');
    else {
      const b = Object.assign(document.createElement('button'), { textContent: 'Remove' });
      b.setAttribute('aria-label', `Remove the device ${d.device_id}`);
      b.onclick = act(() => revoke(d.device_id));
      li.append(' ', b);
    }
    ul.append(li);
  }
}

async function revoke(deviceId) {
  const revocation = e2e.sign('relay/v1/device-revocation', { account_id: me.account_id, device_id: deviceId, revoked_at: now() }, keys().account);
  await call('device.revoke', { revocation });
  await renderDevices();
}

/**
 * A new browser's request, named by a short code (and its link and QR
 * code): the code's pointer account on this relay carries the browser's
 * public keys and a one-time X25519 key, and is its mailbox for the answer
 * (see shortcode.js). Both browsers show a six-digit code.
 */
async function linkStart() {
  let pending = await db.get('pending-link');
  if (!pending?.code) {
    const link_secret = e2e.random(32);
    pending = { ...newDevice(), link_secret: b64(link_secret), link_key: b64(e2e.boxKeyOf(link_secret)), code: shortcode.newCode() };
    await db.put('pending-link', pending);
  }
  if (!pending.registered) {
    const { device_id, device_key, box_key, link_key } = pending;
    const body = { kind: 'device-link', device_id, device_key, box_key, link_key };
    await http('account.register', shortcode.pointer(shortcode.keysOf(pending.code), relay, body, link_key, now()));
    pending.registered = true;
    await db.put('pending-link', pending);
  }
  const request = `${base()}/#link=${pending.code}`;
  $('link-short').textContent = shortcode.format(pending.code);
  $('link-request').value = request;
  $('link-request-qr').innerHTML = encodeQR(request, 'svg');
  $('link-code-here').textContent = e2e.linkCode(pending.link_key);
  $('link-new').classList.remove('hidden');
  $('link-start').classList.add('hidden');
  mailbox(pending);
}

let mailboxSocket = null; // the socket, 'connecting', or null
/**
 * The new browser waits at its pointer account for the answer: a session
 * as the pointer's device, then `message.timeline.sync` on every
 * `message.timeline.changed` and on each (re)connection.
 */
async function mailbox(pending) {
  if (mailboxSocket || me) return; // waiting already, or linked (a retry timer that fired late)
  mailboxSocket = 'connecting';
  const k = shortcode.keysOf(pending.code);
  const again = (sock) => {
    if (mailboxSocket !== sock) return; // stopped, or already retrying
    mailboxSocket = null;
    $('link-wait').textContent = 'Waiting for the relay…';
    setTimeout(() => mailbox(pending), 2000);
  };
  let sock = 'connecting';
  try {
    const token = await openSession(k.accountId, shortcode.DEVICE_ID, k.deviceSeed);
    sock = new Socket(wsUrl(), (n) => n.method === 'message.timeline.changed' && readMailbox(sock, pending), () => again(sock));
    mailboxSocket = sock;
    await sock.ready;
    await sock.call('session.attach', { token });
    $('link-wait').textContent = 'Waiting for the answer…';
    readMailbox(sock, pending);
  } catch (e) {
    console.warn('mailbox', e);
    if (typeof sock === 'object') sock.ws.close();
    again(sock);
  }
}

function stopMailbox() {
  const s = mailboxSocket;
  mailboxSocket = null;
  if (typeof s === 'object') s?.ws.close();
}

let mailboxReading = Promise.resolve();
/** Reads the pointer's timeline; the first complete answer that certifies this browser links it. */
function readMailbox(sock, pending) {
  mailboxReading = mailboxReading
    .then(async () => {
      if (mailboxSocket !== sock) return;
      const parts = [];
      const certs = new Map();
      let after = 0;
      for (;;) {
        const page = await sock.call('message.timeline.sync', { after, limit: 500 });
        for (const r of page.records) {
          const env = r.envelope;
          if (r.direction !== 'received' || r.box?.device_id !== shortcode.DEVICE_ID) continue;
          try {
            if (!certs.has(env.from)) certs.set(env.from, (await sock.call('account.devices.get', { account_id: env.from })).certificates);
            const cert = certs.get(env.from).find((c) => c.device_id === env.from_device_id);
            const p = e2e.readPlaintext(e2e.openRecord(r, unb64(cert.device_key), shortcode.DEVICE_ID, unb64(pending.link_secret)));
            if (p.type === 'device-link' && p.link === pending.device_id) parts.push({ ...p, from: env.from, cert });
          } catch (e) {
            console.warn('not a link answer', env.message_id, e);
          }
        }
        after = page.next;
        if (!page.has_more) break;
      }
      // The parts of one answer come from one account.
      for (const from of new Set(parts.map((p) => p.from))) {
        const mine = parts.filter((p) => p.from === from);
        const bytes = shortcode.join(mine);
        if (!bytes) continue;
        try {
          await linkFinish(JSON.parse(new TextDecoder().decode(bytes)), from, mine.map((p) => p.cert));
          stopMailbox();
          return;
        } catch (e) {
          console.warn('a link answer was refused', e);
        }
      }
    })
    .catch(showError);
}

/**
 * On a browser with the account: looks up the request a code names,
 * certifies the new device (signed by the account key), adds it, and
 * sends the answer — the certificate, the account key, contacts and the
 * conversations so far — to the request's pointer account with
 * `message.send`, sealed to its one-time key (relay-e2e/v1), in parts
 * under the relay's ciphertext limit. The pointer's invite is signed with
 * the key derived from the code.
 */
async function linkApprove(input) {
  const m = /#link=([A-Za-z0-9_-]+)/.exec(input);
  const code = shortcode.parse(m ? m[1] : input);
  if (!code) throw new Error('not a device-link code');
  const { k, body: req } = await lookup(code, 'device-link');
  if (!confirm(`Link the browser that shows the code ${e2e.linkCode(req.link_key)}? It gets your account key and your conversations.`)) return;
  // Approving again (a send failed half-way) keeps the certificate on file.
  const known = (await devicesOf(me.account_id)).find((d) => d.device_id === req.device_id);
  if (known && (known.device_key !== req.device_key || known.box_key !== req.box_key)) throw new Error(`this account already has a device ${req.device_id}`);
  const cert = known ?? certificate(keys().account, req);
  if (!known) await call('device.add', { device_certificate: cert });
  const history = (await db.messages())
    .filter((x) => x.kind === 'text' && x.status !== 'sending')
    .map(({ message_id, peer, direction, text, kind, at, ts, status }) => ({ message_id, peer, direction, text, kind, at, ts, status, read: true }));
  const answer = e2e.utf8(JSON.stringify({ certificate: cert, account_seed: me.account_seed, name: me.name, invite: await db.get('invite'), contacts, history }));
  const invite = e2e.sign('relay/v1/contact-invite', { invite_id: randomId(), issuer: k.accountId, issued_at: now(), expires_at: now() + DAY }, k.accountSeed);
  const data = shortcode.split(answer);
  for (const [part, chunk] of data.entries()) {
    const message_id = randomId();
    const plaintext = e2e.jcs({ type: 'device-link', link: req.device_id, part, parts: data.length, data: chunk });
    const box = e2e.encrypt(message_id, plaintext, [{ device_id: shortcode.DEVICE_ID, box_key: unb64(req.link_key) }]);
    const envelope = e2e.sign(
      'relay/v1/envelope',
      { message_id, from: me.account_id, from_device_id: me.device_id, to: k.accountId, created_at: now(), ciphertext: box.ciphertext },
      keys().device,
    );
    await call('message.send', { envelope, recipient_boxes: box.boxes, authorization: { contact_invite: invite } });
  }
  $('link-code').value = '';
  $('link-sent').textContent = `Sent to the browser showing ${e2e.linkCode(req.link_key)} (${data.length} part${data.length > 1 ? 's' : ''}); it continues by itself.`;
  await renderDevices();
}

/** The new browser takes an answer that certifies it, from the account it hands over. */
async function linkFinish(a, from, senderCerts) {
  const pending = await db.get('pending-link');
  const accountKey = e2e.publicKeyOf(unb64(a.account_seed));
  const cert = a.certificate;
  if (!e2e.verify('relay/v1/device-certificate', cert, accountKey) || cert.device_key !== pending.device_key || cert.box_key !== pending.box_key) {
    throw new Error('the answer does not certify this browser');
  }
  // Sent by a device of the account it hands over.
  if (e2e.accountIdOf(accountKey) !== from || !senderCerts.every((c) => c.account_id === from && e2e.verify('relay/v1/device-certificate', c, accountKey))) {
    throw new Error('the answer does not come from the account it names');
  }
  me = {
    account_id: e2e.accountIdOf(accountKey),
    account_key: b64(accountKey),
    account_seed: a.account_seed,
    device_id: pending.device_id,
    device_seed: pending.device_seed,
    box_secret: pending.box_secret,
    name: a.name,
  };
  if (a.invite) await db.put('invite', a.invite);
  contacts = a.contacts ?? {};
  await saveContacts();
  for (const m of a.history ?? []) await db.putMessage(m);
  await db.put('identity', me);
  await db.put('pending-link', null);
  $('link-new').classList.add('hidden');
  await start();
}

// ---- scanning ----------------------------------------------------------------

let scanning = null; // {stream, timer}

/**
 * Reads a QR code with the camera: the browser's BarcodeDetector where it
 * has one for QR codes, else the `qr` package's decoder (loaded only then)
 * on frames drawn to a canvas. The first code read goes to `done`;
 * pasting or typing stays the way without a camera.
 */
async function scan(done) {
  stopScan();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ video: { facingMode: 'environment' }, audio: false });
  } catch (e) {
    throw new Error(`no camera (${e.name ?? e.message}): paste or type the code instead`);
  }
  scanning = { stream, timer: null };
  const video = $('scan-video');
  video.srcObject = stream;
  $('scanner').classList.remove('hidden');
  $('scan-stop').focus();
  let decode;
  try {
    await video.play();
    decode = await decoder();
  } catch (e) {
    stopScan(); // the camera goes off with the error (e.g. the decoder could not be loaded)
    throw e;
  }
  const tick = async () => {
    if (scanning?.stream !== stream) return;
    let text = null;
    try {
      text = await decode(video);
    } catch (e) {
      console.warn('scan', e);
    }
    if (scanning?.stream !== stream) return;
    if (!text) {
      scanning.timer = setTimeout(tick, 150);
      return;
    }
    stopScan();
    await done(text);
  };
  tick().catch(showError);
}

function stopScan() {
  if (!scanning) return;
  clearTimeout(scanning.timer);
  for (const t of scanning.stream.getTracks()) t.stop();
  scanning = null;
  $('scan-video').srcObject = null;
  $('scanner').classList.add('hidden');
}

/** A function from a video element to the text of a QR code in view, or null. */
async function decoder() {
  const native = 'BarcodeDetector' in window && (await BarcodeDetector.getSupportedFormats().catch(() => [])).includes('qr_code');
  if (native) {
    document.body.dataset.scanner = 'BarcodeDetector';
    const d = new BarcodeDetector({ formats: ['qr_code'] });
    return async (video) => (await d.detect(video))[0]?.rawValue ?? null;
  }
  const { decodeQR } = await import(SCAN_MODULE);
  document.body.dataset.scanner = 'qr';
  const canvas = document.createElement('canvas');
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  return async (video) => {
    const { videoWidth: w, videoHeight: h } = video;
    if (!w || !h) return null;
    canvas.width = w;
    canvas.height = h;
    ctx.drawImage(video, 0, 0, w, h);
    try {
      return decodeQR(ctx.getImageData(0, 0, w, h));
    } catch {
      return null; // no code in this frame
    }
  };
}

// ---- backup ------------------------------------------------------------------

async function downloadBackup() {
  const pass = $('backup-pass').value;
  if (pass.length < 10) throw new Error('the passphrase needs at least 10 characters');
  const state = {
    identity: me,
    contacts,
    invite: await db.get('invite'),
    cursor: (await db.get('cursor')) ?? 0,
    messages: (await db.messages()).filter((m) => m.status !== 'sending' || m.direction !== 'sent'),
  };
  const file = await backup.seal(pass, state);
  const a = Object.assign(document.createElement('a'), {
    href: URL.createObjectURL(new Blob([file], { type: 'application/json' })),
    download: `relay-backup-${me.account_id.slice(0, 8)}.json`,
  });
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
  $('backup-pass').value = '';
}

async function restore() {
  const file = $('restore-file').files[0];
  if (!file) throw new Error('choose the backup file');
  const state = await backup.open($('restore-pass').value, await file.text());
  await db.put('invite', state.invite);
  await db.put('contacts', state.contacts);
  await db.put('cursor', state.cursor);
  for (const m of state.messages) await db.putMessage(m);
  me = state.identity;
  await db.put('identity', me);
  await start();
}

// ---- rendering ---------------------------------------------------------------

function ticks(m) {
  const span = document.createElement('span');
  span.className = 'ticks';
  span.dataset.status = m.status ?? 'sending';
  const [text, title] = {
    delivering: ['✓', 'Accepted by your relay'],
    target_accepted: ['✓✓', "Accepted by the recipient's relay (not a read receipt)"],
    failed: [`✗ ${m.error?.code ?? 'failed'}`, `Not sent: ${m.error?.message ?? 'failed'}`],
  }[m.status] ?? ['🕓', 'Sending: kept in this browser until a relay accepts it'];
  span.textContent = text;
  span.title = title;
  span.setAttribute('aria-label', title);
  return span;
}

const visible = (m) => m.kind !== 'profile';

// One render at a time; a render asked for meanwhile runs once more after
// it, so the last change (e.g. a tick) always reaches the page.
let rendering = null;
let again = false;
function render() {
  if (rendering) {
    again = true;
    return rendering;
  }
  rendering = (async () => {
    do {
      again = false;
      await draw();
    } while (again);
  })().finally(() => {
    rendering = null;
  });
  return rendering;
}

let drawnPeer = null;

function setView(view) {
  document.body.dataset.view = view;
}

async function draw() {
  if (!me) return;
  const all = (await db.messages()).filter(visible).sort((a, b) => a.at - b.at || (a.message_id < b.message_id ? -1 : 1));
  // Reading the open conversation while the page is in view marks it read.
  const reading = document.visibilityState === 'visible' && document.body.dataset.view === 'chat';
  for (const m of all) {
    if (!m.read && reading && m.peer === selected) {
      m.read = true;
      await db.putMessage(m);
    }
  }
  const last = {};
  const unread = {};
  for (const m of all) {
    last[m.peer] = m;
    if (!m.read) unread[m.peer] = (unread[m.peer] ?? 0) + 1;
  }
  const listed = Object.values(contacts)
    .filter((c) => c.state !== 'blocked')
    .sort((a, b) => (last[b.account_id]?.at ?? b.added_at ?? 0) - (last[a.account_id]?.at ?? a.added_at ?? 0));
  const ul = $('conversations');
  ul.replaceChildren();
  for (const c of listed) {
    const id = c.account_id;
    const b = document.createElement('button');
    b.dataset.accountId = id;
    b.className = id === selected ? 'active' : '';
    const name = Object.assign(document.createElement('span'), { className: 'name', textContent: nameOf(id) });
    if (c.state === 'request') name.append(Object.assign(document.createElement('span'), { className: 'tag', textContent: 'request' }));
    if (c.verified === c.account_key) name.append(Object.assign(document.createElement('span'), { className: 'tag', textContent: 'verified' }));
    const l = last[id];
    b.append(
      name,
      Object.assign(document.createElement('span'), { className: 'time', textContent: l ? listTime(l.ts ?? now(), now()) : '' }),
      Object.assign(document.createElement('span'), { className: 'preview', textContent: l ? `${l.direction === 'sent' ? 'You: ' : ''}${l.text ?? ''}` : 'No messages yet' }),
    );
    if (unread[id]) {
      b.append(Object.assign(document.createElement('span'), { className: 'unread', textContent: String(unread[id]) }));
      b.setAttribute('aria-label', `${nameOf(id)}, ${unread[id]} unread`);
    }
    b.onclick = () => open(id);
    const li = document.createElement('li');
    li.append(b);
    ul.append(li);
  }
  $('no-conversations').classList.toggle('hidden', listed.length > 0);
  const total = listed.reduce((n, c) => n + (unread[c.account_id] ?? 0), 0);
  badge(total);

  const c = selected && contacts[selected];
  $('peer').textContent = c ? nameOf(selected) : 'No conversation selected';
  $('peer').title = selected ?? '';
  $('peer').dataset.accountId = selected ?? '';
  for (const id of ['rename', 'verify', 'block', 'send-form']) $(id).classList.toggle('hidden', !c);
  $('request-bar').classList.toggle('hidden', c?.state !== 'request');
  if (c?.state === 'request') $('request-text').textContent = `${nameOf(selected)} is not in your contacts. Accept to answer, or block them.`;
  const box = $('messages');
  const scrolled = box.scrollTop;
  box.replaceChildren();
  let day = null;
  for (const m of all.filter((x) => x.peer === selected)) {
    const label = dayLabel(m.ts ?? now(), now());
    if (label !== day) {
      day = label;
      box.append(Object.assign(document.createElement('div'), { className: 'day', textContent: label }));
    }
    const div = document.createElement('div');
    div.className = `msg ${m.direction}`;
    div.dataset.messageId = m.message_id;
    div.append(Object.assign(document.createElement('span'), { className: 'text', textContent: m.text ?? '' }));
    const meta = Object.assign(document.createElement('span'), { className: 'meta', textContent: clockTime(m.ts ?? now()) });
    if (m.direction === 'sent') meta.append(ticks(m));
    if (m.direction === 'sent' && m.status === 'failed' && m.error?.code !== 'device_revoked') {
      const r = Object.assign(document.createElement('button'), { className: 'retry', textContent: 'Retry', type: 'button' });
      r.onclick = act(() => retry(m.message_id));
      meta.append(r);
    }
    div.append(meta);
    box.append(div);
  }
  // Follows new messages unless the reader scrolled up in the same conversation.
  box.scrollTop = pinned || drawnPeer !== selected ? box.scrollHeight : scrolled;
  drawnPeer = selected;
}

// Whether the conversation is scrolled to its end: new messages and a
// resized window (a phone's keyboard) keep it there.
let pinned = true;
function followMessages() {
  const box = $('messages');
  box.addEventListener('scroll', () => {
    pinned = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
  });
  new ResizeObserver(() => {
    if (pinned) box.scrollTop = box.scrollHeight;
  }).observe(box);
}

/** The unread total in the tab title and favicon. */
function badge(total) {
  document.title = total ? `(${total}) relay` : 'relay';
  const dot = total ? `<circle cx='22' cy='10' r='10' fill='%23d93025'/><text x='22' y='14.5' font-size='13' text-anchor='middle' fill='white' font-family='sans-serif'>${total > 9 ? '9+' : total}</text>` : '';
  $('favicon').href = `data:image/svg+xml,<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 32 32'><rect x='2' y='6' width='24' height='20' rx='5' fill='%231f5fb8'/>${dot}</svg>`;
}

function open(id) {
  selected = id;
  $('safety-box').classList.add('hidden');
  showPane('conversation');
  render();
}

function showPane(which) {
  $('conversation').classList.toggle('hidden', which !== 'conversation');
  $('settings').classList.toggle('hidden', which !== 'settings');
  setView(which === 'conversation' ? 'chat' : which);
}

// ---- start -------------------------------------------------------------------

/** A link opened in a browser that has an account: a contact ready to add, or a device to approve. */
function takeLink() {
  if (location.hash.startsWith('#contact=')) {
    $('add-link').value = location.href;
    if (!matchMedia('(min-width: 701px)').matches) setView('list');
    $('add-name').focus();
  } else if (location.hash.startsWith('#link=') && me.account_seed) {
    $('link-code').value = location.href;
    showPane('settings');
  }
}

async function start() {
  $('setup').classList.add('hidden');
  $('side').classList.remove('hidden');
  $('open-settings').classList.remove('hidden');
  $('account-id').textContent = me.account_id;
  $('device-id').textContent = me.device_id;
  me.account_key ??= me.account_seed && b64(e2e.publicKeyOf(unb64(me.account_seed)));
  $('my-name').value = me.name ?? '';
  contacts = (await db.get('contacts')) ?? {};
  // A wide screen opens the latest conversation; a phone shows the list.
  const latest = (await db.messages()).filter(visible).sort((a, b) => b.at - a.at)[0];
  selected = latest?.peer ?? Object.keys(contacts)[0] ?? null;
  if (matchMedia('(min-width: 701px)').matches) showPane('conversation');
  else setView('list');
  if (me.account_seed) await showContactLink();
  await render();
  registerWorker()?.catch(pushFailed);
  if (!me.account_seed) return revoked();
  connect();
  takeLink();
  window.addEventListener('hashchange', takeLink);
}

const act = (f) => (ev) => {
  ev?.preventDefault();
  showError(null);
  f().catch(showError);
};

async function boot() {
  relay = await (await fetch('/client.json')).json();
  $('relay-name').textContent = relay.relay_id;
  window.relayE2E = e2e; // for the browser test's vector check, and curious users
  $('error-close').onclick = () => showError(null);
  followMessages();
  $('create').onclick = act(createAccount);
  $('link-start').onclick = act(linkStart);
  $('make-contact-code').onclick = act(makeContactCode);
  $('scan-contact').onclick = act(() =>
    scan(async (text) => {
      $('add-link').value = text;
      $('add-name').focus();
    }),
  );
  $('scan-link').onclick = act(() =>
    scan(async (text) => {
      $('link-code').value = text;
      await linkApprove(text);
    }),
  );
  $('scan-stop').onclick = () => stopScan();
  $('scanner').onkeydown = (ev) => ev.key === 'Escape' && stopScan();
  $('link-approve').onclick = act(() => linkApprove($('link-code').value));
  $('restore').onclick = act(restore);
  $('backup').onclick = act(downloadBackup);
  $('add-form').onsubmit = act(async () => {
    await addContact($('add-link').value, $('add-name').value.trim());
    $('add-link').value = '';
    $('add-name').value = '';
  });
  $('push-enable').onclick = act(() => enablePush().catch(pushFailed));
  $('sign-out').onclick = act(signOut);
  $('open-settings').onclick = () => showPane('settings');
  for (const b of document.querySelectorAll('button[data-copy]')) {
    b.onclick = act(async () => {
      await navigator.clipboard.writeText($(b.dataset.copy).value);
      b.textContent = 'Copied';
    });
  }
  $('close-settings').onclick = () => {
    if (matchMedia('(min-width: 701px)').matches) showPane('conversation');
    else {
      showPane('conversation');
      setView('list');
    }
    render();
  };
  $('back').onclick = () => {
    selected = null;
    setView('list');
    render();
  };
  $('save-name').onclick = act(async () => {
    me.name = $('my-name').value.trim().slice(0, 64) || undefined;
    await db.put('identity', me);
    for (const c of Object.values(contacts)) if (c.state === 'accepted') await queue(c.account_id, 'profile');
  });
  $('rename').onclick = act(async () => {
    const name = prompt(`Name for ${nameOf(selected)} (only you see it)`, contacts[selected].nickname ?? '');
    if (name === null) return;
    contacts[selected].nickname = name.trim().slice(0, 64) || undefined;
    await saveContacts();
    render();
  });
  $('verify').onclick = () => {
    const n = e2e.safetyNumber(me.account_key, contacts[selected].account_key);
    $('safety').textContent = n;
    $('safety-qr').innerHTML = encodeQR(n, 'svg');
    $('safety-box').classList.remove('hidden');
  };
  $('safety-close').onclick = () => $('safety-box').classList.add('hidden');
  $('mark-verified').onclick = act(async () => {
    contacts[selected].verified = contacts[selected].account_key;
    await saveContacts();
    $('safety-box').classList.add('hidden');
    render();
  });
  $('block').onclick = act(() => block(selected));
  $('block-request').onclick = act(() => block(selected));
  $('accept').onclick = act(() => accept(selected));
  // A click on a notification of an open page: sync now.
  navigator.serviceWorker?.addEventListener('message', (ev) => {
    if (ev.data?.type === 'push.open' && ws) sync();
  });
  document.addEventListener('visibilitychange', () => render());
  $('text').onkeydown = (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $('send-form').requestSubmit();
    }
  };
  $('send-form').onsubmit = act(async () => {
    const text = $('text').value;
    if (!text.trim() || !selected || stopped) return;
    $('text').value = '';
    // Writing to a request accepts it.
    if (contacts[selected].state === 'request') {
      contacts[selected].state = 'accepted';
      await saveContacts();
    }
    await queue(selected, 'text', text);
  });
  me = await db.get('identity');
  if (me) await start();
  else {
    $('setup').classList.remove('hidden');
    setView('setup');
    // A link under way goes on waiting (its code registered, or registered now).
    if (await db.get('pending-link')) linkStart().catch(showError);
  }
  document.body.dataset.ready = 'true';
}

boot().catch(showError);
