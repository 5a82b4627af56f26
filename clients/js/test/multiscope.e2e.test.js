// One stream carrying several scopes, in a real browser. Headless Chromium
// opens a native EventSource on /v1/events with three `scope` parameters
// and a token granting the three; events of every scope arrive on it; the
// relay process stops and starts again on the same port while more events
// are emitted to each scope, and the EventSource reconnects by itself,
// sending back the stream's compound cursor as Last-Event-ID: every event
// of every scope must arrive, in order within its scope, none twice but the
// late-commit candidates a resumed stream's replay may repeat (which the
// wire format tells clients to drop by envelope id), and the relay's
// `ready` after the reconnect must ask for no resync. In both
// wake-up modes: notify on the shared Postgres, logical on a throwaway
// cluster with `wal_level = logical`. Then the client: tabs that ask for
// the same set of scopes, in any order, share one stream and re-read each
// scope on its own.
//
// Needs Chromium (CHROMIUM, default /usr/bin/chromium; scripts/test installs
// it), Postgres (DATABASE_URL), Postgres's server programs for the logical
// mode (PG_BINDIR, or Debian's packages) and the eventrelay binary
// (EVENTRELAY_BIN).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  DEADLINE_MS,
  dropSchema,
  emitter,
  forwardStream,
  launchChromium,
  mintToken,
  relayEnv,
  serveApp,
  skipWithoutChromium,
  skipWithoutPostgresBinaries,
  startLogicalCluster,
  startReadyRelay,
  stopRelay,
  uniqueSuffix,
  until,
} from './support.js';

const SCOPES = ['ms-a', 'ms-b', 'ms-c'];

/** The relay's environment for `mode`, on the Postgres at `databaseUrl` (the shared one when undefined). */
function relaySettings(mode, databaseUrl) {
  return relayEnv(`ms_${mode}_${uniqueSuffix()}`, {
    ...(databaseUrl ? { DATABASE_URL: databaseUrl } : {}),
    EVENTRELAY_DATABASE__WAKEUP: mode,
    EVENTRELAY_HTTP__BIND: '127.0.0.1:0',
    EVENTRELAY_AUTH__MODE: 'jwt',
    EVENTRELAY_AUTH__SECRET: 'multiscope-e2e-test-secret-long-enough-for-hs256',
    // A native EventSource cannot send an Authorization header.
    EVENTRELAY_AUTH__QUERY_PARAM: 'access_token',
    EVENTRELAY_SSE__HEARTBEAT_SECS: '1',
    // The EventSource reconnects after this; the default 3 s would only slow the test.
    EVENTRELAY_SSE__RETRY_MS: '200',
    EVENTRELAY_WEBHOOKS__ENABLED: 'false',
  });
}

// The native EventSource, and what it hands the page: each event with the
// `id:` it came with, the connection it came on (counted at each `open`)
// and whether that connection's `ready` had come; each `ready`'s data with
// its connection; and whether the EventSource gave up (it does for good on
// an answer that is not a 200 event stream).
const NATIVE_PAGE = `<!doctype html>
<meta charset="utf-8">
<title>native</title>
<script>
window.seen = { events: [], readies: [], connections: 0, closed: false };
window.listen = (url) => {
  const source = new EventSource(url);
  let ready = false;
  source.onopen = () => {
    seen.connections += 1;
    ready = false;
  };
  source.addEventListener('ready', (e) => {
    ready = true;
    seen.readies.push({ connection: seen.connections, data: JSON.parse(e.data) });
  });
  source.addEventListener('item.added', (e) =>
    seen.events.push({ id: e.lastEventId, event: JSON.parse(e.data), connection: seen.connections, afterReady: ready }));
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) seen.closed = true;
  };
};
</script>`;

let browser;

before(async () => {
  if (skipWithoutChromium) return;
  browser = await launchChromium();
});

after(() => browser?.close());

