// End to end in a real browser: headless Chromium on the relay's operator
// console (/console). A wrong admin token is refused with the API's message;
// signing in keeps the token in sessionStorage only. Through the page: a
// webhook subscription is created (its secret shown once) and a duplicate
// refused with the API's 409 message; an event's delivery to a receiver that
// answers 500 ends dead, its attempts show the receiver's answer, and once
// the receiver recovers "Redeliver" makes it delivered; a subscription is
// paused and resumed and its secret rotated; dead deliveries are sent again
// from a time on; the Live page shows the open streams; the Streams page
// lists a stream opened from Node and disconnects it. No page may break its
// Content-Security-Policy. Saves screenshots of each page, and of one at
// phone width, in CONSOLE_SCREENSHOTS (default target/).
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
  skipWithoutChromium,
  startReceiver,
  startRelayAndBrowser,
  stopRelayAndBrowser,
  targetDir,
  uniqueSuffix,
  until,
} from './support.js';

const screenshots = process.env.CONSOLE_SCREENSHOTS ?? targetDir;
const suffix = uniqueSuffix();
const workdir = makeWorkdir('console');
const adminToken = `console-admin-${suffix}`;
const TOKEN_KEY = 'eventrelay.adminToken';
const env = relayEnv(`console_${suffix}`, {
  EVENTRELAY_ADMIN__TOKEN: adminToken,
  EVENTRELAY_CONFIG: path.join(workdir, 'eventrelay.toml'),
  EVENTRELAY_HTTP__BIND: '127.0.0.1:0',
});
const emit = emitter(env, { cwd: workdir });

after(() => rmSync(workdir, { recursive: true, force: true }));

/** The admin API from Node, to check what the page did. */
async function adminApi(base, method, urlPath, { token = adminToken, body } = {}) {
  const response = await fetch(`${base}${urlPath}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body ? { 'content-type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  return { status: response.status, body: await response.json().catch(() => null) };
}

/** Opens an event stream from Node with a development token; `ended` resolves with all it received. */
async function openStream(base, subscriber, scope) {
  const minted = await fetch(`${base}/inspector/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ subscriber, scope }),
  });
  assert.equal(minted.status, 200, 'a development token is minted');
  const { token } = await minted.json();
  const controller = new AbortController();
  const response = await fetch(`${base}/v1/events`, { headers: { authorization: `Bearer ${token}` }, signal: controller.signal });
  assert.equal(response.status, 200, 'the stream opens');
  const stream = { text: '', controller };
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  stream.ended = (async () => {
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        stream.text += decoder.decode(value, { stream: true });
      }
    } catch {}
    return stream.text;
  })();
  await until(() => stream.text.includes('event: ready'), 'the stream to be ready', DEADLINE_MS);
  return stream;
}

