// The relay web client: one account per browser profile, its keys in
// IndexedDB, messages end-to-end encrypted with relay-e2e/v1, realtime over
// the relay's WebSocket with SHiNE's delivery ticks.

import * as e2e from './e2e.js';
import * as db from './store.js';

const { b64uEncode: b64, b64uDecode: unb64 } = e2e;
const $ = (id) => document.getElementById(id);
const now = () => Math.floor(Date.now() / 1000);
const randomId = (bytes = 16) => b64(e2e.random(bytes));
const DAY = 86400;
// How far a status has come: it never goes back (a late sync page or a
// notification overtaken by a newer one).
const RANK = { sending: 0, delivering: 1, target_accepted: 2, failed: 2 };

let relay; // {relay_id, public_url}
let me; // identity: seeds and ids
let contacts = {}; // account_id -> {account_id, account_key, invite?, grant_from_them?, my_grant, devices?}
let selected = null;
let ws = null;
let signingOut = false;
const early = new Map(); // delivery notifications that overtook their send answer
// Messages show in the order this browser learned of them (the timeline's
// order for synced records); clocks of two machines do not order them.
let counter = 0;
const order = () => Date.now() * 1000 + (counter++ % 1000);

function showError(e) {
  $('error').textContent = e ? String(e.message ?? e) : '';
}

// ---- transport -------------------------------------------------------------

async function http(method, params, token) {
  const headers = { 'content-type': 'application/json' };
  if (token) headers.authorization = `Bearer ${token}`;
  const r = await fetch(`/v1/rpc/${method}`, { method: 'POST', headers, body: JSON.stringify(params) });
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
      this.ws.onerror = () => reject(new Error('websocket failed'));
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
      for (const { reject } of this.waiting.values()) reject(new Error('connection closed'));
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

const call = (method, params) => {
  if (!ws) throw new Error('offline');
  return ws.call(method, params);
};

// ---- identity ----------------------------------------------------------------

function keys() {
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
    account_seed: b64(accountSeed),
    device_id: device.device_id,
    device_seed: device.device_seed,
    box_secret: device.box_secret,
  };
  await db.put('identity', me);
  await start();
}

/** This account's contact link: a signed ContactInvite in the URL fragment. */
async function contactLink() {
  let invite = await db.get('invite');
  if (!invite || invite.expires_at < now() + DAY) {
    invite = e2e.sign(
      'relay/v1/contact-invite',
      { invite_id: randomId(), issuer: me.account_id, issued_at: now(), expires_at: now() + 30 * DAY },
      keys().account,
    );
    await db.put('invite', invite);
  }
  return `${relay.public_url.replace(/\/$/, '')}/#contact=${b64(e2e.utf8(JSON.stringify(invite)))}`;
}

// ---- contacts ----------------------------------------------------------------

