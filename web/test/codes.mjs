// QR scanning, short codes and device linking through the relay, in
// headless Chromium against two relays on loopback.
//
//   node web/test/codes.mjs --relay target/debug/relay --dir <scratch dir> --out <screenshot dir>
//
// Run by tests/it/browser.rs. Alice (relay-a) is in a Chromium whose camera
// is faked (--use-fake-device-for-media-stream with
// --use-file-for-fake-video-capture: a Y4M video of the QR code to scan,
// written by this script from the text the other page shows, so the page's
// own camera path — getUserMedia, frames, decoder — runs for real); Bob
// (relay-b), Carol (relay-a) and Alice's new browsers are contexts of a
// second Chromium. Checks, each named in the log ("ok: …"):
// - Alice scans Bob's contact QR code with the camera and writes to him;
// - Carol types Bob's short contact code (held by relay-b) and writes to him;
// - a new browser shows a device-link QR code, Alice scans it and approves,
//   and the new browser joins her account by itself (the answer comes
//   through the relay), with the conversation from before (made long
//   enough that the answer travels in several messages);
// - another new browser, reloaded while it waits, is linked by typing its
//   short code;
// - the scanner closes the camera when cancelled; axe-core finds no serious
//   or critical violation on the new screens.

import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import encodeQR from 'qr';
import * as harness from './harness.mjs';
import { arg, logger, relayNet, launch, until, waitText, sendText, plaintextsIn } from './harness.mjs';

const RELAY = arg('relay');
const DIR = arg('dir');
const OUT = arg('out');
const log = logger('codes');
const assert = (cond, what) => harness.assert(cond, what, log);
const CAMERA = join(DIR, 'camera.y4m');

let net;

/**
 * The fake camera's video: `text` as a QR code (or a blank frame), two
 * frames of 640×640 in Y4M 4:2:0. Chromium reads the file when a capture
 * starts, so it is written before each scan.
 */
function camera(text) {
  const W = 640;
  const y = Buffer.alloc(W * W, 235);
  if (text) {
    const m = encodeQR(text, 'raw');
    const scale = Math.floor((W - 80) / m.length);
    const off = Math.floor((W - scale * m.length) / 2);
    for (let r = 0; r < m.length; r++) {
      for (let c = 0; c < m.length; c++) {
        if (!m[r][c]) continue;
        for (let dy = 0; dy < scale; dy++) y.fill(16, (off + r * scale + dy) * W + off + c * scale, (off + r * scale + dy) * W + off + (c + 1) * scale);
      }
    }
  }
  const chroma = Buffer.alloc((W / 2) * (W / 2) * 2, 128);
  const frame = Buffer.concat([Buffer.from('FRAME\n'), y, chroma]);
  writeFileSync(CAMERA, Buffer.concat([Buffer.from(`YUV4MPEG2 W${W} H${W} F10:1 Ip A1:1 C420jpeg\n`), frame, frame]));
}

async function openPage(browser, relay, who) {
  const ctx = await browser.createBrowserContext();
  const page = await ctx.newPage();
  page.on('pageerror', (e) => log(`page error (${who}): ${e.message}`));
  page.dialogs = [];
  page.on('dialog', (d) => {
    page.dialogs.push(d.message());
    d.accept();
  });
  await page.setViewport({ width: 1100, height: 800 });
  await page.goto(`${net.relays[relay].url}/`);
  await until(page, () => document.body.dataset.ready === 'true');
  return page;
}

async function createAccount(page) {
  await page.click('#create');
  await until(page, () => document.getElementById('conn').dataset.state === 'online');
  return page.$eval('#account-id', (e) => e.textContent);
}

async function axe(page, where) {
  const found = await harness.axeViolations(page);
  for (const v of found) log(`axe (${where}): ${v}`);
  assert(found.length === 0, `axe-core: no serious or critical violation (${where})`);
}

/** A new browser asks to join an account: its short code, its link, its six digits. */
async function startLinking(page) {
  await page.click('#link-start');
  await until(page, () => document.getElementById('link-wait').textContent.includes('answer'));
  return page.evaluate(() => ({
    short: document.getElementById('link-short').textContent,
    link: document.getElementById('link-request').value,
    digits: document.getElementById('link-code-here').textContent,
  }));
}

