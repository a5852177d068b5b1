// The web client in headless Chromium against two relays on loopback:
// Alice on relay-a, Bob on relay-b, each in its own browser context.
//
//   node web/test/browser.mjs --relay target/debug/relay --dir <scratch dir> --out <screenshot dir>
//        [--chat target/debug/examples/chat]
//
// Run by tests/it/browser.rs. It starts both relays itself (it kills and
// restarts relay-b), checks the shared relay-e2e/v1 vectors inside the page,
// registers both accounts, exchanges a contact link, sends both ways, follows
// the ticks (one grey tick while relay-b is down, two once it is back),
// reloads both pages, optionally talks to the Rust CLI chat, and finally
// byte-searches both relays' data dirs for every plaintext sent.

import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { checkVectors } from './vectors.mjs';
import { arg, sleep, logger, relayNet, launch, until, status, waitStatus, waitText, sendText, plaintextsIn } from './harness.mjs';
import * as harness from './harness.mjs';

const RELAY = arg('relay');
const DIR = arg('dir');
const OUT = arg('out');
const CHAT = arg('chat');
const log = logger('browser');
const assert = (cond, what) => harness.assert(cond, what, log);

let relays = {};
let net;
const start = (id) => net.start(id);
const stop = (id, signal) => net.stop(id, signal);

/** Every status a message's ticks showed, in order (a MutationObserver in the page). */
async function watchTicks(page) {
  await page.evaluate(() => {
    window.__ticks = {};
    const seen = () => {
      for (const m of document.querySelectorAll('.msg.sent')) {
        const t = m.querySelector('.text').textContent;
        const s = m.querySelector('.ticks').dataset.status;
        const l = (window.__ticks[t] ??= []);
        if (l[l.length - 1] !== s) l.push(s);
      }
    };
    new MutationObserver(seen).observe(document.body, { subtree: true, childList: true, attributes: true });
  });
}

