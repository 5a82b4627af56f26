// Token renewal in a real browser: headless Chromium runs the client with
// `getToken` against the relay, whose tokens here live 6 seconds and whose
// `reauth` warning comes 2 seconds before they expire. Durable events are
// published every 100 ms for 20 seconds, across several renewals; every
// page must receive each of them once, in order, without a reconnect. A
// small app server serves the page, the client and the tokens, and passes
// /v1/events through to the relay, so it sees every stream a page opens.
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

const env = relayEnv(`reauth_${uniqueSuffix()}`, {
  EVENTRELAY_HTTP__BIND: '127.0.0.1:0',
  EVENTRELAY_AUTH__MODE: 'jwt',
  EVENTRELAY_AUTH__SECRET: 'reauth-e2e-test-secret-long-enough-for-hs256',
  EVENTRELAY_PUBLISH__TOKEN: 'reauth-e2e-publish-token',
  EVENTRELAY_SSE__HEARTBEAT_SECS: '1',
  EVENTRELAY_SSE__REAUTH_LEAD_SECS: '2',
  EVENTRELAY_WEBHOOKS__ENABLED: 'false',
});
const TOKEN_TTL_SECS = '6';
const PUBLISH_FOR_MS = 20000;
const PUBLISH_EVERY_MS = 100;

// The page fetches its tokens from the app, as an application's would, and
// counts how often it asked.
const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>renewing</title>
<script type="module">
import { createEventStreamClient } from '/eventrelay-client.js';
window.tab = { events: [], states: [], resyncs: 0, tokens: 0 };
window.client = createEventStreamClient({
  url: '/v1/events',
  getToken: async () => {
    tab.tokens += 1;
    return (await fetch('/token', { method: 'POST' })).text();
  },
  onEvent: (event) => tab.events.push(event),
  onStateChange: (state) => tab.states.push(state),
  onResync: () => { tab.resyncs += 1; },
  initialDelayMs: 100,
  maxDelayMs: 500,
});
client.start();
</script>`;

/**
 * The application's origin: the page, the client, a 6-second token for
 * `scope` per call, and /v1/events passed through to the relay, counting
 * the streams open at once.
 */
async function startApp(relayBase, scope) {
  const streams = { open: 0, mostOpen: 0, requests: [], tokens: 0 };
  const app = await serveApp(PAGE, {
    '/token': async (request, response) => {
      if (request.method !== 'POST') return response.writeHead(404).end();
      const token = await mintToken(env, 'alice', scope, TOKEN_TTL_SECS);
      streams.tokens += 1;
      response.end(token);
    },
    '/v1/events': (request, response) => {
      streams.requests.push({ lastEventId: request.headers['last-event-id'] });
      forwardStream(relayBase, request, response);
      streams.open += 1;
      streams.mostOpen = Math.max(streams.mostOpen, streams.open);
      response.on('close', () => {
        streams.open -= 1;
      });
    },
  });
  return { base: app.origin, streams, close: app.close };
}

const publish = (base, event) => publishEvent(base, env.EVENTRELAY_PUBLISH__TOKEN, event);

/** Publishes a durable event every 100 ms for 20 s; answers their ids in order. */
async function publishForAWhile(scope) {
  const ids = [];
  const started = Date.now();
  for (let n = 0; Date.now() - started < PUBLISH_FOR_MS; n++) {
    ids.push((await publish(relay.base, { type: 'tick.counted', scopeKey: scope, data: { n } })).id);
    await new Promise((r) => setTimeout(r, PUBLISH_EVERY_MS));
  }
  return ids;
}

let relay;
let browser;

before(async () => {
  if (skip) return;
  ({ relay, browser } = await startRelayAndBrowser(env));
});

after(() => stopRelayAndBrowser({ relay, browser }, env));

test('tabs sharing a stream renew its 6-second token ahead of expiry, in the tab holding it, and miss or double no event', { skip }, async () => {
  const app = await startApp(relay.base, 'org-1');
  const context = await browser.newContext();
  try {
    const pages = [];
    for (let i = 0; i < 2; i++) {
      const page = await context.newPage();
      await page.goto(app.base);
      pages.push(page);
    }
    for (const page of pages) {
      await page.waitForFunction(() => window.client?.state === 'connected', undefined, { timeout: DEADLINE_MS });
    }

    const published = await publishForAWhile('org-1');
    for (const page of pages) {
      const all = (wanted) => window.tab.events.length >= wanted;
      await page.waitForFunction(all, published.length, { timeout: DEADLINE_MS });
    }

    const tabs = await Promise.all(pages.map(tabState));
    const leader = tabs.find((t) => t.leader);
    const follower = tabs.find((t) => !t.leader);
    assert.ok(leader && follower, 'one tab holds the stream, the other follows it');
    // The first token, then one per renewal: at least three in 20 s.
    assert.ok(leader.tokens >= 4, `the tab holding the stream fetched ${leader.tokens} tokens`);
    assert.equal(follower.tokens, 1, 'the other tab fetched only the token it started with');
    assert.equal(app.streams.tokens, leader.tokens + follower.tokens);
    // One stream per token, each resuming from the watermark, the next one
    // opened while the old one was still open.
    assert.equal(app.streams.requests.length, leader.tokens);
    for (const request of app.streams.requests.slice(1)) assert.ok(request.lastEventId, 'resumes from the watermark');
    assert.equal(app.streams.mostOpen, 2, 'the next stream opens before the old one ends');
    for (const tab of tabs) {
      assert.deepEqual(
        tab.events.map((e) => e.id),
        published,
        'every event once, in order',
      );
      assert.deepEqual(tab.states, ['connecting', 'connected'], 'never a reconnect');
      assert.equal(tab.resyncs, 1, 'only when the page joined');
    }
    await until(() => app.streams.open === 1, 'the replaced streams to close');
  } finally {
    await context.close();
    await app.close();
  }
});
