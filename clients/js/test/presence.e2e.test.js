// Presence in a real browser: headless Chromium opens pages of one
// application origin for two subscribers (each in a browser context of its
// own), the relay tracks who is connected to a scope with presence, and
// every tab sees the others come and go through `client.presence` and
// `onPresence`, a tab that shares another's stream included. Then the
// inspector page, served from this checkout, lists the same members.
//
// Needs Chromium (CHROMIUM, default /usr/bin/chromium; scripts/test installs
// it), Postgres (DATABASE_URL) and the eventrelay binary (EVENTRELAY_BIN).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
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
  uniqueSuffix,
} from './support.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const inspectorPage = path.join(here, '../../../src/http/inspector.html');

const env = relayEnv(`presence_${uniqueSuffix()}`, {
  EVENTRELAY_HTTP__BIND: '127.0.0.1:0',
  EVENTRELAY_AUTH__MODE: 'jwt',
  EVENTRELAY_AUTH__SECRET: 'presence-e2e-test-secret-long-enough-for-hs256',
  EVENTRELAY_PUBLISH__TOKEN: 'presence-e2e-publish-token',
  EVENTRELAY_SSE__HEARTBEAT_SECS: '1',
  EVENTRELAY_WEBHOOKS__ENABLED: 'false',
  EVENTRELAY_PRESENCE__SCOPES: '["org-*"]',
  EVENTRELAY_PRESENCE__BATCH_MS: '50',
});

