// The client against the real relay: a Postgres, the eventrelay binary, and
// real HTTP. Needs DATABASE_URL (default: the local server) and a built
// binary (EVENTRELAY_BIN, default ../../target/debug/eventrelay).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { createEventStreamClient } from '../eventrelay-client.js';
import { startRelay as startRelayWith, until as untilWithin } from './support.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const binary = process.env.EVENTRELAY_BIN ?? path.join(here, '../../../target/debug/eventrelay');
const suffix = randomUUID().replaceAll('-', '').slice(0, 16);
// EVENTRELAY_BIN is for this test, not a relay setting: keep it from the relay.
const { EVENTRELAY_BIN: _binary, ...inherited } = process.env;
const env = {
  ...inherited,
  DATABASE_URL: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
  EVENTRELAY_DATABASE__SCHEMA: `ejs_${suffix}`,
  EVENTRELAY_DATABASE__CHANNEL: `ejs_${suffix}`,
  EVENTRELAY_HTTP__BIND: '127.0.0.1:0',
  EVENTRELAY_AUTH__MODE: 'jwt',
  EVENTRELAY_AUTH__SECRET: 'js-client-test-secret-long-enough-for-hs256',
  EVENTRELAY_PUBLISH__TOKEN: 'js-client-publish-token',
  EVENTRELAY_SSE__HEARTBEAT_SECS: '1',
  EVENTRELAY_WEBHOOKS__ENABLED: 'false',
  RUST_LOG: 'warn',
};
const DEADLINE_MS = 10000;
const startRelay = () => startRelayWith(binary, env);
const until = (condition, what) => untilWithin(condition, what, DEADLINE_MS);


async function ready(base) {
  const deadline = Date.now() + DEADLINE_MS;
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

function token(subscriber, scope) {
  return execFileSync(binary, ['token', '--subscriber', subscriber, '--scope', scope], { env })
    .toString()
    .trim();
}

async function publish(base, event) {
  const response = await fetch(`${base}/v1/events`, {
    method: 'POST',
    headers: { authorization: `Bearer ${env.EVENTRELAY_PUBLISH__TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify(event),
  });
  assert.equal(response.status, 200, await response.clone().text());
  return (await response.json()).events[0];
}


after(() => {
  try {
    execFileSync('psql', [env.DATABASE_URL, '-qc', `DROP SCHEMA IF EXISTS ${env.EVENTRELAY_DATABASE__SCHEMA} CASCADE`], {
      stdio: 'ignore',
    });
  } catch {}
});

test('events arrive, a first connection resyncs, and a relay restart loses nothing', async () => {
  let relay = await startRelay();
  await ready(relay.base);
  const alice = token('alice', 'org-1');
  const received = [];
  const states = [];
  let resyncs = 0;
  const client = createEventStreamClient({
    buildRequest: () => ({ url: `${relay.base}/v1/events`, headers: { authorization: `Bearer ${alice}` } }),
    onEvent: (event) => received.push(event),
    onStateChange: (state) => states.push(state),
    onResync: () => resyncs++,
    initialDelayMs: 50,
    maxDelayMs: 200,
  });
  client.start();
  await until(() => client.state === 'connected', 'connected');
  assert.equal(resyncs, 1);

  const first = await publish(relay.base, { type: 'order.created', scopeKey: 'org-1', lane: 'durable', data: { n: 1 } });
  await publish(relay.base, { type: 'sync.progress', scopeKey: 'org-1', lane: 'ephemeral', data: {} });
  await until(() => received.length === 2, 'two events');
  assert.match(client.lastEventId, new RegExp(`^${first.seq}\\.\\d+\\.[0-9a-f]{6}$`), 'only durable events move the watermark, to their cursor');

  await stopRelay(relay.child);
  relay = await startRelay();
  await ready(relay.base);
  // Emitted before the client is back: it must replay them.
  const missed = [];
  for (let n = 2; n <= 4; n++) {
    missed.push(await publish(relay.base, { type: 'order.created', scopeKey: 'org-1', lane: 'durable', data: { n } }));
  }
  await until(() => missed.every((m) => received.some((r) => r.id === m.id)), 'the replay');
  assert.ok(states.includes('reconnecting'));
  const ids = received.map((r) => r.id);
  assert.equal(new Set(ids).size, ids.length, 'no duplicates reach the app');
  client.stop();
  assert.equal(client.state, 'stopped');
  await stopRelay(relay.child);
});

test('401 stops the client unless the refresh hook supplies credentials', async () => {
  const relay = await startRelay();
  await ready(relay.base);
  let credentials = 'not-a-token';
  const errors = [];
  const stopping = createEventStreamClient({
    buildRequest: () => ({ url: `${relay.base}/v1/events`, headers: { authorization: `Bearer ${credentials}` } }),
    onError: (error) => errors.push(error),
  });
  stopping.start();
  await until(() => stopping.state === 'stopped' && errors.length === 1, 'the client to stop');
  assert.equal(errors[0].status, 401);

  let refreshed = 0;
  const recovering = createEventStreamClient({
    buildRequest: () => ({ url: `${relay.base}/v1/events`, headers: { authorization: `Bearer ${credentials}` } }),
    onUnauthorized: async () => {
      refreshed++;
      credentials = token('bob', 'org-1');
      return true;
    },
    initialDelayMs: 20,
  });
  recovering.start();
  await until(() => recovering.state === 'connected', 'the refreshed connection');
  assert.equal(refreshed, 1);
  recovering.stop();
  await stopRelay(relay.child);
});

test('repeated failures report degraded', async () => {
  const states = [];
  const client = createEventStreamClient({
    buildRequest: () => ({ url: 'http://127.0.0.1:9/v1/events' }),
    onStateChange: (state) => states.push(state),
    degradedAfter: 2,
    initialDelayMs: 10,
    maxDelayMs: 20,
  });
  client.start();
  await until(() => client.state === 'degraded', 'degraded');
  client.stop();
  assert.deepEqual(states.slice(0, 3), ['connecting', 'reconnecting', 'degraded']);
});
