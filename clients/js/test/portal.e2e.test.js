// End to end in a real browser: headless Chromium on an application's page,
// on another origin, that embeds the customer portal (/portal) in an
// iframe with a session the application minted. Through the frame a
// customer adds an endpoint (its secret shown once), which receives the
// test event at a real receiver; an order's delivery fails, the customer
// sees the receiver's answer and redelivers it once the receiver is back.
// A page on an origin that is not allowed cannot frame the portal. No page
// may break its Content-Security-Policy. Saves screenshots of the embedded
// portal, and of it at phone width, in PORTAL_SCREENSHOTS (default target/).
//
// Needs Chromium (CHROMIUM, default /usr/bin/chromium; scripts/test installs
// it) and the eventrelay binary (EVENTRELAY_BIN).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  DEADLINE_MS,
  emitter,
  makeWorkdir,
  relayEnv,
  serveApp,
  skipWithoutChromium,
  startReceiver,
  startRelayAndBrowser,
  stopRelayAndBrowser,
  targetDir,
  uniqueSuffix,
  until,
} from './support.js';

const screenshots = process.env.PORTAL_SCREENSHOTS ?? targetDir;
const suffix = uniqueSuffix();
const workdir = makeWorkdir('portal');
const adminToken = `portal-admin-${suffix}`;
const env = relayEnv(`portal_${suffix}`, {
  EVENTRELAY_ADMIN__TOKEN: adminToken,
  EVENTRELAY_CONFIG: path.join(workdir, 'eventrelay.toml'),
  EVENTRELAY_HTTP__BIND: '127.0.0.1:0',
});
const emit = emitter(env, { cwd: workdir });

after(() => rmSync(workdir, { recursive: true, force: true }));

