// The web client as people use it, in headless Chromium against two relays
// on loopback: Alice and Carol on relay-a, Bob and Dave on relay-b, each in
// a browser context of their own.
//
//   node web/test/messenger.mjs --relay target/debug/relay --dir <scratch dir> --out <screenshot dir>
//        [--docs docs]   (also writes docs/web-client-390.png and docs/web-client-1280.png)
//
// Run by tests/it/browser.rs. Each check is named in the log ("ok: …"):
// names and contact requests; a message typed while Alice's relay is down is
// queued, survives a reload (page from the service worker, message from
// IndexedDB) and reaches Bob exactly once when the relay is back; a third
// person's message shows an unread count, a tab title and a desktop
// notification while the tab is hidden; a blocked request stays out and its
// sender sees ✗ with a retry action; both sides show the same safety number;
// backup → clear site data → restore gives the account back; the layout
// holds at 390 px and the composer stays on screen; axe-core finds no
// serious or critical violation.

import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as harness from './harness.mjs';
import { arg, logger, relayNet, launch, until, waitStatus, waitText, sendText, plaintextsIn, status } from './harness.mjs';

const RELAY = arg('relay');
const DIR = arg('dir');
const OUT = arg('out');
const DOCS = arg('docs');
const log = logger('messenger');
const assert = (cond, what) => harness.assert(cond, what, log);

let net;

/** A new browser context on `relay`, notifications granted, dialogs confirmed. */
async function openPage(browser, relay) {
  const ctx = await browser.createBrowserContext();
  await ctx.overridePermissions(net.relays[relay].url, ['notifications', 'clipboard-read', 'clipboard-sanitized-write']);
  const page = await ctx.newPage();
  page.on('pageerror', (e) => log(`page error (${relay}): ${e.message}`));
  page.on('dialog', (d) => d.accept());
  await page.setViewport({ width: 1280, height: 800 });
  await page.goto(`${net.relays[relay].url}/`);
  await until(page, () => document.body.dataset.ready === 'true');
  return page;
}

async function createAccount(page, name) {
  await page.click('#create');
  await until(page, () => document.getElementById('conn').dataset.state === 'online');
  await page.click('#open-settings');
  await page.type('#my-name', name);
  await page.click('#save-name');
  await page.click('#close-settings');
  return page.$eval('#account-id', (e) => e.textContent);
}

async function addContact(page, link, nickname = '') {
  await page.type('#add-link', link);
  if (nickname) await page.type('#add-name', nickname);
  await page.click('#add-contact');
}

const entry = (id) => `#conversations button[data-account-id="${id}"]`;

async function openChat(page, id) {
  // Clicked in the page: the list is redrawn on every change, and a handle
  // held between two DevTools calls could be a detached button.
  await until(page, (sel) => {
    document.querySelector(sel)?.click();
    return document.querySelector(sel);
  }, entry(id));
  await until(page, (i) => document.getElementById('peer').dataset.accountId === i, id);
}

const listEntry = (page, id) =>
  page.evaluate((sel) => {
    const b = document.querySelector(sel);
    if (!b) return null;
    return {
      name: b.querySelector('.name').firstChild.textContent,
      tags: [...b.querySelectorAll('.tag')].map((t) => t.textContent),
      unread: b.querySelector('.unread')?.textContent ?? null,
      preview: b.querySelector('.preview').textContent,
    };
  }, entry(id));

/** The messages the page keeps in IndexedDB. */
const stored = (page) =>
  page.evaluate(async () => {
    const db = await new Promise((resolve, reject) => {
      const r = indexedDB.open('relay-web');
      r.onsuccess = () => resolve(r.result);
      r.onerror = () => reject(r.error);
    });
    return new Promise((resolve) => {
      const r = db.transaction('messages').objectStore('messages').getAll();
      r.onsuccess = () => resolve(r.result);
    });
  });

const countText = (page, text) =>
  page.evaluate((t) => [...document.querySelectorAll('.msg .text')].filter((x) => x.textContent === t).length, text);

/** axe-core on the page as it is now: no serious or critical violation. */
async function axe(page, where) {
  const found = await harness.axeViolations(page);
  for (const v of found) log(`axe (${where}): ${v}`);
  assert(found.length === 0, `axe-core: no serious or critical violation (${where})`);
}