async function main() {
  rmSync(DIR, { recursive: true, force: true });
  mkdirSync(DIR, { recursive: true });
  mkdirSync(OUT, { recursive: true });
  net = await relayNet(RELAY, DIR, ['relay-a', 'relay-b'], log);
  relays = net.relays;
  await start('relay-a');
  await start('relay-b');

  const browser = await launch(DIR);
  const sent = [];
  try {
    const open = async (relay) => {
      const ctx = await browser.createBrowserContext();
      const page = await ctx.newPage();
      page.on('pageerror', (e) => log(`page error (${relay}): ${e.message}`));
      page.dialogs = [];
      page.on('dialog', (d) => {
        page.dialogs.push(d.message());
        d.accept();
      });
      await page.setViewport({ width: 1100, height: 720 });
      await page.goto(`${relays[relay].url}/`);
      await until(page, () => document.body.dataset.ready === 'true');
      return page;
    };
    const alice = await open('relay-a');
    const bob = await open('relay-b');

    // The bundled client computes the shared vectors byte for byte.
    const vectors = JSON.parse(readFileSync(new URL('../vectors/relay-e2e-v1.json', import.meta.url), 'utf8'));
    const checks = await alice.evaluate(
      new Function('file', `return (${checkVectors.toString()})(window.relayE2E, file)`),
      vectors,
    );
    assert(checks > 0, `relay-e2e/v1 vectors pass in Chromium (${checks} device boxes)`);

    for (const page of [alice, bob]) {
      await page.click('#create');
      await until(page, () => document.getElementById('conn').dataset.state === 'online');
    }
    const aliceId = await alice.$eval('#account-id', (e) => e.textContent);
    const bobId = await bob.$eval('#account-id', (e) => e.textContent);
    log(`alice ${aliceId} on relay-a, bob ${bobId} on relay-b`);

    // Bob adds Alice from her contact link and writes first (the invite
    // authorizes him); his message carries a grant that lets Alice answer.
    const link = await alice.$eval('#contact-link', (e) => e.value);
    await bob.type('#add-link', link);
    await bob.click('#add-contact');
    await until(bob, (id) => document.getElementById('peer').dataset.accountId === id, aliceId);
    await watchTicks(alice);
    await watchTicks(bob);

    const t1 = `Hello Alice, this is Bob ${Date.now()}`;
    sent.push(t1);
    await sendText(bob, t1);
    await waitText(alice, t1);
    await waitStatus(bob, t1, 'target_accepted');
    assert(true, 'Alice reads what Bob sent; Bob sees two ticks');

    const t2 = `Hi Bob! Привет ✓ ${Date.now()}`;
    sent.push(t2);
    await sendText(alice, t2);
    await waitText(bob, t2);
    await waitStatus(alice, t2, 'target_accepted');
    assert(true, 'Bob reads what Alice sent; Alice sees two ticks');
    const seen = await alice.evaluate((t) => window.__ticks[t], t2);
    log(`ticks of Alice's message: ${seen.join(' -> ')}`);
    assert(seen.at(-1) === 'target_accepted' && !seen.includes('failed'), 'ticks only move forward to two');

    // Relay-b goes away: Alice's next message is accepted by relay-a (one
    // grey tick) and stays there until relay-b is back.
    await stop('relay-b', 'SIGKILL');
    const t3 = `Are you there, Bob? ${Date.now()}`;
    sent.push(t3);
    await sendText(alice, t3);
    await waitStatus(alice, t3, 'delivering');
    await sleep(3000);
    assert((await status(alice, t3)) === 'delivering', 'one grey tick while relay-b is down');
    await alice.screenshot({ path: join(OUT, 'alice-one-tick.png') });
    await start('relay-b');
    await waitStatus(alice, t3, 'target_accepted', 45_000);
    const seen3 = await alice.evaluate((t) => window.__ticks[t], t3);
    log(`ticks of the message sent while relay-b was down: ${seen3.join(' -> ')}`);
    assert(seen3.includes('delivering') && seen3.at(-1) === 'target_accepted', 'grey tick, then two once relay-b returns');
    await waitText(bob, t3, 45_000);
    assert(true, 'Bob reads it after his relay returns (reconnect, sync from the cursor)');

    // History survives a reload (IndexedDB, then sync from the acked cursor).
    for (const page of [alice, bob]) {
      await page.reload();
      await until(page, () => document.body.dataset.ready === 'true');
      for (const t of sent) await waitText(page, t, 20_000);
    }
    assert(true, 'both pages show the whole conversation again after a reload');
    await until(alice, () => document.getElementById('conn').dataset.state === 'online');
    await alice.screenshot({ path: join(OUT, 'alice.png') });
    await bob.screenshot({ path: join(OUT, 'bob.png') });

    await linkAndRevoke(open, alice, aliceId, bob, sent);
    if (CHAT) await withChat(bob, bobId, sent);
  } finally {
    await browser.close();
    await stop('relay-a');
    await stop('relay-b');
  }

  // The relays only ever held ciphertext.
  assert(plaintextsIn(relays, sent, log) === 0, 'no plaintext in either relay data dir');
}

/**
 * A second browser profile joins Alice's account from its link (as from
 * its QR code): the answer — a certificate signed with the account key and
 * the history, sealed to the new browser — reaches it through the relay;
 * it reads what Bob sends next, and is then revoked from the device list.
 */