for (const mode of ['notify', 'logical']) {
  const skip = skipWithoutChromium || (mode === 'logical' && skipWithoutPostgresBinaries);
  test(`a native EventSource on three scopes resumes across a relay restart from its compound cursor, losing nothing, each scope in order (${mode} wake-up)`, { skip }, async () => {
    const cluster = mode === 'logical' ? await startLogicalCluster() : undefined;
    const env = relaySettings(mode, cluster?.url);
    const emit = emitter(env);
    let relay;
    let app;
    let context;
    try {
      relay = await startReadyRelay(env);
      const bind = new URL(relay.base).host;
      // The page's origin passes /v1/events through to whichever relay
      // runs, and records what each request sent and the status it got.
      const requests = [];
      app = await serveApp(NATIVE_PAGE, {
        '/v1/events': (request, response) => {
          const record = { url: request.url, lastEventId: request.headers['last-event-id'], status: undefined };
          requests.push(record);
          const writeHead = response.writeHead.bind(response);
          response.writeHead = (status, ...rest) => {
            record.status = status;
            return writeHead(status, ...rest);
          };
          forwardStream(relay.base, request, response);
        },
      });
      context = await browser.newContext();
      const page = await context.newPage();
      await page.goto(`${app.origin}/`);
      const seen = () => page.evaluate(() => window.seen);

      const token = await mintToken(env, 'ada', SCOPES, 3600);
      // In another order than the relay's, and one of them twice.
      const query = ['ms-c', 'ms-a', 'ms-b', 'ms-a'].map((scope) => `scope=${scope}`).join('&');
      await page.evaluate((url) => window.listen(url), `/v1/events?${query}&access_token=${token}`);
      await until(async () => (await seen()).readies.length === 1, 'the first ready');
      const [first] = (await seen()).readies;
      assert.deepEqual(first.data.scopes, SCOPES, 'the scopes, sorted and once each');
      assert.deepEqual(first.data.resyncScopes, SCOPES, 'a stream without a cursor re-reads every scope');
      assert.equal(first.data.resync, true);

      const emitted = [];
      const round = (n) => {
        for (const scope of SCOPES) emitted.push(emit('item.added', { n, scope }, scope));
      };
      // Every event emitted so far has arrived; a native EventSource that
      // gave up (a refusal while the relay starts, say) fails at once.
      const arrived = async (what) => {
        const answers = () => requests.map((r) => `${r.status ?? 'no answer'} to Last-Event-ID ${r.lastEventId}`).join(', ');
        let now;
        try {
          await until(async () => {
            now = await seen();
            if (now.closed) throw new Error(`the EventSource gave up waiting for ${what}; the relay answered: ${answers()}`);
            const got = new Set(now.events.map((e) => e.event.id));
            return emitted.every((e) => got.has(e.id));
          }, what);
        } catch (error) {
          const got = new Set(now?.events.map((e) => e.event.id));
          const missing = emitted.filter((e) => !got.has(e.id)).map((e) => `${e.scopeKey} seq ${e.seq}`);
          error.message += `; missing ${missing.join(', ')}; the relay answered: ${answers()}`;
          throw error;
        }
      };
      for (let n = 1; n <= 3; n++) round(n);
      await arrived('the live events of every scope');

      // Restarted while events keep coming: one round just before the
      // stop, two while no relay runs, two before the EventSource is back.
      round(4);
      await stopRelay(relay.child);
      round(5);
      round(6);
      relay = await startReadyRelay({ ...env, EVENTRELAY_HTTP__BIND: bind });
      round(7);
      round(8);
      await arrived('every event after the restart');
      await until(async () => (await seen()).readies.some((r) => r.connection > 1), 'the ready of a reconnected stream');
      const result = await seen();

      // A resumed stream's replay may repeat what the stream sent just
      // before it was lost (late-commit candidates, written at or above the
      // cursor's horizon); clients drop those by envelope id. Anything else
      // twice, or out of order, is a fault.
      const firstSeen = new Map();
      for (const [index, delivery] of result.events.entries()) {
        const earlier = firstSeen.get(delivery.event.id);
        if (earlier === undefined) {
          firstSeen.set(delivery.event.id, delivery);
          continue;
        }
        const where = `${delivery.event.scopeKey} seq ${delivery.event.seq}, delivery ${index}`;
        assert.ok(earlier.connection < delivery.connection, `repeated on the connection that sent it: ${where}`);
        assert.equal(delivery.afterReady, false, `repeated after the replay: ${where}`);
      }
      const once = [...firstSeen.values()];
      assert.equal(once.length, emitted.length, 'nothing but what was emitted');
      for (const scope of SCOPES) {
        const mine = once.filter((e) => e.event.scopeKey === scope);
        assert.deepEqual(mine.map((e) => e.event.data.n), [1, 2, 3, 4, 5, 6, 7, 8], `every event of ${scope}, in order`);
        assert.deepEqual(
          mine.map((e) => e.event.id),
          emitted.filter((e) => e.scopeKey === scope).map((e) => e.id),
        );
      }
      for (const { id } of result.events) assert.match(id, /~/, 'a stream of several scopes sends compound cursors');

      // Every stream after the first (the one after the restart, and any
      // the stopping relay still answered) resumed exactly: no resync.
      for (const { connection, data } of result.readies.slice(1)) {
        assert.deepEqual(
          { resync: data.resync, scopes: data.scopes, resyncScopes: data.resyncScopes },
          { resync: false, scopes: SCOPES, resyncScopes: [] },
          `the ready of connection ${connection}`,
        );
      }

      // The EventSource sent back the id of the last event it had, unchanged.
      assert.equal(requests[0].lastEventId, undefined);
      const lastOf = (connection) => result.events.filter((e) => e.connection <= connection).at(-1).id;
      assert.equal(requests[1].lastEventId, lastOf(1), 'the first reconnect');
      assert.equal(requests.at(-1).lastEventId, lastOf(result.connections - 1), 'the reconnect that stayed');
      for (const request of requests) {
        if (request.lastEventId !== undefined) assert.ok(result.events.some((e) => e.id === request.lastEventId), 'an id the stream sent');
        assert.equal(request.url, requests[0].url, 'the same scopes each time');
      }
    } finally {
      await context?.close();
      await app?.close();
      if (relay) await stopRelay(relay.child);
      if (cluster) cluster.stop();
      else dropSchema(env.DATABASE_URL, env.EVENTRELAY_DATABASE__SCHEMA);
    }
  });
}