/** Where an element is on screen: {top, bottom, left, right}. */
const rect = (page, sel) =>
  page.$eval(sel, (e) => {
    const r = e.getBoundingClientRect();
    return { top: r.top, bottom: r.bottom, left: r.left, right: r.right };
  });

async function main() {
  rmSync(DIR, { recursive: true, force: true });
  mkdirSync(DIR, { recursive: true });
  mkdirSync(OUT, { recursive: true });
  net = await relayNet(RELAY, DIR, ['relay-a', 'relay-b'], log);
  await net.start('relay-a');
  await net.start('relay-b');
  const browser = await launch(DIR);
  const sent = ['Alice Liddell', 'Bob Marley', 'Carol King', 'Dave Grohl'];
  try {
    const alice = await openPage(browser, 'relay-a');
    await axe(alice, 'welcome screen');
    const bob = await openPage(browser, 'relay-b');
    const carol = await openPage(browser, 'relay-a');
    const dave = await openPage(browser, 'relay-b');
    const aliceId = await createAccount(alice, 'Alice Liddell');
    const bobId = await createAccount(bob, 'Bob Marley');
    const carolId = await createAccount(carol, 'Carol King');
    const daveId = await createAccount(dave, 'Dave Grohl');
    const aliceLink = await alice.$eval('#contact-link', (e) => e.value);
    await alice.click('#open-settings');
    await alice.click('button[data-copy=contact-link]');
    await until(alice, () => document.querySelector('button[data-copy=contact-link]').textContent === 'Copied');
    assert((await alice.evaluate(() => navigator.clipboard.readText())) === aliceLink, 'Copy link puts the contact link on the clipboard');
    await axe(alice, 'settings');
    await alice.click('#close-settings');

    // Names and requests: Bob writes first through Alice's link.
    await addContact(bob, aliceLink);
    await until(bob, (id) => document.getElementById('peer').dataset.accountId === id, aliceId);
    const t1 = 'Hi Alice, Bob here. Got your link!';
    sent.push(t1);
    await sendText(bob, t1);
    await openChat(alice, bobId);
    await waitText(alice, t1);
    let e = await listEntry(alice, bobId);
    assert(e.name === 'Bob Marley' && e.tags.includes('request'), `Bob arrives at Alice's as a request under his own name (${JSON.stringify(e)})`);
    assert(await alice.$eval('#request-bar', (x) => !x.classList.contains('hidden')), 'Alice is offered accept / block');
    await alice.click('#accept');
    await until(bob, () => document.getElementById('peer').textContent === 'Alice Liddell');
    assert(true, "Alice accepts; her name reaches Bob's page in the end-to-end payload");
    e = await listEntry(alice, bobId);
    assert(!e.tags.includes('request'), 'an accepted request is a contact');

    // Keyboard: Shift+Enter is a new line, Enter sends.
    const t2 = 'Welcome!\nSecond line.';
    sent.push('Second line.');
    await alice.focus('#text');
    await alice.keyboard.type('Welcome!');
    await alice.keyboard.down('Shift');
    await alice.keyboard.press('Enter');
    await alice.keyboard.up('Shift');
    await alice.keyboard.type('Second line.');
    await alice.keyboard.press('Enter');
    await waitText(bob, t2);
    assert((await alice.$eval('#text', (x) => x.value)) === '', 'Enter sends a multi-line message and empties the composer');
    await waitStatus(alice, t2, 'target_accepted');
    // One evaluation: the page redraws bubbles, a handle held across calls may be detached.
    const tick = await alice.evaluate(() => {
      const x = document.querySelector('.msg.sent .ticks[data-status=target_accepted]');
      return { title: x.title, color: getComputedStyle(x).color, muted: getComputedStyle(x.closest('.meta')).color };
    });
    assert(tick.title.includes('not a read receipt') && tick.color === tick.muted, `✓✓ is grey like the time and says what it means (${JSON.stringify(tick)})`);

    // Nothing lost: Alice's own relay goes down while she types.
    await until(alice, () => navigator.serviceWorker.controller !== null);
    await net.stop('relay-a', 'SIGKILL');
    await until(alice, () => document.getElementById('conn').dataset.state === 'offline');
    const t3 = 'Typed while my relay was down';
    sent.push(t3);
    await sendText(alice, t3);
    await waitStatus(alice, t3, 'sending');
    assert(true, 'a message typed while the relay is unreachable shows as sending');
    await alice.reload();
    await until(alice, () => document.body.dataset.ready === 'true');
    await waitStatus(alice, t3, 'sending');
    assert(true, 'after a reload with the relay still down the page loads and the message is still queued');
    // A second tab of Alice's (same profile) holds the same outbox.
    const tab = await alice.browserContext().newPage();
    await tab.setViewport({ width: 1280, height: 800 });
    await tab.goto(alice.url());
    await until(tab, () => document.body.dataset.ready === 'true');
    await openChat(tab, bobId);
    await waitStatus(tab, t3, 'sending');
    await net.start('relay-a');
    await waitStatus(alice, t3, 'target_accepted', 45_000);
    await waitStatus(tab, t3, 'target_accepted', 45_000);
    await waitText(bob, t3, 45_000);
    assert((await countText(bob, t3)) === 1 && (await countText(alice, t3)) === 1, 'once the relay is back it is delivered, exactly once, though two tabs held it');
    await tab.close();
    const kept = (await stored(alice)).filter((m) => m.text === t3);
    assert(kept.length === 1 && !('params' in kept[0]), 'the outbox keeps one record of it, and drops its sealed copy once accepted');
    await bob.reload();
    await until(bob, () => document.body.dataset.ready === 'true' && document.getElementById('conn').dataset.state === 'online');
    await waitText(bob, t3);
    assert((await countText(bob, t3)) === 1, "Bob's timeline holds it once after a reload too");

    // A third person writes while Alice's tab is in the background.
    await alice.evaluate(() => {
      window.__notes = [];
      const Native = window.Notification;
      window.Notification = class extends Native {
        constructor(title, options) {
          super(title, options);
          window.__notes.push({ title, body: options?.body });
        }
      };
      Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' });
      document.dispatchEvent(new Event('visibilitychange'));
    });
    // Carol opens Alice's link (as from a QR code): the page fills it in.
    await carol.goto(aliceLink);
    await until(carol, (l) => document.getElementById('add-link').value === l, aliceLink);
    await carol.type('#add-name', 'Alice');
    await carol.click('#add-contact');
    await until(carol, (id) => document.getElementById('peer').dataset.accountId === id, aliceId);
    const t4 = 'Hello Alice, Carol from the book club';
    sent.push(t4);
    await sendText(carol, t4);
    await until(alice, (sel) => document.querySelector(sel)?.querySelector('.unread')?.textContent === '1', entry(carolId));
    assert((await alice.title()) === '(1) relay', 'the tab title carries the unread total');
    assert((await alice.$eval('#favicon', (x) => x.href)).includes('>1</text>'), 'so does the favicon');
    const notes = await alice.evaluate(() => window.__notes);
    log(`notifications seen by the page: ${JSON.stringify(notes)}`);
    assert(notes.length === 1 && notes[0].title === 'Request from Carol King' && notes[0].body === t4, 'a desktop notification names Carol and shows her message');
    assert((await alice.$eval('#peer', (x) => x.dataset.accountId)) === bobId, "Alice's open conversation stays Bob's");
    const order = await alice.$$eval('#conversations button', (bs) => bs.map((b) => b.dataset.accountId));
    assert(order[0] === carolId && order[1] === bobId, 'the list is sorted by last activity');
    await alice.evaluate(() => {
      delete document.visibilityState;
      document.dispatchEvent(new Event('visibilitychange'));
    });
    await openChat(alice, carolId);
    await until(alice, () => document.title === 'relay');
    assert((await listEntry(alice, carolId)).unread === null, 'reading the conversation clears its unread count');
    await alice.click('#accept');

    // Dave's request is blocked: it stays out, his next message is refused.
    await addContact(dave, aliceLink, 'Alice');
    await until(dave, (id) => document.getElementById('peer').dataset.accountId === id, aliceId);
    const t5 = 'Hi, I am Dave, buy my stuff';
    sent.push(t5);
    await sendText(dave, t5);
    await openChat(alice, daveId);
    await waitText(alice, t5);
    await alice.click('#block-request');
    await until(alice, (sel) => !document.querySelector(sel), entry(daveId));
    const newLink = await alice.$eval('#contact-link', (x) => x.value);
    assert(newLink !== aliceLink, 'blocking a request made through the link revokes that link and makes a new one');
    const t6 = 'Dave again, let me in';
    sent.push(t6);
    await sendText(dave, t6);
    await waitStatus(dave, t6, 'failed');
    const failed = await dave.evaluate((t) => {
      const m = [...document.querySelectorAll('.msg.sent')].find((x) => x.querySelector('.text').textContent === t);
      return { ticks: m.querySelector('.ticks').textContent, retry: !!m.querySelector('button.retry') };
    }, t6);
    assert(failed.ticks.includes('forbidden') && failed.retry, `Dave sees ✗ forbidden with a retry action (${failed.ticks})`);
    const t7 = 'Carol again, after Dave was blocked';
    sent.push(t7);
    await sendText(carol, t7);
    await openChat(alice, carolId);
    await waitText(alice, t7);
    assert(true, 'Carol (accepted: she holds a grant) still reaches Alice after the old link was revoked');
    await alice.reload();
    await until(alice, () => document.body.dataset.ready === 'true' && document.getElementById('conn').dataset.state === 'online');
    await waitText(alice, t7);
    assert((await alice.$(entry(daveId))) === null, 'the blocked request stays out after a reload');
    assert((await status(dave, t6)) === 'failed', "Dave's message never got through");

    // Alice changes her mind: she adds Dave from his own link, which gives
    // him a new grant; his refused message goes through with Retry.
    const daveLink = await dave.$eval('#contact-link', (x) => x.value);
    await addContact(alice, daveLink, 'Dave from work');
    await until(alice, (id) => document.getElementById('peer').dataset.accountId === id, daveId);
    assert((await alice.$eval('#peer', (x) => x.textContent)) === 'Dave from work', 'a nickname given when adding wins over their own name');
    const t6b = 'OK Dave, you are back';
    sent.push(t6b);
    await sendText(alice, t6b);
    await waitText(dave, t6b);
    await until(dave, () => {
      document.querySelector('.msg.sent button.retry')?.click();
      return true;
    });
    await waitStatus(dave, t6, 'target_accepted');
    await waitText(alice, t6);
    assert((await countText(alice, t6)) === 1 && (await countText(dave, t6)) === 1, 'Retry sends the refused message again, and it arrives once');

    // Errors show on screen, above everything.
    await alice.type('#add-link', 'not a link at all');
    await alice.click('#add-contact');
    await until(alice, () => !document.getElementById('error').classList.contains('hidden'));
    const er = await rect(alice, '#error');
    assert(er.top >= 0 && er.bottom <= 800, `an error is drawn inside the window (y ${Math.round(er.top)}–${Math.round(er.bottom)} of 800)`);
    await alice.click('#error-close');
    await alice.$eval('#add-link', (x) => {
      x.value = '';
    });

    // Safety numbers: the same on both sides, another for another contact.
    await openChat(alice, bobId);
    await alice.click('#verify');
    const sa = await alice.$eval('#safety', (x) => x.textContent);
    await bob.click('#verify');
    const sb = await bob.$eval('#safety', (x) => x.textContent);
    await openChat(alice, carolId);
    await alice.click('#verify');
    const sc = await alice.$eval('#safety', (x) => x.textContent);
    assert(/^(\d{5} ){11}\d{5}$/.test(sa) && sa === sb && sa !== sc, `Alice and Bob see the same safety number (${sa}); Carol's differs`);
    await alice.click('#mark-verified');
    await until(alice, (sel) => [...document.querySelectorAll(`${sel} .tag`)].some((t) => t.textContent === 'verified'), entry(carolId));
    assert(true, 'a compared contact is marked verified');

    // A long conversation: the composer stays on screen.
    await openChat(alice, bobId);
    for (let i = 1; i <= 12; i++) await sendText(alice, `Message ${i} of a long chat`);
    await waitText(bob, 'Message 12 of a long chat');
    const f = await rect(alice, '#send-form');
    assert(f.bottom <= 800 && f.top > 400, `the composer stays at the bottom of the window (y ${Math.round(f.top)}–${Math.round(f.bottom)})`);
    await bob.evaluate(() => {
      const m = document.getElementById('messages');
      m.scrollTop = m.scrollHeight;
    });
    await axe(alice, 'conversation, desktop');

    // A phone.
    await alice.setViewport({ width: 390, height: 844 });
    const width = await alice.evaluate(() => document.documentElement.scrollWidth);
    const fm = await rect(alice, '#send-form');
    assert(width <= 390 && fm.bottom <= 844 && fm.right <= 390, `at 390 px the page is ${width} px wide, the composer on screen`);
    await alice.click('#back');
    await until(alice, () => document.body.dataset.view === 'list' && document.getElementById('side').offsetParent !== null);
    assert((await alice.evaluate(() => document.documentElement.scrollWidth)) <= 390, 'the conversation list fits 390 px');
    await axe(alice, 'conversation list, 390 px');
    await alice.emulateMediaFeatures([{ name: 'prefers-color-scheme', value: 'dark' }]);
    const bg = await alice.evaluate(() => getComputedStyle(document.documentElement).backgroundColor);
    assert(bg === 'rgb(17, 21, 24)', `dark mode follows prefers-color-scheme (${bg})`);
    await axe(alice, 'conversation list, dark');
    await alice.emulateMediaFeatures([]);
    await alice.setViewport({ width: 1280, height: 800 });

    // Backup, clear site data, restore.
    await bob.evaluate(() => {
      const make = URL.createObjectURL;
      URL.createObjectURL = (blob) => {
        window.__backup = blob;
        return make(blob);
      };
    });
    await bob.click('#open-settings');
    await bob.type('#backup-pass', 'correct horse battery staple');
    await bob.click('#backup');
    await until(bob, () => !!window.__backup, undefined, 60_000);
    const file = await bob.evaluate(() => window.__backup.text());
    assert(!file.includes(t1) && !file.includes(bobId) && JSON.parse(file).kdf.name === 'scrypt', 'the backup file is encrypted (no message, no account id in it)');
    const path = join(DIR, 'bob-backup.json');
    writeFileSync(path, file);
    const origin = net.relays['relay-b'].url;
    await bob.goto('about:blank');
    const cdp = await bob.createCDPSession();
    await cdp.send('Storage.clearDataForOrigin', { origin, storageTypes: 'all' });
    await bob.goto(`${origin}/`);
    await until(bob, () => document.body.dataset.ready === 'true' && !document.getElementById('setup').classList.contains('hidden'));
    assert(true, "after clearing the site's data Bob's browser has no account");
    const input = await bob.$('#restore-file');
    await input.uploadFile(path);
    await bob.type('#restore-pass', 'wrong passphrase here');
    await bob.click('#restore');
    await until(bob, () => document.getElementById('error-text').textContent.includes('wrong passphrase'), undefined, 60_000);
    assert(true, 'a wrong passphrase is refused');
    await bob.$eval('#restore-pass', (x) => {
      x.value = '';
    });
    await bob.type('#restore-pass', 'correct horse battery staple');
    await bob.click('#restore');
    await until(bob, () => document.getElementById('conn').dataset.state === 'online', undefined, 60_000);
    assert((await bob.$eval('#account-id', (x) => x.textContent)) === bobId, 'the restored browser is Bob again');
    await openChat(bob, aliceId);
    await waitText(bob, t1);
    await waitText(bob, t3);
    assert((await bob.$eval('#peer', (x) => x.textContent)) === 'Alice Liddell', 'with his conversation and the names he knew');
    const t8 = 'Welcome back, Bob';
    sent.push(t8);
    await openChat(alice, bobId);
    await sendText(alice, t8);
    await waitText(bob, t8);
    assert(true, 'and new messages reach it');

    if (DOCS) {
      await alice.evaluate(() => {
        const m = document.getElementById('messages');
        m.scrollTop = m.scrollHeight;
      });
      await alice.screenshot({ path: join(DOCS, 'web-client-1280.png') });
      await alice.setViewport({ width: 390, height: 844 });
      await alice.screenshot({ path: join(DOCS, 'web-client-390.png') });
      log(`screenshots in ${DOCS}`);
    }
    await alice.screenshot({ path: join(OUT, 'alice.png') });
    await alice.setViewport({ width: 390, height: 844 });
    await alice.emulateMediaFeatures([{ name: 'prefers-color-scheme', value: 'dark' }]);
    await alice.screenshot({ path: join(OUT, 'alice-390-dark.png') });
    await alice.click('#open-settings');
    await alice.screenshot({ path: join(OUT, 'alice-390-settings-dark.png'), fullPage: true });
    await bob.screenshot({ path: join(OUT, 'bob-restored.png') });
    await dave.screenshot({ path: join(OUT, 'dave-blocked.png') });
  } finally {
    await browser.close();
    await net.stopAll();
  }
  assert(plaintextsIn(net.relays, sent, log) === 0, 'no message and no name in either relay data dir');
}

main().then(
  () => process.exit(0),
  async (e) => {
    console.error('[messenger] FAILED:', e);
    await net?.stopAll('SIGKILL');
    process.exit(1);
  },
);