async function linkAndRevoke(open, alice, aliceId, bob, sent) {
  const laptop = await open('relay-a');
  await laptop.click('#link-start');
  await until(laptop, () => document.getElementById('link-request').value.length > 0);
  const request = await laptop.$eval('#link-request', (e) => e.value);
  // Alice opens the request link (as from its QR code): the page fills it in.
  await alice.goto(request);
  await until(alice, (r) => document.getElementById('link-code').value === r && !document.getElementById('settings').classList.contains('hidden'), request);
  await alice.click('#link-approve');
  await until(alice, () => document.getElementById('link-sent').textContent.startsWith('Sent'));
  const code = await laptop.$eval('#link-code-here', (e) => e.textContent);
  assert(/^\d{3} \d{3}$/.test(code) && alice.dialogs.at(-1).includes(code), `Alice is asked to approve the browser that shows ${code}`);
  // Nothing is pasted back: the laptop reads the answer from the relay.
  await until(laptop, () => document.getElementById('conn').dataset.state === 'online');
  assert((await laptop.$eval('#account-id', (e) => e.textContent)) === aliceId, 'the linked browser is on Alice\'s account');
  const laptopId = await laptop.$eval('#device-id', (e) => e.textContent);
  await until(alice, (id) => !!document.querySelector(`#devices li[data-device-id="${id}"]`), laptopId);
  for (const t of sent) await waitText(laptop, t, 10_000);
  assert(true, 'the linked browser shows the conversation from before the link (sealed in the answer it read from the relay)');

  const t = `For both of Alice's browsers ${Date.now()}`;
  sent.push(t);
  await harness.waitDeviceSeen(bob, aliceId, laptopId);
  await sendText(bob, t);
  await waitText(alice, t);
  await waitText(laptop, t);
  assert(true, 'both of Alice\'s devices read what Bob sent after the link');

  await alice.click(`#devices li[data-device-id="${laptopId}"] button`);
  await until(alice, (id) => !document.querySelector(`#devices li[data-device-id="${id}"]`), laptopId);
  await until(laptop, () => document.getElementById('conn').dataset.state === 'revoked', undefined, 20_000);
  assert(true, 'Alice revokes the linked browser; it says so and stops');
  const after = await laptop.evaluate(async () => {
    const db = await new Promise((resolve, reject) => {
      const r = indexedDB.open('relay-web');
      r.onsuccess = () => resolve(r.result);
      r.onerror = () => reject(r.error);
    });
    const identity = await new Promise((resolve) => {
      const r = db.transaction('kv').objectStore('kv').get('identity');
      r.onsuccess = () => resolve(r.result);
    });
    return { seed: 'account_seed' in identity, composer: document.getElementById('text').disabled, banner: document.getElementById('banner').textContent };
  });
  assert(!after.seed && after.composer && after.banner.includes('removed'), 'the revoked browser forgot the account key, says so and cannot send');
  await laptop.browserContext().close();
}

/** The Rust CLI chat on relay-a talks with Bob's browser on relay-b. */
async function withChat(bob, bobId, sent) {
  const seed = 'c3'.repeat(32);
  const chat = spawn(CHAT, [relays['relay-a'].url, 'relay-a', seed], { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  chat.stdout.on('data', (b) => {
    out += b.toString();
  });
  const waitOut = async (re, what) => {
    for (let i = 0; i < 300; i++) {
      const m = re.exec(out);
      if (m) return m;
      await sleep(100);
    }
    throw new Error(`chat: no ${what} in:\n${out}`);
  };
  try {
    const chatLink = (await waitOut(/contact link: (\S+)/, 'contact link'))[1];
    const chatId = (await waitOut(/account ([0-9a-f]{32})/, 'account id'))[1];
    await bob.$eval('#add-link', (e) => { e.value = ''; });
    await bob.type('#add-link', chatLink);
    await bob.click('#add-contact');
    await until(bob, (id) => document.getElementById('peer').dataset.accountId === id, chatId);
    const t4 = `Hello terminal ${Date.now()}`;
    sent.push(t4);
    await sendText(bob, t4);
    await waitOut(new RegExp(`${bobId}: ${t4}`), 'decrypted browser message');
    await waitStatus(bob, t4, 'target_accepted');
    const t5 = `Hello browser, from the terminal ${Date.now()}`;
    sent.push(t5);
    chat.stdin.write(`/to ${bobId}\n${t5}\n`);
    await waitText(bob, t5);
    await waitOut(/delivered ✓✓/, 'double tick');
    assert(true, 'the Rust CLI chat and the browser read each other');
    await bob.screenshot({ path: join(OUT, 'bob-and-chat.png') });
  } finally {
    chat.kill('SIGTERM');
  }
}

main().then(
  () => process.exit(0),
  async (e) => {
    console.error('[browser] FAILED:', e);
    await net?.stopAll('SIGKILL');
    process.exit(1);
  },
);