// Each tab runs the client on the scopes its URL names, with a token of its
// own granting all three, and keeps what it reports.
const CLIENT_PAGE = `<!doctype html>
<meta charset="utf-8">
<title>tab</title>
<script type="module">
import { createEventStreamClient } from '/eventrelay-client.js';
const params = new URLSearchParams(location.search);
window.tab = { events: [], resyncs: [] };
const token = await (await fetch('/token', { method: 'POST' })).text();
window.client = createEventStreamClient({
  buildRequest: () => ({ url: '/v1/events', headers: { authorization: 'Bearer ' + token } }),
  scopes: params.get('scopes').split(','),
  onEvent: (event) => tab.events.push(event),
  onResync: (...args) => tab.resyncs.push(args),
  initialDelayMs: 100,
  maxDelayMs: 500,
});
client.start();
</script>`;

test('tabs asking for the same scopes in any order share one stream, and each re-reads them scope by scope', { skip: skipWithoutChromium }, async () => {
  const env = relaySettings('notify');
  const emit = emitter(env);
  const streams = [];
  let relay;
  let app;
  let context;
  try {
    relay = await startReadyRelay(env);
    let minted = 0;
    app = await serveApp(CLIENT_PAGE, {
      '/token': async (request, response) => {
        if (request.method !== 'POST') return response.writeHead(404).end();
        // A different lifetime each time, so no two tabs hold the same token.
        response.end(await mintToken(env, 'ada', SCOPES, 3600 + minted++));
      },
      '/v1/events': (request, response) => {
        streams.push(request.url);
        forwardStream(relay.base, request, response);
      },
    });
    context = await browser.newContext();
    const open = async (scopes) => {
      const page = await context.newPage();
      await page.goto(`${app.origin}/?scopes=${scopes}`);
      await page.waitForFunction(() => window.client?.state === 'connected', undefined, { timeout: DEADLINE_MS });
      return page;
    };
    const both = [await open('ms-b,ms-a'), await open('ms-a,ms-b,ms-a')];
    const alone = await open('ms-a');
    assert.deepEqual(streams, ['/v1/events?scope=ms-a&scope=ms-b', '/v1/events?scope=ms-a'], 'one stream per set of scopes');

    // One event in each scope the tokens grant, then one more in ms-a.
    const events = SCOPES.map((scope) => emit('item.added', { scope }, scope));
    const later = emit('item.added', { scope: 'ms-a', later: true }, 'ms-a');
    const wanted = (page, list) =>
      page.waitForFunction((ids) => ids.every((id) => window.tab.events.some((e) => e.id === id)), list.map((e) => e.id), {
        timeout: DEADLINE_MS,
      });
    for (const page of both) await wanted(page, [events[0], events[1], later]);
    await wanted(alone, [events[0], later]);
    const idsOf = (list) => list.map((e) => e.id);

    const view = (page) => page.evaluate(() => ({ ...window.tab, scopes: window.client.scopes, leader: window.client.isLeader }));
    const tabs = await Promise.all(both.map(view));
    assert.deepEqual(tabs.map((tab) => tab.leader).sort(), [false, true], 'one tab holds the stream');
    for (const tab of tabs) {
      // Each scope in order; the two scopes' events interleave.
      assert.deepEqual(idsOf(tab.events).sort(), idsOf([events[0], events[1], later]).sort(), 'the scopes asked for, no other');
      assert.deepEqual(idsOf(tab.events.filter((e) => e.scopeKey === 'ms-a')), idsOf([events[0], later]));
      assert.deepEqual(tab.scopes, ['ms-a', 'ms-b']);
      // The tab holding the stream, at the relay's ready; the other, when it joined.
      assert.deepEqual(tab.resyncs, [['ms-a'], ['ms-b']]);
    }
    const single = await view(alone);
    assert.deepEqual(idsOf(single.events), idsOf([events[0], later]));
    assert.deepEqual(single.scopes, ['ms-a']);
    assert.deepEqual(single.resyncs, [[]], 'a stream of one scope resyncs without naming it');
    assert.equal(streams.length, 2, 'no tab opened another stream');
  } finally {
    await context?.close();
    await app?.close();
    if (relay) await stopRelay(relay.child);
    dropSchema(env.DATABASE_URL, env.EVENTRELAY_DATABASE__SCHEMA);
  }
});
