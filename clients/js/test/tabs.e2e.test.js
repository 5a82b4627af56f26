// Tabs sharing one stream, in a real browser: headless Chromium opens
// several pages of one origin, each running the client with its own token
// for the same subscriber. A small app server in this test serves the page
// and the client from this folder and passes /v1/events through to the
// relay, so it sees (and can hold back) every stream a tab opens.
//
// Needs Chromium (CHROMIUM, default /usr/bin/chromium; scripts/test installs
// it), Postgres (DATABASE_URL) and the eventrelay binary (EVENTRELAY_BIN).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  DEADLINE_MS,
  forwardStream,
  mintToken,
  publishEvent,
  relayEnv,
  serveApp,
  skipWithoutChromium as skip,
  startRelayAndBrowser,
  stopRelayAndBrowser,
  tabState,
  uniqueSuffix,
  until,
} from './support.js';

const env = relayEnv(`tabs_${uniqueSuffix()}`, {
  EVENTRELAY_HTTP__BIND: '127.0.0.1:0',
  EVENTRELAY_AUTH__MODE: 'jwt',
  EVENTRELAY_AUTH__SECRET: 'tabs-e2e-test-secret-long-enough-for-hs256',
  EVENTRELAY_PUBLISH__TOKEN: 'tabs-e2e-publish-token',
  EVENTRELAY_SSE__HEARTBEAT_SECS: '1',
  EVENTRELAY_WEBHOOKS__ENABLED: 'false',
});