async function main() {
  rmSync(DIR, { recursive: true, force: true });
  mkdirSync(DIR, { recursive: true });
  mkdirSync(OUT, { recursive: true });
  net = await relayNet(RELAY, DIR, ['relay-a', 'relay-b'], log);
  await net.start('relay-a');
  await net.start('relay-b');
  camera(null);
  const withCamera = await launch(DIR, ['--use-fake-ui-for-media-stream', '--use-fake-device-for-media-stream', `--use-file-for-fake-video-capture=${CAMERA}`], 'chromium-camera');
  const browser = await launch(DIR);
  const sent = [];
  try {
    const alice = await openPage(withCamera, 'relay-a', 'alice');
    const bob = await openPage(browser, 'relay-b', 'bob');
    const carol = await openPage(browser, 'relay-a', 'carol');
    const aliceId = await createAccount(alice);
    const bobId = await createAccount(bob);
    await createAccount(carol);

    // The scanner, open on a blank picture: a dialog over the page; Cancel
    // stops the camera.
    await alice.click('#scan-contact');
    await until(alice, () => !document.getElementById('scanner').classList.contains('hidden') && document.getElementById('scan-video').readyState >= 2);
    await axe(alice, 'scanner open');
    await alice.screenshot({ path: join(OUT, 'scanner-1100.png') });
    await alice.setViewport({ width: 390, height: 844 });
    await alice.screenshot({ path: join(OUT, 'scanner-390.png') });
    await alice.setViewport({ width: 1100, height: 800 });
    await alice.click('#scan-stop');
    const off = await alice.evaluate(() => document.getElementById('scanner').classList.contains('hidden') && document.getElementById('scan-video').srcObject === null);
    assert(off, 'Cancel closes the scanner and lets go of the camera');

    // 1. Alice scans Bob's contact QR code (his link, as the page shows it).
    const bobLink = await bob.$eval('#contact-link', (e) => e.value);
    camera(bobLink);
    await alice.click('#scan-contact');
    await until(alice, (l) => document.getElementById('add-link').value === l, bobLink);
    const decoder = await alice.evaluate(() => document.body.dataset.scanner);
    assert(await alice.$eval('#scanner', (e) => e.classList.contains('hidden')), `Alice's camera reads Bob's contact QR code (${bobLink.length} characters; decoder: ${decoder === 'qr' ? 'the qr package, this Chromium has no BarcodeDetector' : decoder}) and fills it in`);
    await alice.type('#add-name', 'Bob');
    await alice.click('#add-contact');
    await until(alice, (id) => document.getElementById('peer').dataset.accountId === id, bobId);
    const t1 = `Hi Bob, I scanned your code ${Date.now()}`;
    sent.push(t1);
    await sendText(alice, t1);
    await waitText(bob, t1);
    assert(true, 'Bob reads what Alice sent through the scanned link');

    // 2. Bob makes a short code for his link (held by relay-b); Carol, on
    // relay-a, types it (lower case, a space for the dash).
    await bob.click('#open-settings');
    await bob.click('#make-contact-code');
    await until(bob, () => /^[0-9A-Z]{5}-[0-9A-Z]{5}$/.test(document.getElementById('contact-code').textContent));
    const bobCode = await bob.$eval('#contact-code', (e) => e.textContent);
    await axe(bob, 'settings with a short code');
    await bob.screenshot({ path: join(OUT, 'contact-code.png'), fullPage: true });
    await carol.type('#add-link', bobCode.toLowerCase().replace('-', ' '));
    await carol.click('#add-contact');
    await until(carol, (id) => document.getElementById('peer').dataset.accountId === id, bobId);
    assert(true, `Carol adds Bob by typing his short code ${bobCode} (looked up across relays)`);
    const t2 = `Hi Bob, Carol here, I typed your code ${Date.now()}`;
    sent.push(t2);
    await sendText(carol, t2);
    await bob.click('#close-settings');
    await until(
      bob,
      (t) => [...document.querySelectorAll('#conversations button')].some((b) => b.querySelector('.tag')?.textContent === 'request' && b.querySelector('.preview').textContent === t),
      t2,
    );
    assert(true, 'Bob gets Carol\'s message as a request');
    // A mistyped code names nothing.
    await carol.$eval('#add-link', (e) => { e.value = ''; });
    await carol.type('#add-link', bobCode.replace(/^./, (c) => (c === '7' ? '8' : '7')));
    await carol.click('#add-contact');
    await until(carol, () => !document.getElementById('error').classList.contains('hidden'));
    assert((await carol.$eval('#error-text', (e) => e.textContent)).includes('check the code'), 'a mistyped code is refused with "check the code"');
    await carol.click('#error-close');

    // 3. A new browser asks to join Alice's account; Alice scans its QR code.
    // Her history is made long first (older messages written into her
    // IndexedDB), so that the answer travels in several messages.
    const long = [1, 2, 3].map((i) => `Long ago, message ${i} ${Date.now()} ${'of a long history '.repeat(2200)}`);
    sent.push(...long);
    await alice.evaluate(
      async (texts, peer) => {
        const db = await new Promise((resolve, reject) => {
          const r = indexedDB.open('relay-web');
          r.onsuccess = () => resolve(r.result);
          r.onerror = () => reject(r.error);
        });
        const tx = db.transaction('messages', 'readwrite');
        texts.forEach((text, i) => tx.objectStore('messages').put({ message_id: `old-message-${i}-0000000`, peer, direction: 'received', kind: 'text', text, at: i, ts: 1764400000 + i, status: null, read: true }));
        await new Promise((resolve) => { tx.oncomplete = resolve; });
      },
      long,
      bobId,
    );
    const laptop = await openPage(browser, 'relay-a', 'laptop');
    const req = await startLinking(laptop);
    assert(/^[0-9A-Z]{5}-[0-9A-Z]{5}$/.test(req.short) && req.link.endsWith(`#link=${req.short.replace('-', '')}`), `the new browser shows its short code ${req.short} and a link of ${req.link.length} characters`);
    await axe(laptop, 'a new browser waiting to be linked');
    await laptop.screenshot({ path: join(OUT, 'link-request.png') });
    await laptop.setViewport({ width: 390, height: 844 });
    await laptop.screenshot({ path: join(OUT, 'link-request-390.png'), fullPage: true });
    await laptop.setViewport({ width: 1100, height: 800 });
    camera(req.link);
    await alice.click('#open-settings');
    await alice.click('#scan-link');
    await until(alice, () => document.getElementById('link-sent').textContent.startsWith('Sent'));
    assert(alice.dialogs.at(-1).includes(req.digits), `Alice scans it and is asked to approve the browser that shows ${req.digits}`);
    await until(laptop, () => document.getElementById('conn').dataset.state === 'online');
    assert((await laptop.$eval('#account-id', (e) => e.textContent)) === aliceId, 'the new browser joins Alice\'s account by itself: the answer came through the relay, nothing pasted');
    await waitText(laptop, t1, 10_000);
    for (const t of long) await waitText(laptop, t, 10_000);
    const parts = Number(/\((\d+) parts?\)/.exec(await alice.$eval('#link-sent', (e) => e.textContent))[1]);
    assert(parts >= 2, `the linked browser shows the conversation from before the link, ${long.reduce((n, t) => n + t.length, 0)} characters of it sent in ${parts} messages`);

    // 4. Another new browser, linked by typing its short code.
    const phone = await openPage(browser, 'relay-a', 'phone');
    const req2 = await startLinking(phone);
    // It keeps waiting across a reload, with the same code.
    await phone.reload();
    await until(phone, () => document.body.dataset.ready === 'true' && document.getElementById('link-wait').textContent.includes('answer'));
    assert((await phone.$eval('#link-short', (e) => e.textContent)) === req2.short, 'a new browser reloaded while waiting shows the same code and waits on');
    await alice.type('#link-code', req2.short);
    await alice.click('#link-approve');
    await until(phone, () => document.getElementById('conn').dataset.state === 'online');
    assert((await phone.$eval('#account-id', (e) => e.textContent)) === aliceId && alice.dialogs.at(-1).includes(req2.digits), `a browser is linked by typing its short code ${req2.short}`);
    const phoneId = await phone.$eval('#device-id', (e) => e.textContent);
    const laptopId = await laptop.$eval('#device-id', (e) => e.textContent);
    await harness.waitDeviceSeen(bob, aliceId, phoneId);
    const t3 = `To all three of Alice's browsers ${Date.now()}`;
    sent.push(t3);
    await bob.click(`#conversations button[data-account-id="${aliceId}"]`);
    await sendText(bob, t3);
    for (const p of [alice, laptop, phone]) await waitText(p, t3);
    assert(laptopId !== phoneId, 'all three of Alice\'s browsers read what Bob sends next');
  } finally {
    await withCamera.close();
    await browser.close();
    await net.stopAll();
  }
  assert(plaintextsIn(net.relays, sent, log) === 0, 'no plaintext in either relay data dir');
}

main().then(
  () => process.exit(0),
  async (e) => {
    console.error('[codes] FAILED:', e);
    await net?.stopAll('SIGKILL');
    process.exit(1);
  },
);