// Each tab runs the client and keeps what it reports for the test to read:
// the events, and each presence change as member ids.
const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>tab</title>
<script type="module">
import { createEventStreamClient } from '/eventrelay-client.js';
const params = new URLSearchParams(location.search);
const ids = (members) => members.map((m) => m.id).sort();
window.tab = { events: [], changes: [] };
const token = await (await fetch('/token?subscriber=' + params.get('subscriber'), { method: 'POST' })).text();
window.client = createEventStreamClient({
  buildRequest: () => ({ url: '/v1/events', headers: { authorization: 'Bearer ' + token } }),
  onEvent: (event) => tab.events.push(event),
  onPresence: (presence, change) =>
    tab.changes.push({ snapshot: change.snapshot, joined: ids(change.joined), left: ids(change.left), count: presence.count }),
  initialDelayMs: 100,
  maxDelayMs: 500,
});
// What the client knows now, in a form the test can read.
window.presence = () => {
  const p = client.presence;
  return p && { scopeKey: p.scopeKey, count: p.count, countsOnly: p.countsOnly, members: [...p.members.values()] };
};
client.start();
</script>`;

/** The application's origin for `scope`: the page, the client, a token per call, and /v1/events passed through to the relay. */
async function startApp(relayBase, scope) {
  let minted = 0;
  return serveApp(PAGE, {
    '/token': async (request, response, url) => {
      if (request.method !== 'POST') return response.writeHead(404).end();
      // A different lifetime each time, so no two tabs hold the same token.
      const token = await mintToken(env, url.searchParams.get('subscriber'), scope, 3600 + minted++);
      response.end(token);
    },
    '/v1/events': (request, response) => forwardStream(relayBase, request, response),
  });
}

async function openTab(context, app, subscriber) {
  const page = await context.newPage();
  await page.goto(`${app.origin}/?subscriber=${subscriber}`);
  await page.waitForFunction(() => window.client?.state === 'connected', undefined, { timeout: DEADLINE_MS });
  return page;
}

/** Waits until the tab's client lists exactly `ids` (and counts them). */
async function membersAre(page, ids) {
  const wanted = [...ids].sort();
  await page.waitForFunction(
    (expected) => {
      const p = window.presence();
      const listed = p?.members.map((m) => m.id).sort() ?? [];
      return p?.count === expected.length && JSON.stringify(listed) === JSON.stringify(expected);
    },
    wanted,
    { timeout: DEADLINE_MS },
  );
}

const presenceOf = (page) => page.evaluate(() => window.presence());
const tabOf = (page) => page.evaluate(() => ({ ...window.tab, leader: window.client.isLeader, lastEventId: window.client.lastEventId }));

let relay;
let browser;

before(async () => {
  if (skip) return;
  ({ relay, browser } = await startRelayAndBrowser(env));
});

after(() => stopRelayAndBrowser({ relay, browser }, env));

test('tabs see other subscribers join and leave, a tab sharing the stream included', { skip }, async () => {
  const app = await startApp(relay.base, 'org-p1');
  const ada = await browser.newContext();
  const bob = await browser.newContext();
  try {
    const ada1 = await openTab(ada, app, 'ada');
    await membersAre(ada1, ['ada']);
    const own = await presenceOf(ada1);
    assert.deepEqual(own, { scopeKey: 'org-p1', count: 1, countsOnly: false, members: [{ id: 'ada', streams: 1 }] });

    // A second tab of Ada's shares the first one's stream: it opens no
    // connection (Ada stays at one stream) and learns who is here from
    // the tab holding it.
    const ada2 = await openTab(ada, app, 'ada');
    await membersAre(ada2, ['ada']);
    assert.equal((await tabOf(ada2)).leader, false);
    assert.deepEqual(await presenceOf(ada2), own);

    const bob1 = await openTab(bob, app, 'bob');
    for (const page of [ada1, ada2, bob1]) await membersAre(page, ['ada', 'bob']);
    for (const page of [ada1, ada2]) {
      const { changes } = await tabOf(page);
      assert.deepEqual(changes.at(-1), { snapshot: false, joined: ['bob'], left: [], count: 2 }, 'Bob joined');
    }
    // Bob's first report is his stream's snapshot; whether it already
    // lists Bob himself depends on how soon the relay saw him join.
    const [first] = (await tabOf(bob1)).changes;
    assert.equal(first.snapshot, true);
    assert.ok(first.joined.includes('ada'), JSON.stringify(first));

    // Presence is never an event, and never moves the watermark.
    const event = await publishEvent(relay.base, env.EVENTRELAY_PUBLISH__TOKEN, { type: 'doc.edited', scopeKey: 'org-p1', data: { by: 'ada' } });
    for (const page of [ada1, ada2, bob1]) {
      await page.waitForFunction((id) => window.tab.events.some((e) => e.id === id), event.id, { timeout: DEADLINE_MS });
      const tab = await tabOf(page);
      assert.deepEqual(tab.events.map((e) => e.type), ['doc.edited']);
      assert.match(tab.lastEventId, new RegExp(`^${event.seq}\\.`));
    }

    await bob1.close();
    for (const page of [ada1, ada2]) {
      await membersAre(page, ['ada']);
      const { changes } = await tabOf(page);
      assert.deepEqual(changes.at(-1), { snapshot: false, joined: [], left: ['bob'], count: 1 }, 'Bob left');
    }

    // The tab holding Ada's stream closes: the other takes it over, and its
    // own stream's snapshot lists Ada (one stream again) and no one else.
    const [leader, follower] = (await tabOf(ada1)).leader ? [ada1, ada2] : [ada2, ada1];
    await leader.close();
    await follower.waitForFunction(() => window.client.isLeader && window.client.state === 'connected', undefined, { timeout: DEADLINE_MS });
    await follower.waitForFunction(
      () => {
        const p = window.presence();
        return p?.count === 1 && p.members.length === 1 && p.members[0].id === 'ada' && p.members[0].streams === 1;
      },
      undefined,
      { timeout: DEADLINE_MS },
    );
  } finally {
    await ada.close();
    await bob.close();
    await app.close();
  }
});

test('the inspector lists the members of the scope it watches', { skip }, async () => {
  // The page from this checkout (the relay serves the copy it was built
  // with), and the client next to it, on an origin that passes
  // /v1/events through to the relay.
  const app = await serveApp(readFileSync(inspectorPage, 'utf8'), {
    '/inspector/eventrelay-client.js': (_request, response) => {
      response.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8' });
      response.end(readFileSync(path.join(here, '../eventrelay-client.js')));
    },
    '/v1/events': (request, response) => forwardStream(relay.base, request, response),
  });
  const tabs = await startApp(relay.base, 'org-p2');
  const context = await browser.newContext();
  try {
    // A scope without presence: an event after `ready` shows that no
    // snapshot came (it would have come first).
    const page = await context.newPage();
    await page.goto(`${app.origin}/?token=${await mintToken(env, 'inspector', 'doc-p2', 3600)}`);
    await page.waitForSelector('#state[data-state="connected"]', { timeout: DEADLINE_MS });
    const event = await publishEvent(relay.base, env.EVENTRELAY_PUBLISH__TOKEN, { type: 'doc.edited', scopeKey: 'doc-p2', data: {} });
    await page.waitForSelector(`tr[data-id="${event.id}"]`, { timeout: DEADLINE_MS });
    assert.ok(await page.isVisible('#presence-empty'));
    assert.equal(await page.$$eval('#presence tr', (rows) => rows.length), 0);

    // The same page on a scope with presence.
    await page.fill('#token', await mintToken(env, 'inspector', 'org-p2', 3600));
    await page.click('#connect');
    await page.waitForSelector('#presence tr[data-member="inspector"]', { timeout: DEADLINE_MS });
    assert.ok(!(await page.isVisible('#presence-empty')));

    const cyd = await openTab(context, tabs, 'cyd');
    await page.waitForSelector('#presence tr[data-member="cyd"]', { timeout: DEADLINE_MS });
    assert.equal(await page.textContent('#presence-count'), '(2)');
    const row = await page.$$eval('#presence tr[data-member="cyd"] td', (cells) => cells.map((c) => c.textContent));
    assert.deepEqual(row.slice(0, 2), ['cyd', '1']);

    await cyd.close();
    await page.waitForSelector('#presence tr[data-member="cyd"]', { state: 'detached', timeout: DEADLINE_MS });
    assert.equal(await page.textContent('#presence-count'), '(1)');
  } finally {
    await context.close();
    await tabs.close();
    await app.close();
  }
});