/** The account key of `accountId`, from its signed route (checked here). */
async function accountKey(accountId) {
  if (contacts[accountId]?.account_key) return unb64(contacts[accountId].account_key);
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

async function ensureContact(accountId) {
  if (!contacts[accountId]) {
    const key = await accountKey(accountId);
    contacts[accountId] = { account_id: accountId, account_key: b64(key) };
  }
  const c = contacts[accountId];
  // A grant rides along with each message so the contact can answer.
  if (!c.my_grant) {
    c.my_grant = e2e.sign(
      'relay/v1/contact-grant',
      { grant_id: randomId(), grantor: me.account_id, grantee: accountId, issued_at: now() },
      keys().account,
    );
  }
  await saveContacts();
  return c;
}

async function addContact(link) {
  const m = /#contact=([A-Za-z0-9_-]+)/.exec(link.trim());
  if (!m) throw new Error('not a contact link');
  const invite = JSON.parse(new TextDecoder().decode(unb64(m[1])));
  if (invite.issuer === me.account_id) throw new Error('that is your own link');
  const key = await accountKey(invite.issuer);
  if (!e2e.verify('relay/v1/contact-invite', invite, key)) throw new Error('the invite does not verify');
  if (invite.expires_at <= now()) throw new Error('the invite has expired');
  const c = await ensureContact(invite.issuer);
  c.invite = invite;
  await saveContacts();
  select(invite.issuer);
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

// ---- messages ----------------------------------------------------------------

async function send(text) {
  const c = await ensureContact(selected);
  const [theirs, mine] = await Promise.all([devicesOf(c.account_id), devicesOf(me.account_id)]);
  const target = (list) => list.map((d) => ({ device_id: d.device_id, box_key: unb64(d.box_key) }));
  const messageId = randomId();
  const plaintext = e2e.textPlaintext(text, { grant: c.my_grant });
  const all = [...target(theirs), ...target(mine)];
  const sealed = e2e.encrypt(messageId, plaintext, all);
  const { device } = keys();
  const envelope = e2e.sign(
    'relay/v1/envelope',
    { message_id: messageId, from: me.account_id, from_device_id: me.device_id, to: c.account_id, created_at: now(), ciphertext: sealed.ciphertext },
    device,
  );
  const params = {
    envelope,
    recipient_boxes: sealed.boxes.slice(0, theirs.length),
    sender_boxes: sealed.boxes.slice(theirs.length),
  };
  if (c.grant_from_them) params.authorization = { contact_grant: c.grant_from_them };
  else if (c.invite) params.authorization = { contact_invite: c.invite };
  const m = { message_id: messageId, peer: c.account_id, direction: 'sent', text, at: order(), status: 'sending' };
  await db.putMessage(m);
  render();
  try {
    const status = await call('message.send', params);
    await setStatus(messageId, status.status, status.error);
  } catch (e) {
    // Not accepted: the relay took no responsibility for it.
    await setStatus(messageId, 'failed', { code: e.code ?? 'offline', message: e.message });
  }
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
  await db.putMessage(m);
  render();
}

/** Reads one timeline record: verified, decrypted, stored. */
async function readRecord(r) {
  const env = r.envelope;
  const peer = r.direction === 'sent' ? env.to : env.from;
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
    else kind = 'unsupported';
    if (r.direction === 'received') {
      const c = await ensureContact(env.from);
      const g = msg.grant;
      if (g && g.grantor === env.from && g.grantee === me.account_id && e2e.verify('relay/v1/contact-grant', g, await accountKey(env.from))) {
        c.grant_from_them = g;
        await saveContacts();
      }
    }
  } catch (e) {
    kind = 'unreadable';
    text = `cannot be shown: ${e.message}`;
  }
  const m = known ?? { message_id: env.message_id, peer, direction: r.direction, at: order(), status: null };
  if (!known || kind !== 'text' || known.text === undefined) Object.assign(m, { text, kind });
  if (r.delivery && RANK[r.delivery.status] >= RANK[m.status ?? 'sending']) {
    m.status = r.delivery.status;
    m.error = r.delivery.error ?? null;
  }
  const e = early.get(env.message_id);
  if (e && RANK[e.status] >= RANK[m.status ?? 'sending']) Object.assign(m, { status: e.status, error: e.error ?? null });
  early.delete(env.message_id);
  await db.putMessage(m);
  if (!selected && r.direction === 'received') selected = peer;
}

let syncing = Promise.resolve();
/** Syncs from the acked cursor and acks what was stored (one at a time). */
function sync() {
  syncing = syncing.then(async () => {
    let cursor = (await db.get('cursor')) ?? 0;
    for (;;) {
      const page = await call('message.timeline.sync', { after: cursor, limit: 100 });
      for (const r of page.records) await readRecord(r);
      if (page.next > cursor) {
        await call('message.timeline.ack', { through: page.next });
        cursor = page.next;
        await db.put('cursor', cursor);
      }
      render();
      if (!page.has_more) return;
    }
  }).catch(showError);
  return syncing;
}

// ---- session -----------------------------------------------------------------

async function openSession() {
  const ch = await http('session.challenge', { account_id: me.account_id, device_id: me.device_id });
  const body = { account_id: me.account_id, device_id: me.device_id, challenge: ch.challenge, relay_id: relay.relay_id };
  const s = await http('session.open', { account_id: me.account_id, device_id: me.device_id, challenge: ch.challenge, signature: e2e.sessionProof(keys().device, body) });
  return s.token;
}

function setConn(text) {
  $('conn').textContent = text;
  $('conn').dataset.state = text;
}

/** Connects and attaches; on any close, reconnects and syncs from the cursor. */
async function connect() {
  let token;
  try {
    token = await openSession();
    const url = new URL('/v1/ws', location.href);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    const socket = new Socket(url, onNotify, () => {
      if (ws === socket) ws = null;
      setConn('offline');
      if (!signingOut) setTimeout(connect, 1000);
    });
    await socket.ready;
    await socket.call('session.attach', { token });
    ws = socket;
    setConn('online');
    showError(null);
    await sync();
    renderDevices().catch(showError);
    // Subscribed before (permission granted): hand the relay the current
    // subscription again (it may be new, or the relay may have dropped it).
    if (pushSupported() && Notification.permission === 'granted') enablePush().catch(pushFailed);
  } catch (e) {
    setConn('offline');
    if (e.code === 'device_unknown' || e.code === 'unauthorized') showError(`this device cannot sign in: ${e.message}`);
    setTimeout(connect, 2000);
  }
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

/** The service worker (`/sw.js`, served by the relay), registered once. */
let worker = null;
function registerWorker() {
  if (!pushSupported()) return null;
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
  signingOut = true;
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
      const b = Object.assign(document.createElement('button'), { textContent: 'revoke' });
      b.onclick = () => revoke(d.device_id).catch(showError);
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

/** A new browser's request: its public keys and a one-time X25519 key for the answer. */
async function linkStart() {
  let pending = await db.get('pending-link');
  if (!pending) {
    const link_secret = e2e.random(32);
    pending = { ...newDevice(), link_secret: b64(link_secret), link_key: b64(e2e.boxKeyOf(link_secret)) };
    await db.put('pending-link', pending);
  }
  const { device_id, device_key, box_key, link_key } = pending;
  $('link-request').value = b64(e2e.utf8(JSON.stringify({ device_id, device_key, box_key, link_key })));
  $('link-new').classList.remove('hidden');
}

/**
 * On a browser with the account: certifies the new device (signed by the
 * account key), adds it, and answers with the certificate and the account
 * key and contacts sealed to the request's one-time key (relay-e2e/v1 box).
 */
async function linkApprove(code) {
  const req = JSON.parse(new TextDecoder().decode(unb64(code.trim())));
  const cert = certificate(keys().account, req);
  await call('device.add', { device_certificate: cert });
  const secret = e2e.utf8(JSON.stringify({ account_seed: me.account_seed, invite: await db.get('invite'), contacts }));
  const sealed = e2e.encrypt(`device-link:${req.device_id}`, secret, [{ device_id: req.device_id, box_key: unb64(req.link_key) }]);
  $('link-approval').value = b64(e2e.utf8(JSON.stringify({ certificate: cert, ...sealed })));
  $('link-approval').classList.remove('hidden');
  await renderDevices();
}

async function linkFinish(answer) {
  const pending = await db.get('pending-link');
  const a = JSON.parse(new TextDecoder().decode(unb64(answer.trim())));
  const messageId = `device-link:${pending.device_id}`;
  const key = e2e.openBox(messageId, pending.device_id, unb64(pending.link_secret), unb64(a.boxes[0].box));
  const secret = JSON.parse(new TextDecoder().decode(e2e.open(messageId, key, unb64(a.ciphertext))));
  const accountKey = e2e.publicKeyOf(unb64(secret.account_seed));
  const cert = a.certificate;
  if (!e2e.verify('relay/v1/device-certificate', cert, accountKey) || cert.device_key !== pending.device_key || cert.box_key !== pending.box_key) {
    throw new Error('the answer does not certify this browser');
  }
  me = {
    account_id: e2e.accountIdOf(accountKey),
    account_seed: secret.account_seed,
    device_id: pending.device_id,
    device_seed: pending.device_seed,
    box_secret: pending.box_secret,
  };
  if (secret.invite) await db.put('invite', secret.invite);
  contacts = secret.contacts ?? {};
  await saveContacts();
  await db.put('identity', me);
  await start();
}

// ---- rendering ---------------------------------------------------------------

function ticks(m) {
  const span = document.createElement('span');
  span.className = 'ticks';
  span.dataset.status = m.status ?? 'sending';
  if (m.status === 'delivering') {
    span.textContent = '✓';
    span.title = 'accepted by your relay';
  } else if (m.status === 'target_accepted') {
    span.textContent = '✓✓';
    span.title = "accepted by the recipient's relay";
  } else if (m.status === 'failed') {
    span.textContent = `✗ ${m.error?.code ?? 'failed'}`;
    span.title = m.error?.message ?? 'failed';
  } else {
    span.textContent = '…';
    span.title = 'sending';
  }
  return span;
}

const short = (id) => `${id.slice(0, 8)}…`;

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

async function draw() {
  const all = (await db.messages()).sort((a, b) => a.at - b.at || (a.message_id < b.message_id ? -1 : 1));
  const cs = $('contacts');
  cs.replaceChildren();
  for (const id of Object.keys(contacts)) {
    const b = Object.assign(document.createElement('button'), { textContent: id });
    b.dataset.accountId = id;
    b.className = id === selected ? 'active' : '';
    b.onclick = () => select(id);
    cs.append(b);
  }
  $('peer').textContent = selected ? `Conversation with ${short(selected)}` : 'No contact selected';
  $('peer').dataset.accountId = selected ?? '';
  const box = $('messages');
  box.replaceChildren();
  for (const m of all.filter((x) => x.peer === selected)) {
    const div = document.createElement('div');
    div.className = `msg ${m.direction}`;
    div.dataset.messageId = m.message_id;
    div.append(Object.assign(document.createElement('span'), { className: 'text', textContent: m.text ?? '' }));
    if (m.direction === 'sent') div.append(ticks(m));
    box.append(div);
  }
  box.scrollTop = box.scrollHeight;
}

function select(id) {
  selected = id;
  render();
}

// ---- start -------------------------------------------------------------------

async function start() {
  $('setup').classList.add('hidden');
  for (const id of ['me', 'contacts-box', 'devices-box', 'conversation']) $(id).classList.remove('hidden');
  $('account-id').textContent = me.account_id;
  $('device-id').textContent = me.device_id;
  contacts = (await db.get('contacts')) ?? {};
  selected = Object.keys(contacts)[0] ?? null;
  $('contact-link').value = await contactLink();
  await render();
  registerWorker()?.catch(pushFailed);
  connect();
  // A link opened in a browser that has an account adds the contact.
  if (location.hash.startsWith('#contact=') && !location.hash.includes(me.account_id)) {
    $('add-link').value = location.href;
  }
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
  $('create').onclick = act(createAccount);
  $('link-start').onclick = act(linkStart);
  $('link-finish').onclick = act(() => linkFinish($('link-answer').value));
  $('link-approve').onclick = act(() => linkApprove($('link-code').value));
  $('add-contact').onclick = act(async () => {
    await addContact($('add-link').value);
    $('add-link').value = '';
  });
  $('push-enable').onclick = act(() => enablePush().catch(pushFailed));
  $('sign-out').onclick = act(signOut);
  // A click on a notification of an open page: sync now.
  navigator.serviceWorker?.addEventListener('message', (ev) => {
    if (ev.data?.type === 'push.open' && ws) sync();
  });
  $('send-form').onsubmit = act(async () => {
    const text = $('text').value;
    if (!text || !selected) return;
    $('text').value = '';
    await send(text);
  });
  me = await db.get('identity');
  if (me) await start();
  else {
    $('setup').classList.remove('hidden');
    if (await db.get('pending-link')) await linkStart();
  }
  document.body.dataset.ready = 'true';
}

boot().catch(showError);