// Each tab runs the client and keeps what it reports for the test to read.
const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>tab</title>
<script type="module">
import { createEventStreamClient } from '/eventrelay-client.js';
const params = new URLSearchParams(location.search);
window.tab = { events: [], states: [], resyncs: 0 };
// Every tab fetches a token of its own, as an application's pages would.
const subscriber = params.get('subscriber') ?? 'alice';
const token = await (await fetch('/token?subscriber=' + subscriber, { method: 'POST' })).text();
window.client = createEventStreamClient({
  shareAcrossTabs: params.get('share') !== '0',
  buildRequest: () => ({ url: '/v1/events', headers: { authorization: 'Bearer ' + token } }),
  onEvent: (event) => tab.events.push(event),
  onStateChange: (state) => tab.states.push(state),
  onResync: () => { tab.resyncs += 1; },
  initialDelayMs: 100,
  maxDelayMs: 500,
});
client.start();
</script>`;

/**
 * The application's origin: the page, the client, a token per call, and
 * /v1/events passed through to the relay. Its tokens are for `scope`. Streams are counted while open;
 * with the gate closed, new streams wait here until it opens.
 */
async function startApp(relayBase, scope) {
  const streams = { open: 0, requests: [], tokens: [] };
  let held = [];
  let gateOpen = true;
  let minted = 0;

  function pass(request, response, record) {
    record.forwarded = true;
    forwardStream(relayBase, request, response);
    streams.open += 1;
    response.on('close', () => {
      streams.open -= 1;
    });
  }

  const app = await serveApp(PAGE, {
    '/token': async (request, response, url) => {
      if (request.method !== 'POST') return response.writeHead(404).end();
      // A different lifetime each time, so no two tabs hold the same token.
      const ttl = 3600 + minted++;
      const token = await mintToken(env, url.searchParams.get('subscriber'), scope, ttl);
      streams.tokens.push(token);
      response.end(token);
    },
    '/v1/events': (request, response) => {
      const record = { lastEventId: request.headers['last-event-id'], forwarded: false };
      streams.requests.push(record);
      if (gateOpen) {
        pass(request, response, record);
      } else {
        const entry = () => pass(request, response, record);
        held.push(entry);
        response.on('close', () => {
          held = held.filter((e) => e !== entry);
        });
      }
    },
  });
  return {
    base: app.origin,
    streams,
    closeGate() {
      gateOpen = false;
    },
    openGate() {
      gateOpen = true;
      const waiting = held;
      held = [];
      for (const forward of waiting) forward();
    },
    close: app.close,
  };
}

/** The relay's own count of open SSE connections. */
async function relayConnections(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const match = /^eventrelay_sse_connections (\d+)$/m.exec(text);
  assert.ok(match, 'the metrics have the connections gauge');
  return Number(match[1]);
}

/**
 * A new app for one test, once the relay has noticed that the streams of
 * the previous test closed (it does at its next write, a heartbeat).
 */
async function freshApp(scope) {
  await until(async () => (await relayConnections(relay.base)) === 0, 'no stream left from before');
  return startApp(relay.base, scope);
}

const publish = (base, event) => publishEvent(base, env.EVENTRELAY_PUBLISH__TOKEN, event);

async function openTabs(context, app, count, query = '') {
  const pages = [];
  for (let i = 0; i < count; i++) {
    const page = await context.newPage();
    await page.goto(`${app.base}/${query}`);
    pages.push(page);
  }
  for (const page of pages) {
    await page.waitForFunction(() => window.client?.state === 'connected', undefined, { timeout: DEADLINE_MS });
  }
  return pages;
}

async function allReceived(pages, ids) {
  for (const page of pages) {
    const has = (wanted) => wanted.every((id) => window.tab.events.some((e) => e.id === id));
    await page.waitForFunction(has, ids, { timeout: DEADLINE_MS });
  }
}

let relay;
let browser;

before(async () => {
  if (skip) return;
  ({ relay, browser } = await startRelayAndBrowser(env));
});

after(() => stopRelayAndBrowser({ relay, browser }, env));

test('four tabs of one origin share one connection', { skip }, async () => {
  const app = await freshApp('org-1');
  const context = await browser.newContext();
  try {
    const pages = await openTabs(context, app, 4);
    assert.equal(new Set(app.streams.tokens).size, 4, 'every tab holds a token of its own');

    const event = await publish(relay.base, { type: 'order.created', scopeKey: 'org-1', data: { orderId: 1 } });
    const progress = await publish(relay.base, { type: 'sync.progress', scopeKey: 'org-1', lane: 'ephemeral', data: { done: 1 } });
    await allReceived(pages, [event.id, progress.id]);

    assert.equal(app.streams.requests.length, 1, 'only one tab ever asked for the stream');
    assert.equal(app.streams.open, 1);
    assert.equal(await relayConnections(relay.base), 1);
    const tabs = await Promise.all(pages.map(tabState));
    assert.equal(tabs.filter((t) => t.leader).length, 1, 'one tab holds the connection');
    for (const tab of tabs) {
      assert.equal(tab.state, 'connected');
      // Each once; the two lanes travel apart, so in either order.
      assert.deepEqual(tab.events.map((e) => e.id).sort(), [event.id, progress.id].sort());
      assert.equal(tab.resyncs, 1, 'each tab resyncs once, when it joins');
    }
  } finally {
    await context.close();
    await app.close();
  }
});

test('when the tab holding the connection closes, another takes over from the shared watermark', { skip }, async () => {
  // A scope of its own, so the relay's replay holds only this test's events.
  const app = await freshApp('org-2');
  const context = await browser.newContext();
  try {
    const pages = await openTabs(context, app, 3);
    const first = await publish(relay.base, { type: 'order.created', scopeKey: 'org-2', data: { orderId: 2 } });
    await allReceived(pages, [first.id]);

    const leaders = [];
    for (const page of pages) if ((await tabState(page)).leader) leaders.push(page);
    assert.equal(leaders.length, 1);
    const rest = pages.filter((p) => p !== leaders[0]);

    // Hold the next stream back, so there is a stretch with no connection.
    app.closeGate();
    await leaders[0].close();
    await until(() => app.streams.requests.length === 2, 'another tab to ask for the stream');
    await until(() => app.streams.open === 0, 'the old stream to close');
    await until(async () => (await relayConnections(relay.base)) === 0, 'the relay to see no connection');
    const takeover = app.streams.requests[1];
    assert.match(takeover.lastEventId, new RegExp(`^${first.seq}\\.`), 'it resumes from the shared cursor');

    // Committed while no tab is connected: must be replayed, not lost.
    const missed = [
      await publish(relay.base, { type: 'order.paid', scopeKey: 'org-2', data: { orderId: 2 } }),
      await publish(relay.base, { type: 'order.shipped', scopeKey: 'org-2', data: { orderId: 2 } }),
    ];
    app.openGate();
    await allReceived(rest, missed.map((e) => e.id));
    const later = await publish(relay.base, { type: 'order.delivered', scopeKey: 'org-2', data: { orderId: 2 } });
    await allReceived(rest, [later.id]);

    assert.equal(app.streams.requests.length, 2, 'followers never opened a stream of their own');
    assert.equal(app.streams.open, 1);
    assert.equal(await relayConnections(relay.base), 1);
    const tabs = await Promise.all(rest.map(tabState));
    assert.equal(tabs.filter((t) => t.leader).length, 1);
    for (const tab of tabs) {
      assert.equal(tab.state, 'connected');
      // In order, no gap, and no duplicate although the replay repeats
      // what the tabs already had.
      assert.deepEqual(
        tab.events.map((e) => e.id),
        [first.id, ...missed.map((e) => e.id), later.id],
      );
      assert.equal(tab.resyncs, 1, 'resuming from the watermark needs no resync');
      assert.ok(tab.states.includes('reconnecting'), `the hand-over shows as a reconnect: ${tab.states.join()}`);
    }
  } finally {
    await context.close();
    await app.close();
  }
});

test('other subscribers, and tabs that opt out, connect on their own', { skip }, async () => {
  const app = await freshApp('org-3');
  const context = await browser.newContext();
  try {
    const alice = await openTabs(context, app, 2);
    const bob = await openTabs(context, app, 2, '?subscriber=bob');
    const alone = await openTabs(context, app, 1, '?share=0');
    // One stream for alice's tabs, one for bob's, one for the tab that opted out.
    assert.equal(app.streams.requests.length, 3);
    assert.equal(await relayConnections(relay.base), 3);
    const leaders = await Promise.all([...alice, ...bob, ...alone].map(async (p) => (await tabState(p)).leader));
    assert.deepEqual(leaders.filter(Boolean).length, 3);

    const event = await publish(relay.base, { type: 'order.created', scopeKey: 'org-3', data: { orderId: 3 } });
    await allReceived([...alice, ...bob, ...alone], [event.id]);
    for (const page of [...alice, ...bob, ...alone]) {
      assert.deepEqual((await tabState(page)).events.map((e) => e.id), [event.id], 'each tab gets it once');
    }
  } finally {
    await context.close();
    await app.close();
  }
});
