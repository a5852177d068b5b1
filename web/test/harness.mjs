// What the browser tests share: relays on loopback started from this
// build's binary, headless Chromium, and waits bounded in time.

import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync, readdirSync, statSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { createRequire } from 'node:module';
import puppeteer from 'puppeteer-core';

export const arg = (name) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : undefined;
};
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const logger = (tag) => (...a) => console.log(`[${tag}]`, ...a);

export async function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

/**
 * Relays named `ids`, each peered with every other, data under `dir`, with
 * `extra` appended to each configuration; `start`/`stop` them by id (a
 * restarted relay keeps its port and data).
 */
export async function relayNet(binary, dir, ids, log, extra = '') {
  const relays = {};
  for (const id of ids) {
    const port = await freePort();
    const data = join(dir, id);
    mkdirSync(data, { recursive: true });
    const pub = execFileSync(binary, ['key', 'generate', '--out', join(data, 'relay.key')]).toString().trim();
    relays[id] = { id, port, data, pub, url: `http://127.0.0.1:${port}`, config: join(dir, `${id}.toml`) };
  }
  for (const r of Object.values(relays)) {
    const peers = Object.values(relays)
      .filter((p) => p.id !== r.id)
      .map((p) => `[[peers]]\nid = "${p.id}"\nurl = "${p.url}"\npublic_key = "${p.pub}"\n`)
      .join('\n');
    writeFileSync(
      r.config,
      `[relay]
id = "${r.id}"
public_url = "${r.url}"
listen = "127.0.0.1:${r.port}"
data_dir = ${JSON.stringify(r.data)}
key_file = ${JSON.stringify(join(r.data, 'relay.key'))}

${peers}
[limits]
session_rate = 1000000
session_burst = 1000000
anonymous_rate = 1000000
anonymous_burst = 1000000

# Few connections, all from 127.0.0.1: fit any open-file limit, no per-IP cap.
[http]
max_connections = 512
max_connections_per_ip = 100000

# Seconds, not minutes: the tests wait for a retry after a relay returns.
[delivery]
retry_timetable = ["0s", "1s", "2s", "3s"]
retry_then_every = "1s"
attempt_timeout = "2s"
${extra}`,
    );
  }

  async function start(id) {
    const r = relays[id];
    const child = spawn(binary, ['serve', '--config', r.config], { env: { ...process.env, RUST_LOG: 'warn' }, stdio: ['ignore', 'pipe', 'inherit'] });
    r.child = child;
    await new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`${id} did not start in 30 s`)), 30_000);
      child.stdout.on('data', (b) => {
        if (b.toString().includes('listening on')) {
          clearTimeout(t);
          resolve();
        }
      });
      child.on('exit', (code) => reject(new Error(`${id} exited with ${code}`)));
    });
    log(`${id} up at ${r.url}`);
  }

  async function stop(id, signal = 'SIGTERM') {
    const r = relays[id];
    if (!r.child || r.child.exitCode !== null) return;
    const exited = new Promise((resolve) => r.child.once('exit', resolve));
    r.child.kill(signal);
    await exited;
    r.child = null;
  }

  const stopAll = async (signal) => {
    for (const id of ids) await stop(id, signal).catch(() => {});
  };
  return { relays, start, stop, stopAll };
}

/** Headless Chromium with a profile `name` under `dir`, and `extra` flags. */
export const launch = (dir, extra = [], name = 'chromium') =>
  puppeteer.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      `--user-data-dir=${join(dir, name)}`,
      ...extra,
    ],
  });

/** Waits (bounded) until `fn` in the page returns something truthy. */
export const until = (page, fn, arg, timeout = 30_000) => page.waitForFunction(fn, { timeout, polling: 100 }, arg);

/** The status of the sent bubble whose text is `text`. */
export const status = (page, text) =>
  page.evaluate((t) => {
    const m = [...document.querySelectorAll('.msg.sent')].find((x) => x.querySelector('.text').textContent === t);
    return m?.querySelector('.ticks')?.dataset.status ?? null;
  }, text);

