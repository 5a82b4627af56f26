// End to end in a real browser: headless Chromium on the relay's inspector
// page. Events emitted in Postgres appear on the page; the relay restarts
// mid-test and the page replays from its watermark, losing nothing; the
// resync callback fires on a fresh connection. Then the page watches two
// scopes on one stream, with a token minted for both, and shows the events
// of each. Saves a screenshot.
//
// Needs Chromium (CHROMIUM, default /usr/bin/chromium; scripts/test installs
// it) and the eventrelay binary (EVENTRELAY_BIN).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  dropSchema,
  emitter,
  launchChromium,
  makeWorkdir,
  relayEnv,
  skipWithoutChromium,
  startReadyRelay,
  startReceiver,
  stopRelay,
  targetDir,
  uniqueSuffix,
} from './support.js';

const screenshot = process.env.INSPECTOR_SCREENSHOT ?? path.join(targetDir, 'inspector.png');
const workdir = makeWorkdir('e2e');
const env = relayEnv(`e2e_${uniqueSuffix()}`, {
  EVENTRELAY_ADMIN__TOKEN: 'inspector-admin-token',
  EVENTRELAY_CONFIG: path.join(workdir, 'eventrelay.toml'),
});
const emit = emitter(env, { cwd: workdir });

/** Starts the relay on `bind` and waits until it is ready. */
function startRelay(bind) {
  return startReadyRelay({ ...env, EVENTRELAY_HTTP__BIND: bind }, { cwd: workdir });
}

after(() => {
  dropSchema(env.DATABASE_URL, env.EVENTRELAY_DATABASE__SCHEMA);
  rmSync(workdir, { recursive: true, force: true });
});

test('the inspector shows live events and replays across a relay restart', { skip: skipWithoutChromium }, async () => {
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
  const bind = new URL(relay.base).host;

  const browser = await launchChromium();
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

    // Two scope keys in the field: a token granting both, and one stream
    // carrying both.
    const streams = [];
    page.on('request', (request) => {
      if (new URL(request.url()).pathname === '/v1/events') streams.push(request.url());
    });
    const single = await page.inputValue('#token');
    await page.fill('#mint-scope', 'org-1, doc-7');
    await page.click('#mint');
    await page.waitForFunction((old) => document.getElementById('token').value !== old, single);
    await page.click('#connect');
    await page.waitForSelector('#state[data-state="connected"]');
    assert.equal(new URL(streams.at(-1)).search, '?scope=doc-7&scope=org-1');
    const both = [emit('order.created', { orderId: 2 }), emit('doc.edited', { docId: 7 }, 'doc-7')];
    for (const event of both) {
      await page.waitForSelector(`tr[data-id="${event.id}"]`, { timeout: 15000 });
      const cells = await page.$$eval(`tr[data-id="${event.id}"] td`, (tds) => tds.map((td) => td.textContent));
      assert.equal(cells[3], event.scopeKey, 'the row shows its scope');
    }
    assert.deepEqual(both.map((e) => e.scopeKey), ['org-1', 'doc-7']);

    mkdirSync(path.dirname(screenshot), { recursive: true });
    await page.screenshot({ path: screenshot, fullPage: true });
    assert.ok(readFileSync(screenshot).length > 1000);
  } finally {
    await browser.close();
    await stopRelay(relay.child);
    receiver.server.close();
  }
});