/** Mints a portal session for org-1 through the admin API, as the application's backend does. */
async function mintSession(base) {
  const response = await fetch(`${base}/v1/admin/portal-sessions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' },
    body: JSON.stringify({ scopeKey: 'org-1', expiresInSecs: 900, theme: { accent: '#0b6e4f', font: 'Georgia, serif' } }),
  });
  assert.equal(response.status, 201);
  return response.json();
}

/** The application's page: its own header, and the portal in a frame. */
function embedding(src) {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Acme: webhooks</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,"></head>
<body style="margin:0;font-family:sans-serif;background:#eef1f4">
<header style="padding:14px 20px;background:#20232a;color:#fff;font-weight:700">Acme · Settings · Webhooks</header>
<iframe id="portal" title="Webhooks" src="${src}" style="width:100%;height:1750px;border:0"></iframe>
</body></html>`;
}

async function shoot(page, name) {
  // The frame from its top, as a customer first sees it.
  await page.frames().find((f) => f !== page.mainFrame())?.evaluate(() => window.scrollTo(0, 0));
  const file = path.join(screenshots, `portal-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  assert.ok(readFileSync(file).length > 1000, `${file} was written`);
}

test('a customer manages an endpoint in the portal embedded in the application', {
  skip: skipWithoutChromium,
  timeout: 180000,
}, async (t) => {
  mkdirSync(screenshots, { recursive: true });
  const receiver = await startReceiver({ succeed: true });
  let current = '';
  const app = await serveApp('', { '/embed': (_, response) => response.end(embedding(current)) });
  const stranger = await serveApp('', { '/embed': (_, response) => response.end(embedding(current)) });
  mkdirSync(path.join(workdir, 'schemas'), { recursive: true });
  for (const type of ['order.created', 'order.paid']) {
    writeFileSync(path.join(workdir, 'schemas', `${type}.json`), JSON.stringify({ type: 'object' }));
  }
  writeFileSync(
    env.EVENTRELAY_CONFIG,
    [
      '[webhooks]',
      'allow_private_networks = true',
      // One retry 100 ms after the first failure, then the delivery is dead.
      'retry_schedule_ms = [100]',
      '[publish]',
      `schemas_dir = ${JSON.stringify(path.join(workdir, 'schemas'))}`,
      '[portal]',
      `allowed_frame_origins = [${JSON.stringify(app.origin)}]`,
    ].join('\n'),
  );
  let relay;
  let browser;
  try {
    ({ relay, browser } = await startRelayAndBrowser(env, { cwd: workdir }));
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const problems = [];
    page.on('console', (message) => {
      if (message.type() === 'error') problems.push(message.text());
    });
    page.on('pageerror', (error) => problems.push(error.message));
    page.setDefaultTimeout(DEADLINE_MS);
    const frame = page.frameLocator('#portal');

    await t.test('the embedded portal opens its session and takes the code out of its address', async () => {
      current = (await mintSession(relay.base)).url;
      await page.goto(`${app.origin}/embed`);
      await frame.locator('#view-portal:not([hidden])').waitFor();
      assert.equal(await frame.locator('#scope-name').textContent(), 'org-1');
      const portalFrame = page.frames().find((f) => f.url().startsWith(relay.base));
      assert.ok(!portalFrame.url().includes('code='), `the code is gone: ${portalFrame.url()}`);
      const token = await portalFrame.evaluate(() => sessionStorage.getItem('eventrelay.portalToken'));
      assert.match(token, /^[0-9a-f]{64}$/);
      assert.equal(await portalFrame.evaluate(() => document.cookie), '');
      const accent = await portalFrame.evaluate(() => getComputedStyle(document.documentElement).getPropertyValue('--accent').trim());
      assert.equal(accent, '#0b6e4f', 'the theme applies');
      const offered = await frame.locator('#endpoint-types input').evaluateAll((boxes) => boxes.map((b) => b.value));
      assert.deepEqual(offered, ['order.created', 'order.paid'], 'the catalog is offered');
    });

    await t.test('an endpoint is added from the keyboard and its secret shown once', async () => {
      await frame.locator('#endpoint-url').fill(receiver.url);
      await frame.locator('#endpoint-url').press('Enter');
      await frame.locator('#secret-box:not([hidden])').waitFor();
      assert.match(await frame.locator('#secret-value').textContent(), /^whsec_/);
      await frame.locator('#endpoints-body tr').first().waitFor();
      assert.match(await frame.locator('#endpoints-body').textContent(), new RegExp(receiver.url.replaceAll('/', '\\/')));
      await frame.locator('#secret-dismiss').click();
      assert.equal(await frame.locator('#secret-value').textContent(), '', 'the secret is gone from the page');
    });

    await t.test('a refusal shows the API message', async () => {
      await frame.locator('#endpoint-url').fill('ftp://example.com/hook');
      await frame.locator('#endpoint-submit').click();
      await frame.locator('#alert.shown #alert-text').filter({ hasText: 'url' }).waitFor();
      await frame.locator('#alert-dismiss').click();
      await frame.locator('#endpoint-url').fill('');
    });

    await t.test('the test event reaches the receiver', async () => {
      await frame.locator('button[data-action="test"]').click();
      await until(() => receiver.received.length >= 1, 'the test event to arrive');
      await frame.locator('#delivery-detail:not([hidden])').waitFor();
      await until(async () => {
        await frame.locator('#deliveries-refresh').click();
        return /delivered/.test(await frame.locator('#deliveries-body').textContent());
      }, 'the test delivery to show delivered');
    });

    await t.test('a failed delivery shows the receiver answer and is redelivered', async () => {
      receiver.succeed = false;
      emit('order.created', { orderId: 7 });
      await until(async () => {
        await frame.locator('#deliveries-refresh').click();
        return /dead/.test(await frame.locator('#deliveries-body').textContent());
      }, 'the order delivery to be dead');
      await frame.locator('#deliveries-body button[data-action="show"]', { hasText: 'order.created' }).first().click();
      await frame.locator('#attempts-body').filter({ hasText: 'receiver down' }).waitFor();
      await shoot(page, 'embedded');
      receiver.succeed = true;
      await frame.locator('#delivery-redeliver').click();
      await until(async () => {
        await frame.locator('#deliveries-refresh').click();
        return !/dead/.test(await frame.locator('#deliveries-body').textContent());
      }, 'the redelivery to go through');
      assert.ok(receiver.received.some((r) => r.ok && r.id !== receiver.received[0].id), 'the order arrived');
    });

    await t.test('at phone width the portal fits', async () => {
      await page.setViewportSize({ width: 390, height: 844 });
      const portalFrame = page.frames().find((f) => f.url().startsWith(relay.base));
      const overflow = await portalFrame.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `the portal is ${overflow}px wider than the screen`);
      await shoot(page, 'phone');
    });

    await t.test('a page on another origin cannot frame the portal', async () => {
      current = (await mintSession(relay.base)).url;
      const other = await browser.newPage();
      const refusals = [];
      other.on('console', (message) => refusals.push(message.text()));
      await other.goto(`${stranger.origin}/embed`);
      await until(() => refusals.some((text) => /frame-ancestors/.test(text)), 'Chromium to refuse the frame');
      const framed = other.frames().find((f) => f.url().startsWith(relay.base));
      const opened = framed ? await framed.locator('#view-portal:not([hidden])').count() : 0;
      assert.equal(opened, 0, 'nothing of the portal shows');
      await other.close();
    });

    // The refused URL is the only error the portal logs.
    const unexpected = problems.filter((text) => !/status of 400/.test(text));
    assert.deepEqual(unexpected, [], 'no script error and no Content-Security-Policy violation');
  } finally {
    await stopRelayAndBrowser({ relay, browser }, env);
    receiver.server.close();
    await app.close();
    await stranger.close();
  }
});