export const waitStatus = (page, text, want, timeout) =>
  until(
    page,
    ([t, w]) => {
      const m = [...document.querySelectorAll('.msg.sent')].find((x) => x.querySelector('.text').textContent === t);
      return m?.querySelector('.ticks')?.dataset.status === w;
    },
    [text, want],
    timeout,
  );

export const waitText = (page, text, timeout) =>
  until(page, (t) => [...document.querySelectorAll('.msg .text')].some((x) => x.textContent === t), text, timeout);

/**
 * Waits (bounded) until `page`'s relay lists `deviceId` among the devices
 * of `accountId`: a relay keeps a remote account's device list for a few
 * seconds (`remote_reads::TTL_MS`), so a device just linked elsewhere
 * gets a sender's boxes only from then on. Asked as the page's own device,
 * with a session of its own.
 */
export async function waitDeviceSeen(page, accountId, deviceId, timeout = 20_000) {
  const ask = () =>
    page.evaluate(async ([account, device]) => {
      const e2e = window.relayE2E;
      const db = await new Promise((resolve, reject) => {
        const r = indexedDB.open('relay-web');
        r.onsuccess = () => resolve(r.result);
        r.onerror = () => reject(r.error);
      });
      const me = await new Promise((resolve) => {
        const r = db.transaction('kv').objectStore('kv').get('identity');
        r.onsuccess = () => resolve(r.result);
      });
      const rpc = async (method, params, token) => {
        const headers = { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) };
        return (await fetch(`/v1/rpc/${method}`, { method: 'POST', headers, body: JSON.stringify(params) })).json();
      };
      const { relay_id } = await (await fetch('/client.json')).json();
      const ids = { account_id: me.account_id, device_id: me.device_id };
      const { challenge } = await rpc('session.challenge', ids);
      const signature = e2e.sessionProof(e2e.b64uDecode(me.device_seed), { ...ids, challenge, relay_id });
      const { token } = await rpc('session.open', { ...ids, challenge, signature });
      const list = await rpc('account.devices.get', { account_id: account }, token);
      return (list.certificates ?? []).some((c) => c.device_id === device);
    }, [accountId, deviceId]);
  const end = Date.now() + timeout;
  while (!(await ask())) {
    if (Date.now() > end) throw new Error(`${deviceId} of ${accountId} not listed after ${timeout} ms`);
    await sleep(250);
  }
}

export async function sendText(page, text) {
  await page.type('#text', text);
  await page.click('#send-form button');
}

export function assert(cond, what, log) {
  if (!cond) throw new Error(`assertion failed: ${what}`);
  log(`ok: ${what}`);
}

function* files(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) yield* files(p);
    else yield p;
  }
}

/** How many of `texts` occur, byte for byte, in any file under the relays' data dirs. */
export function plaintextsIn(relays, texts, log) {
  let found = 0;
  let scanned = 0;
  for (const r of Object.values(relays)) {
    for (const f of files(r.data)) {
      const bytes = readFileSync(f);
      scanned += bytes.length;
      for (const t of texts) {
        if (bytes.includes(Buffer.from(t, 'utf8'))) {
          log(`PLAINTEXT FOUND in ${f}: ${JSON.stringify(t)}`);
          found++;
        }
      }
    }
  }
  log(`byte search: ${texts.length} plaintexts, ${scanned} bytes of relay data, ${found} found`);
  return found;
}

const AXE_SOURCE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

/** axe-core on the page as it is now: its serious and critical violations, one line each. */
export async function axeViolations(page) {
  // Evaluated over DevTools, as the page's CSP allows no injected script.
  await page.evaluate(AXE_SOURCE);
  return page.evaluate(async () => {
    const r = await window.axe.run(document, { resultTypes: ['violations'] });
    return r.violations.filter((v) => ['serious', 'critical'].includes(v.impact)).map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
  });
}
