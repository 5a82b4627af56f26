// End to end in a real browser: headless Chromium on the relay's inspector
// page. Events emitted in Postgres appear on the page; the relay restarts
// mid-test and the page replays from its watermark, losing nothing; the
// resync callback fires on a fresh connection. Saves a screenshot.
//
// Needs Chromium (CHROMIUM, default /usr/bin/chromium; scripts/test installs
// it) and the eventrelay binary (EVENTRELAY_BIN).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { startRelay as startRelayWith } from './support.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const binary = process.env.EVENTRELAY_BIN ?? path.join(here, '../../../target/debug/eventrelay');
const chromium = process.env.CHROMIUM ?? '/usr/bin/chromium';
const screenshot = process.env.INSPECTOR_SCREENSHOT ?? path.join(here, '../../../target/inspector.png');
const suffix = randomUUID().replaceAll('-', '').slice(0, 16);
const workdir = mkdtempSync(path.join(tmpdir(), 'eventrelay-e2e-'));
// EVENTRELAY_BIN is for this test, not a relay setting: keep it from the relay.
const { EVENTRELAY_BIN: _binary, ...inherited } = process.env;
const env = {
  ...inherited,
  DATABASE_URL: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
  EVENTRELAY_DATABASE__SCHEMA: `e2e_${suffix}`,
  EVENTRELAY_DATABASE__CHANNEL: `e2e_${suffix}`,
  EVENTRELAY_ADMIN__TOKEN: 'inspector-admin-token',
  EVENTRELAY_CONFIG: path.join(workdir, 'eventrelay.toml'),
  RUST_LOG: 'warn',
};

function startRelay(bind) {
  return startRelayWith(binary, { ...env, EVENTRELAY_HTTP__BIND: bind }, { cwd: workdir });
}

async function ready(base) {
  const deadline = Date.now() + 10000;
  while (Date.now() < deadline) {
    try {
      if ((await fetch(`${base}/readyz`)).ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('relay never became ready');
}

function stopRelay(child) {
  return new Promise((resolve) => {
    child.once('exit', resolve);
    child.kill('SIGTERM');
  });
}

/** Emits straight into Postgres, as an application's transaction would. */
function emit(type, data) {
  const out = execFileSync(binary, ['emit', '--type', type, '--scope', 'org-1', '--data', JSON.stringify(data)], {
    env,
    cwd: workdir,
  });
  return JSON.parse(out.toString());
}

after(() => {
  try {
    execFileSync('psql', [env.DATABASE_URL, '-qc', `DROP SCHEMA IF EXISTS ${env.EVENTRELAY_DATABASE__SCHEMA} CASCADE`], {
      stdio: 'ignore',
    });
  } catch {}
});

/** A webhook receiver that answers 200 and counts what it got. */
async function startReceiver() {
  const received = [];
  const server = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      received.push(request.headers['webhook-id']);
      response.end();
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${server.address().port}/hook`, received, server };
}

test('the inspector shows live events and replays across a relay restart', { skip: !existsSync(chromium) && `no Chromium at ${chromium}` }, async () => {
  const { chromium: launcher } = await import('playwright-core');
  const receiver = await startReceiver();
  writeFileSync(
    env.EVENTRELAY_CONFIG,
    [
      '[webhooks]',
      'allow_private_networks = true',
      'retry_schedule_ms = [100]',
      '[[webhooks.subscriptions]]',
      'id = "inspector"',
      `url = "${receiver.url}"`,
      'secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"',
      'types = ["order.*"]',
    ].join('\n'),
  );
  let relay = await startRelay('127.0.0.1:0');
  await ready(relay.base);
  const bind = new URL(relay.base).host;

  const browser = await launcher.launch({
    executablePath: chromium,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
    await page.goto(`${relay.base}/inspector?admin=inspector-admin-token`);
    await page.fill('#mint-subscriber', 'e2e');
    await page.fill('#mint-scope', 'org-1');
    await page.click('#mint');
    await page.waitForFunction(() => document.getElementById('token').value.length > 20);
    await page.click('#connect');
    await page.waitForSelector('#state[data-state="connected"]');
    await page.waitForSelector('#meta[data-resyncs="1"]');

    const live = [emit('order.created', { orderId: 1 }), emit('order.paid', { orderId: 1 })];
    for (const event of live) await page.waitForSelector(`tr[data-id="${event.id}"]`);

    await stopRelay(relay.child);
    await page.waitForSelector('#state:not([data-state="connected"])');
    const whileDown = [emit('order.shipped', { orderId: 1 }), emit('order.delivered', { orderId: 1 })];
    relay = await startRelay(bind);
    await ready(relay.base);
    for (const event of whileDown) await page.waitForSelector(`tr[data-id="${event.id}"]`, { timeout: 15000 });
    await page.waitForSelector('#state[data-state="connected"]');

    const shown = await page.$$eval('#events tr', (rows) => rows.map((r) => r.dataset.id));
    for (const event of [...live, ...whileDown]) assert.ok(shown.includes(event.id), `${event.type} is shown`);
    assert.equal(new Set(shown).size, shown.length, 'no event is shown twice');

    // Every durable event went to the webhook receiver too, and the page
    // lists the deliveries.
    await page.waitForFunction(
      () => [...document.querySelectorAll('#deliveries tr')].filter((r) => r.textContent.includes('delivered')).length >= 4,
      undefined,
      { timeout: 15000 },
    );
    assert.ok(receiver.received.length >= 4);

    mkdirSync(path.dirname(screenshot), { recursive: true });
    await page.screenshot({ path: screenshot, fullPage: true });
    assert.ok(readFileSync(screenshot).length > 1000);
  } finally {
    await browser.close();
    await stopRelay(relay.child);
    receiver.server.close();
  }
});
