// Opens `relay bench --report` pages in headless Chromium from file:// and
// checks they render on their own: every chart is an SVG with drawn paths
// (or says it has no data), no console error, no request but the page's.
//
//   node web/test/report.mjs --dir <scratch dir> --out <screenshot dir> PAGE.html…
//
// Run by tests/it/bench.rs; a PNG of each page goes to --out.

import { mkdirSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import puppeteer from 'puppeteer-core';

const args = process.argv.slice(2);
const arg = (name) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args.splice(i, 2)[1] : undefined;
};
const DIR = arg('dir');
const OUT = arg('out');
const PAGES = args;
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const log = (...a) => console.log('[report]', ...a);
const fail = (msg) => {
  throw new Error(msg);
};

if (!DIR || !OUT || PAGES.length === 0) fail('usage: report.mjs --dir DIR --out DIR PAGE.html…');
mkdirSync(OUT, { recursive: true });

const browser = await puppeteer.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    `--user-data-dir=${join(DIR, 'chromium')}`,
  ],
});
try {
  for (const file of PAGES) {
    const url = pathToFileURL(resolve(file)).href;
    const page = await browser.newPage();
    const errors = [];
    const requests = [];
    page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
    page.on('pageerror', (e) => errors.push(String(e)));
    page.on('requestfailed', (r) => errors.push(`request failed: ${r.url()}`));
    // Every request is refused but the page itself: a font, script or
    // image from elsewhere would show up here, and fail.
    await page.setRequestInterception(true);
    page.on('request', (r) => {
      requests.push(r.url());
      if (r.url() === url) r.continue();
      else r.abort();
    });
    await page.setViewport({ width: 1360, height: 900 });
    await page.goto(url, { waitUntil: 'load', timeout: 30_000 });
    const charts = await page.$$eval('svg.chart', (svgs) =>
      svgs.map((s) => ({
        title: s.querySelector('title')?.textContent ?? '',
        paths: [...s.querySelectorAll('path')].filter((p) => (p.getAttribute('d') ?? '').length > 1).length,
        noData: s.textContent.includes('no data in this report'),
        width: s.getBoundingClientRect().width,
      })),
    );
    log(basename(file), JSON.stringify(charts));
    if (charts.length < 7) fail(`${file}: ${charts.length} charts, want 7`);
    for (const c of charts) {
      if (c.width < 100) fail(`${file}: chart ${c.title} is not laid out (${c.width} px)`);
      if (!c.noData && c.paths === 0) fail(`${file}: chart ${c.title} has no drawn path`);
    }
    if (charts.filter((c) => c.paths > 0).length < 7) fail(`${file}: a chart of this run has no data`);
    const tables = await page.$$eval('table', (t) => t.length);
    if (tables < 4) fail(`${file}: ${tables} tables`);
    if (errors.length) fail(`${file}: console errors: ${errors.join('; ')}`);
    const others = requests.filter((r) => r !== url);
    if (others.length) fail(`${file}: requests beyond the page: ${others.join(', ')}`);
    const shot = join(OUT, `${basename(file, '.html')}.png`);
    await page.screenshot({ path: shot, fullPage: true });
    log('screenshot', shot);
    await page.close();
  }
} finally {
  await browser.close();
}