/** Waits for `selector`, clicking `refresh` between looks, until the deadline. */
async function clickUntil(page, refresh, selector, what, deadlineMs = DEADLINE_MS) {
  const deadline = Date.now() + deadlineMs;
  for (;;) {
    await page.click(refresh);
    if (await page.waitForSelector(selector, { timeout: 500 }).then(() => true, () => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
  }
}

function alertText(page) {
  return page.locator('#alert.shown #alert-text');
}

async function shoot(page, name, options = {}) {
  const file = path.join(screenshots, `console-${name}.png`);
  await page.screenshot({ path: file, fullPage: true, ...options });
  assert.ok(readFileSync(file).length > 1000, `${file} was written`);
}

test('the operator console manages webhooks, shows live figures and disconnects streams', {
  skip: skipWithoutChromium,
  timeout: 180000,
}, async (t) => {
  mkdirSync(screenshots, { recursive: true });
  const receiver = await startReceiver({ succeed: false });
  writeFileSync(
    env.EVENTRELAY_CONFIG,
    [
      '[webhooks]',
      'allow_private_networks = true',
      // One retry 100 ms after the first failure, then the delivery is dead.
      'retry_schedule_ms = [100]',
      '[publish]',
      `schemas_dir = ${JSON.stringify(path.join(workdir, 'schemas'))}`,
    ].join('\n'),
  );
  mkdirSync(path.join(workdir, 'schemas'), { recursive: true });
  writeFileSync(
    path.join(workdir, 'schemas', 'order.created.json'),
    JSON.stringify({ description: 'An order was placed', type: 'object' }),
  );
  let relay;
  let browser;
  const streams = [];
  try {
    ({ relay, browser } = await startRelayAndBrowser(env, { cwd: workdir }));
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const problems = [];
    page.on('console', (message) => {
      if (message.type() === 'error') problems.push(message.text());
    });
    page.on('pageerror', (error) => problems.push(error.message));
    page.setDefaultTimeout(DEADLINE_MS);

    await t.test('a wrong token is refused with the API message', async () => {
      const refused = await adminApi(relay.base, 'GET', '/v1/admin/subscriptions', { token: 'not-the-admin-token' });
      assert.equal(refused.status, 401);
      await page.goto(`${relay.base}/console`);
      await page.fill('#signin-token', 'not-the-admin-token');
      await page.click('#signin-submit');
      await alertText(page).filter({ hasText: refused.body.error.message }).waitFor();
      assert.equal(await page.evaluate((key) => sessionStorage.getItem(key), TOKEN_KEY), null);
      assert.ok(await page.isVisible('#signin-form'), 'still on the sign-in form');
    });

    await t.test('signing in keeps the token in sessionStorage, never in the URL or a cookie', async () => {
      await page.fill('#signin-token', adminToken);
      await page.press('#signin-token', 'Enter');
      await page.waitForSelector('#view-webhooks:not([hidden])');
      assert.ok(!page.url().includes(adminToken), 'the token is not in the URL');
      assert.equal(await page.evaluate((key) => sessionStorage.getItem(key), TOKEN_KEY), adminToken);
      assert.equal(await page.evaluate(() => document.cookie), '');
      assert.equal(await page.isVisible('#alert.shown'), false, 'the old error is gone');
    });

    await t.test('the event catalog is listed and its types are offered in the form', async () => {
      const row = page.locator('#catalog-body tr[data-event-type="order.created"]');
      await row.waitFor();
      assert.match(await row.textContent(), /An order was placed/);
      assert.equal(await page.isVisible('#catalog-empty'), false);
      const offered = await page.$$eval('#create-types-catalog option', (options) => options.map((o) => o.value));
      assert.deepEqual(offered, ['order.created']);
    });

    await t.test('a subscription is created through the form and its secret shown once', async () => {
      await page.fill('#create-id', 'receiver');
      await page.fill('#create-url', receiver.url);
      await page.fill('#create-types', 'order.*');
      await page.fill('#create-scope', 'org-1');
      await page.fill('#create-rate', '25');
      await page.selectOption('#create-ordering', 'scope');
      await page.click('#create-submit');
      await page.waitForSelector('#secret-box:not([hidden])');
      assert.match(await page.textContent('#secret-value'), /^whsec_/);
      assert.equal(await page.textContent('#secret-subscription'), 'receiver');
      await page.waitForSelector('#subscriptions-body tr[data-subscription-id="receiver"][data-state="active"]');
      const { body } = await adminApi(relay.base, 'GET', '/v1/admin/subscriptions/receiver');
      assert.equal(body.subscription.url, receiver.url);
      assert.deepEqual(body.subscription.types, ['order.*']);
      assert.equal(body.subscription.scopeKey, 'org-1');
      assert.equal(body.subscription.maxPerSecond, 25);
      assert.equal(body.subscription.ordering, 'scope');
      assert.match(await page.textContent('#subscriptions-body tr[data-subscription-id="receiver"]'), /25\/s/);
      await page.click('#secret-dismiss');
      await page.waitForSelector('#secret-box', { state: 'hidden' });
      assert.equal(await page.textContent('#secret-value'), '', 'the secret is gone from the page');
    });

    await t.test('an API error (a taken id) shows the API message in the alert region', async () => {
      const taken = await adminApi(relay.base, 'POST', '/v1/admin/subscriptions', { body: { id: 'receiver', url: receiver.url } });
      assert.equal(taken.status, 409);
      await page.fill('#create-id', 'receiver');
      await page.fill('#create-url', receiver.url);
      await page.click('#create-submit');
      await alertText(page).filter({ hasText: taken.body.error.message }).waitFor();
      assert.equal(await page.getAttribute('#alert', 'role'), 'alert');
      assert.equal(await page.isVisible('#secret-box'), false, 'no secret for a refused subscription');
      await page.click('#alert-dismiss');
      await page.waitForSelector('#alert.shown', { state: 'detached' });
      await page.fill('#create-id', '');
      await page.fill('#create-url', '');
    });

    let event;
    let deliveryId;
    await t.test('a failed delivery is found in the log and shows the receiver answer', async () => {
      event = emit('order.created', { orderId: 42 });
      await page.selectOption('#log-status', 'dead');
      await clickUntil(page, '#log-apply', '#log-body tr[data-status="dead"]', 'the dead delivery in the log');
      const rows = await page.$$eval('#log-body tr', (trs) => trs.map((tr) => tr.dataset.status));
      assert.ok(rows.every((status) => status === 'dead'), 'the log shows only dead deliveries');
      deliveryId = await page.getAttribute('#log-body tr[data-status="dead"]', 'data-delivery-id');
      // Opened from the keyboard: the row's button takes Enter.
      await page.focus(`#log-body tr[data-delivery-id="${deliveryId}"] button`);
      await page.keyboard.press('Enter');
      await page.waitForSelector(`#delivery[data-delivery-id="${deliveryId}"][data-status="dead"]`);
      assert.ok((await page.textContent('#delivery-fields')).includes(event.id), 'the detail names the event');
      await page.locator('#attempts-body pre.response', { hasText: 'receiver down' }).first().waitFor();
      assert.equal(await page.locator('#attempts-body tr').count(), 2, 'two attempts: the first and one retry');
      assert.ok((await page.textContent('#attempts-body')).includes('500'));
      await shoot(page, 'delivery');
    });

    await t.test('Redeliver makes the delivery delivered once the receiver recovers', async () => {
      receiver.succeed = true;
      await page.click('#delivery-redeliver');
      // The page reads a pending delivery again by itself until it settles.
      await page.waitForSelector(`#delivery[data-delivery-id="${deliveryId}"][data-status="delivered"]`, { timeout: DEADLINE_MS });
      const { body } = await adminApi(relay.base, 'GET', `/v1/admin/deliveries/${deliveryId}`);
      assert.equal(body.delivery.status, 'delivered');
      assert.equal(body.attempts.at(-1).outcome, 'delivered');
      assert.ok(receiver.received.some((r) => r.id === event.id && r.ok), 'the receiver got the event');
    });

    await t.test('a subscription is paused and resumed through the page', async () => {
      await page.click('#subscriptions-body button[data-action="pause"][data-id="receiver"]');
      await page.waitForSelector('#subscriptions-body tr[data-subscription-id="receiver"][data-state="paused"]');
      let { body } = await adminApi(relay.base, 'GET', '/v1/admin/subscriptions/receiver');
      assert.ok(body.subscription.pausedAt, 'the API says paused');
      // Focus stays on the row's toggle, now "Resume".
      assert.equal(await page.evaluate(() => document.activeElement?.dataset.action), 'resume');
      await page.keyboard.press('Enter');
      await page.waitForSelector('#subscriptions-body tr[data-subscription-id="receiver"][data-state="active"]');
      ({ body } = await adminApi(relay.base, 'GET', '/v1/admin/subscriptions/receiver'));
      assert.equal(body.subscription.pausedAt, null, 'the API says active');
    });

    await t.test('rotating a secret asks for a second click and shows the new secret once', async () => {
      const rotate = '#subscriptions-body button[data-action="rotate"][data-id="receiver"]';
      await page.click(rotate);
      assert.equal((await page.textContent(rotate)).trim(), 'Confirm rotate');
      let { body } = await adminApi(relay.base, 'GET', '/v1/admin/subscriptions/receiver');
      assert.equal(body.subscription.previousSecretExpiresAt, null, 'nothing rotated on the first click');
      await page.click(rotate);
      await page.waitForSelector('#secret-box:not([hidden])');
      assert.match(await page.textContent('#secret-value'), /^whsec_/);
      assert.match(await page.textContent('#secret-note'), /will not be shown again/);
      ({ body } = await adminApi(relay.base, 'GET', '/v1/admin/subscriptions/receiver'));
      assert.ok(body.subscription.previousSecretExpiresAt, 'the API says rotated');
      await page.click('#secret-dismiss');
      await page.waitForSelector('#secret-box', { state: 'hidden' });
    });

    await t.test('dead deliveries since a time are sent again', async () => {
      receiver.succeed = false;
      const second = emit('order.paid', { orderId: 42 });
      let dead;
      await until(async () => {
        const { body } = await adminApi(relay.base, 'GET', `/v1/admin/deliveries?subscriptionId=receiver&status=dead&eventId=${second.id}`);
        dead = body.deliveries[0];
        return Boolean(dead);
      }, 'the second delivery to die', DEADLINE_MS);
      receiver.succeed = true;
      await page.click('#subscriptions-body button[data-action="redeliver-failed"][data-id="receiver"]');
      await page.waitForSelector('#redeliver-failed-form:not([hidden])');
      assert.ok(await page.inputValue('#redeliver-failed-since'), 'defaults to an hour ago');
      await page.click('#redeliver-failed-form button[type="submit"]');
      await page.locator('#status', { hasText: /1 failed delivery of receiver is back in the queue/ }).waitFor();
      await until(async () => {
        const { body } = await adminApi(relay.base, 'GET', `/v1/admin/deliveries/${dead.id}`);
        return body.delivery.status === 'delivered';
      }, 'the redelivered delivery to be delivered', DEADLINE_MS);

      // "Show deliveries" filters the log by the subscription.
      await page.selectOption('#log-status', '');
      await page.click('#subscriptions-body button[data-action="show-deliveries"][data-id="receiver"]');
      assert.equal(await page.inputValue('#log-subscription'), 'receiver');
      await page.waitForSelector(`#log-body tr[data-delivery-id="${dead.id}"][data-status="delivered"]`);
      await shoot(page, 'webhooks');
    });

    const stream = await openStream(relay.base, `console-e2e-${suffix}`, 'org-1');
    streams.push(stream);

    await t.test('the Live page shows the open streams and the top scopes', async () => {
      await page.click('nav a[href="#live"]');
      await page.waitForSelector('#view-live:not([hidden])');
      assert.ok(page.url().endsWith('#live'));
      await page.waitForFunction(() => Number(document.getElementById('figure-connections')?.dataset.value) >= 1, undefined, { timeout: DEADLINE_MS });
      await page.waitForSelector('#scopes-body tr th:text-is("org-1")');
      // A second reading gives the rates and a line in every chart.
      await page.waitForFunction(() => document.getElementById('figure-relayed')?.dataset.value !== '', undefined, { timeout: DEADLINE_MS });
      assert.ok(await page.locator('#figure-connections svg polyline').count() >= 1, 'a sparkline is drawn');
      assert.ok(await page.locator('#mailboxes-body tr').count() >= 1, 'the actors are listed');
      await shoot(page, 'live');
    });

    await t.test('the Streams page lists a stream and disconnects it', async () => {
      const subscriber = `console-e2e-${suffix}`;
      await page.click('nav a[href="#streams"]');
      const row = `#streams-body tr[data-subscriber="${subscriber}"]`;
      await page.waitForSelector(row);
      await shoot(page, 'streams');
      const disconnect = `${row} button[data-action="disconnect"]`;
      await page.click(disconnect);
      assert.equal((await page.textContent(disconnect)).trim(), 'Confirm disconnect', 'a second click is asked for');
      await page.click(disconnect);
      await page.locator('#status', { hasText: `Ended 1 stream of ${subscriber} in org-1` }).waitFor();
      const frames = await stream.ended;
      assert.ok(frames.includes('event: revoked'), 'the stream ended with a revoked frame');
      // The page lists the streams again after the disconnection; a stream
      // still closing may take one more look.
      await until(async () => {
        if ((await page.locator(row).count()) === 0) return true;
        await Promise.all([
          page.waitForResponse((response) => response.url().includes('/v1/admin/subscribers?')),
          page.click('#streams-filter button[type="submit"]'),
        ]);
        return false;
      }, 'the stream to leave the list', DEADLINE_MS);
    });

    await t.test('at phone width the page fits and its tables scroll inside their boxes', async () => {
      await page.setViewportSize({ width: 390, height: 844 });
      await page.click('nav a[href="#webhooks"]');
      await page.waitForSelector('#view-webhooks:not([hidden])');
      await page.waitForSelector('#subscriptions-body tr[data-subscription-id="receiver"]');
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `the page is ${overflow}px wider than the screen`);
      await shoot(page, 'phone');
    });

    await t.test('signing out forgets the token', async () => {
      await page.click('#sign-out');
      await page.waitForSelector('#signin-form');
      assert.equal(await page.evaluate((key) => sessionStorage.getItem(key), TOKEN_KEY), null);
      assert.ok(await page.isHidden('#view-webhooks'));
    });

    // The refused sign-in and the 409 are the only errors the console logs.
    const unexpected = problems.filter((text) => !/status of (401|409)/.test(text));
    assert.deepEqual(unexpected, [], 'no script error and no Content-Security-Policy violation');
  } finally {
    for (const stream of streams) stream.controller.abort();
    await stopRelayAndBrowser({ relay, browser }, env);
    receiver.server.close();
  }
});
