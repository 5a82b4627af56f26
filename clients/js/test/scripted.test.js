// The client against small scripted relays: real HTTP over TCP on port 0,
// each answering connections the way a test needs (ending early, aborting
// the body, refusing with Retry-After, sending reserved event types).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { createEventStreamClient, parseRetryAfter, isReservedEventType, deriveShareName } from '../eventrelay-client.js';

const DEADLINE_MS = 10000;

async function until(condition, what, deadlineMs = DEADLINE_MS) {
  const deadline = Date.now() + deadlineMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/**
 * A relay that answers the n-th connection (from 0) with `script(n, request,
 * response)`, and records when each arrived and what it sent.
 */
async function scripted(script) {
  const requests = [];
  const server = createServer((request, response) => {
    const n = requests.length;
    requests.push({ at: Date.now(), url: request.url, headers: request.headers });
    script(n, request, response);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${server.address().port}/v1/events`;
  const close = () =>
    new Promise((resolve) => {
      server.closeAllConnections();
      server.close(resolve);
    });
  return { url, requests, close };
}

/** Starts an event stream; the body is chunked, so an abort is visible. */
function stream(response, text = '') {
  response.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-store' });
  response.write(`retry: 10\n\n${text}`);
}

const ready = (resync = false) => `event: ready\ndata: ${JSON.stringify({ resync })}\n\n`;

function envelope(n, { lane = 'durable', type = 'order.created' } = {}) {
  return {
    id: `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`,
    type,
    scopeKey: 'org-1',
    lane,
    ...(lane === 'durable' ? { seq: n } : {}),
    data: { n },
    resources: [],
    occurredAt: '2026-01-01T00:00:00Z',
  };
}

/** The frame the relay sends for an envelope: durable events carry `id:`. */
function frame(event) {
  const id = event.lane === 'durable' ? `id: ${event.seq}\n` : '';
  return `${id}event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`;
}

/** A client with fast backoff that records what it reports. */
function client(url, options = {}) {
  const seen = { states: [], events: [], errors: [], resyncs: 0 };
  const instance = createEventStreamClient({
    buildRequest: () => ({ url }),
    onEvent: (event) => seen.events.push(event),
    onStateChange: (state) => seen.states.push(state),
    onResync: () => seen.resyncs++,
    onError: (error) => seen.errors.push(error),
    initialDelayMs: 10,
    maxDelayMs: 20,
    ...options,
  });
  instance.start();
  return { instance, seen };
}

test('a relay that accepts and then ends every stream before ready leads to degraded', async () => {
  // What a relay does when it answers 200 and then cannot serve: nothing
  // after the headers (and a replayed event), then a clean end.
  const relay = await scripted((n, _request, response) => {
    stream(response, `: warming up\n\n${frame(envelope(n + 1))}`);
    response.end();
  });
  const { instance, seen } = client(relay.url, { degradedAfter: 3 });
  try {
    await until(() => instance.state === 'degraded', 'degraded');
    assert.ok(relay.requests.length >= 3, `${relay.requests.length} attempts`);
    assert.ok(!seen.states.includes('connected'));
    assert.deepEqual(seen.states.slice(0, 3), ['connecting', 'reconnecting', 'degraded']);
    // What did arrive before the end is kept and replayed from.
    assert.ok(seen.events.length >= 1);
    assert.equal(relay.requests[1].headers['last-event-id'], '1');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('a stream that ends cleanly after ready is a normal reconnect, never a failure', async () => {
  const relay = await scripted((n, _request, response) => {
    stream(response, `${ready(n === 0)}${frame(envelope(n + 1))}`);
    response.end();
  });
  // One failure would be enough to degrade.
  const { instance, seen } = client(relay.url, { degradedAfter: 1 });
  try {
    await until(() => seen.events.length >= 4, 'four streams');
    assert.ok(!seen.states.includes('degraded'), seen.states.join());
    assert.ok(seen.states.filter((s) => s === 'connected').length >= 4);
    assert.equal(seen.resyncs, 1);
    // Each reconnect replays from the last durable id.
    for (let n = 1; n < 4; n++) assert.equal(relay.requests[n].headers['last-event-id'], String(n));
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('a body that errors mid-replay is a failure, not a clean end', async () => {
  // The relay's replay from the database failed part-way: it aborts the
  // chunked response (no terminating chunk) after some events.
  const relay = await scripted((n, _request, response) => {
    stream(response, frame(envelope(n * 2 + 1)) + frame(envelope(n * 2 + 2)));
    setImmediate(() => response.socket.destroy());
  });
  const { instance, seen } = client(relay.url, { degradedAfter: 2 });
  try {
    await until(() => instance.state === 'degraded', 'degraded');
    assert.deepEqual(seen.states.slice(0, 3), ['connecting', 'reconnecting', 'degraded']);
    assert.ok(seen.events.length >= 2);
    assert.equal(relay.requests[1].headers['last-event-id'], '2');
    assert.deepEqual(seen.errors, [], 'failed attempts are not application errors');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('a body that errors after ready counts as a failure too', async () => {
  const relay = await scripted((n, _request, response) => {
    stream(response, ready(false) + frame(envelope(n + 1)));
    setImmediate(() => response.socket.destroy());
  });
  const { instance, seen } = client(relay.url, { degradedAfter: 1 });
  try {
    await until(() => instance.state === 'degraded', 'degraded');
    assert.deepEqual(seen.states.slice(0, 3), ['connecting', 'connected', 'degraded']);
    // Ready again on the next connection: connected, the count reset.
    await until(() => seen.states.filter((s) => s === 'connected').length >= 2, 'a second connection');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('Retry-After is read as seconds or an HTTP date', () => {
  const now = Date.parse('2026-01-01T00:00:00Z');
  assert.equal(parseRetryAfter('0', now), 0);
  assert.equal(parseRetryAfter(' 12 ', now), 12000);
  assert.equal(parseRetryAfter('Thu, 01 Jan 2026 00:00:30 GMT', now), 30000);
  assert.equal(parseRetryAfter('Wed, 31 Dec 2025 23:00:00 GMT', now), 0, 'a date in the past: at once');
  assert.equal(parseRetryAfter('soon', now), undefined);
  assert.equal(parseRetryAfter('-5', now), undefined);
  assert.equal(parseRetryAfter('1.5', now), undefined);
  assert.equal(parseRetryAfter('Thursday, 01-Jan-26 00:00:10 GMT', now), 10000, 'the obsolete RFC 850 form');
  assert.equal(parseRetryAfter(undefined, now), undefined);
});

test('503 with Retry-After in seconds delays the next attempt at least that long', async () => {
  const relay = await scripted((n, _request, response) => {
    if (n === 0) {
      response.writeHead(503, { 'retry-after': '1', 'content-type': 'application/json' });
      response.end('{"error":{"code":"unavailable","message":"database down"}}');
    } else {
      stream(response, ready(true));
    }
  });
  const { instance } = client(relay.url);
  try {
    await until(() => instance.state === 'connected', 'connected');
    const waited = relay.requests[1].at - relay.requests[0].at;
    // Without Retry-After, the backoff here is at most 20 ms.
    assert.ok(waited >= 990, `waited ${waited} ms`);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('429 with Retry-After as an HTTP date delays the next attempt until then', async () => {
  let until429;
  const relay = await scripted((n, _request, response) => {
    if (n === 0) {
      // HTTP dates have whole seconds: this is 1 to 2 seconds from now.
      const date = new Date(Date.now() + 2000).toUTCString();
      until429 = Date.parse(date);
      response.writeHead(429, { 'retry-after': date });
      response.end();
    } else {
      stream(response, ready(true));
    }
  });
  const { instance } = client(relay.url);
  try {
    await until(() => instance.state === 'connected', 'connected');
    assert.ok(relay.requests[1].at >= until429 - 10, `came back ${until429 - relay.requests[1].at} ms early`);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('a Retry-After longer than maxRetryAfterMs is cut to it; other statuses ignore the header', async () => {
  const relay = await scripted((n, _request, response) => {
    if (n === 0) {
      response.writeHead(503, { 'retry-after': '3600' });
      response.end();
    } else if (n === 1) {
      response.writeHead(500, { 'retry-after': '3600' });
      response.end();
    } else {
      stream(response, ready(true));
    }
  });
  const { instance, seen } = client(relay.url, { maxRetryAfterMs: 300 });
  try {
    await until(() => instance.state === 'connected', 'connected', 5000);
    const capped = relay.requests[1].at - relay.requests[0].at;
    assert.ok(capped >= 290 && capped < 3000, `waited ${capped} ms after 503`);
    const ignored = relay.requests[2].at - relay.requests[1].at;
    assert.ok(ignored < 290, `waited ${ignored} ms after 500`);
    assert.deepEqual(seen.errors, []);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('reserved event types reach neither the application nor the control path', async () => {
  const namedReady = envelope(10, { type: 'ready' });
  const namedError = envelope(20, { lane: 'ephemeral', type: 'error' });
  const namedOpen = envelope(21, { lane: 'ephemeral', type: 'open' });
  const real = envelope(11);
  const body = [
    // Looks like a control frame but carries an id: not the relay's.
    'id: 9\nevent: ready\ndata: {"resync":true}\n\n',
    frame(namedReady),
    frame(namedError),
    frame(namedOpen),
    'event: eventrelay.future\ndata: {}\n\n',
    // The real control frame: no id of its own, though the parser still
    // holds 10 as the last id.
    ready(false),
    frame(real),
  ].join('');
  const relay = await scripted((_n, _request, response) => stream(response, body));
  const { instance, seen } = client(relay.url);
  try {
    await until(() => seen.events.length === 1, 'the application event');
    assert.equal(instance.state, 'connected');
    assert.deepEqual(seen.events, [real]);
    assert.equal(seen.resyncs, 0, 'only the real ready frame is the control frame');
    assert.deepEqual(
      seen.errors.map((e) => [e.code, e.eventType]),
      [
        ['reserved_event_type', 'ready'],
        ['reserved_event_type', 'ready'],
        ['reserved_event_type', 'error'],
        ['reserved_event_type', 'open'],
        ['reserved_event_type', 'eventrelay.future'],
      ],
    );
    // The dropped durable event still moved the watermark past itself.
    assert.equal(instance.lastEventId, '11');
    assert.equal(relay.requests.length, 1);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('a ready frame that carries an id never makes the stream ready', async () => {
  const relay = await scripted((_n, _request, response) => {
    stream(response, 'id: 9\nevent: ready\ndata: {"resync":false}\n\n');
    response.end();
  });
  const { instance, seen } = client(relay.url, { degradedAfter: 2 });
  try {
    await until(() => instance.state === 'degraded', 'degraded');
    assert.ok(!seen.states.includes('connected'));
    assert.deepEqual(seen.events, []);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('without onError, a dropped frame is reported on console.warn', async () => {
  const relay = await scripted((_n, _request, response) => {
    stream(response, `${ready(false)}${frame(envelope(5, { type: 'eventrelay.internal' }))}${frame(envelope(6))}`);
  });
  const warnings = [];
  const warn = console.warn;
  console.warn = (message) => warnings.push(message);
  const events = [];
  const instance = createEventStreamClient({ buildRequest: () => ({ url: relay.url }), onEvent: (e) => events.push(e) });
  instance.start();
  try {
    await until(() => events.length === 1, 'the application event');
    assert.equal(events[0].seq, 6);
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], /eventrelay\.internal/);
  } finally {
    console.warn = warn;
    instance.stop();
    await relay.close();
  }
});

test('the reserved rule matches the relay’s', () => {
  for (const type of ['ready', 'open', 'error', 'reauth', 'revoked', 'presence', 'eventrelay.', 'eventrelay.resync']) assert.ok(isReservedEventType(type), type);
  for (const type of ['Ready', 'ready.changed', 'order.error', 'message', 'eventrelay', 'eventrelay.subscription.paused']) assert.ok(!isReservedEventType(type), type);
});

test('an application callback that throws does not break the stream', async () => {
  const relay = await scripted((_n, _request, response) => {
    stream(response, `${ready(false)}${frame(envelope(1))}${frame(envelope(2))}`);
  });
  const events = [];
  const uncaught = [];
  // Browsers have reportError; here it stands in for the global error report.
  globalThis.reportError = (error) => uncaught.push(error);
  const instance = createEventStreamClient({
    buildRequest: () => ({ url: relay.url }),
    onEvent: (event) => {
      events.push(event);
      if (event.seq === 1) throw new Error('application bug');
    },
  });
  instance.start();
  try {
    await until(() => events.length === 2 && uncaught.length === 1, 'both events and the reported error');
    assert.equal(uncaught[0].message, 'application bug');
    assert.equal(relay.requests.length, 1, 'no reconnect');
    assert.equal(instance.state, 'connected');
  } finally {
    delete globalThis.reportError;
    instance.stop();
    await relay.close();
  }
});

test('tabs meet under a name that depends on the stream and the subscriber, not on the token’s lifetime', async () => {
  const jwt = (claims) => `Bearer e30.${Buffer.from(JSON.stringify(claims)).toString('base64url')}.c2ln`;
  const url = 'https://app.example/v1/events';
  const name = (authorization, at = url) => deriveShareName({ url: at, headers: { authorization } });
  const alice = { sub: 'alice', scope: 'org-1', grants: { orders: ['read'] } };
  const first = await name(jwt({ ...alice, iat: 1, exp: 100 }));
  // Another token for the same subscriber (other times, claims in another order).
  assert.equal(await name(jwt({ exp: 200, scope: 'org-1', grants: { orders: ['read'] }, sub: 'alice', iat: 2 })), first);
  assert.notEqual(await name(jwt({ ...alice, sub: 'bob', exp: 100 })), first);
  assert.notEqual(await name(jwt({ ...alice, grants: {}, exp: 100 })), first);
  assert.notEqual(await name(jwt({ ...alice, exp: 100 }), 'https://other.example/v1/events'), first);
  // Not a JWT: the credential as written.
  assert.equal(await name('Bearer opaque'), await name('Bearer opaque'));
  assert.notEqual(await name('Bearer opaque'), await name('Bearer other'));
  assert.match(first, /^[0-9a-f]{32}$/);
});

// Token renewal: `getToken` and the relay's `reauth` warning.

const reauth = (expiresIn = 2) => `event: reauth\ndata: ${JSON.stringify({ expiresIn })}\n\n`;

/** A `getToken` that hands out token-1, token-2, … and counts its calls. */
function tokens() {
  const issued = [];
  const getToken = async () => {
    const token = `token-${issued.length + 1}`;
    issued.push(token);
    return token;
  };
  return { issued, getToken };
}

/**
 * A relay whose connections the test drives itself: each one is kept, with
 * when the client closed it, and the script only opens them.
 */
async function driven(open = (_n, _request, response) => stream(response)) {
  const connections = [];
  const relay = await scripted((n, request, response) => {
    const connection = { response, closed: false, openWhenArrived: connections.filter((c) => !c.closed).map((c) => c.n), n };
    connections.push(connection);
    response.on('close', () => {
      connection.closed = true;
    });
    open(n, request, response);
  });
  return { ...relay, connections };
}

const ids = (events) => events.map((e) => e.seq);

test('on reauth, the next stream opens with a fresh token before the old one ends, which closes at the new one’s ready', async () => {
  const relay = await driven();
  const { issued, getToken } = tokens();
  const e = (n) => envelope(n);
  const { instance, seen } = client(relay.url, { getToken });
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    const [old] = relay.connections;
    old.response.write(ready(true) + frame(e(1)) + frame(e(2)) + reauth());
    await until(() => relay.connections.length === 2, 'the next stream, opened on the warning');
    const next = relay.connections[1];
    assert.deepEqual(next.openWhenArrived, [0], 'the old stream was still open');
    assert.equal(relay.requests[0].headers.authorization, 'Bearer token-1');
    assert.equal(relay.requests[1].headers.authorization, 'Bearer token-2');
    assert.equal(relay.requests[1].headers['last-event-id'], '2');

    // Both deliver until the new one is ready: the old one live, the new
    // one its replay (reaching back before the watermark, as the relay's
    // lookback does), each ahead of the other in turn.
    old.response.write(frame(e(3)));
    await until(() => seen.events.length === 3, 'the old stream’s live event');
    next.response.write(frame(e(2)) + frame(e(3)) + frame(e(4)));
    await until(() => seen.events.length === 4, 'the new stream’s replay');
    old.response.write(frame(e(4)) + frame(e(5)));
    await until(() => seen.events.length === 5, 'the old stream, still delivering');
    assert.ok(!old.closed, 'not closed before the new stream is ready');
    next.response.write(frame(e(5)) + ready(false) + frame(e(6)));
    await until(() => old.closed, 'the old stream to close at the new one’s ready');
    await until(() => seen.events.length === 6, 'the live event after ready');
    next.response.write(frame(e(7)));
    await until(() => seen.events.length === 7, 'the next live event');

    assert.deepEqual(ids(seen.events), [1, 2, 3, 4, 5, 6, 7], 'each once, in order');
    assert.deepEqual(issued, ['token-1', 'token-2']);
    assert.deepEqual(seen.states, ['connecting', 'connected'], 'never a reconnect');
    assert.equal(seen.resyncs, 1, 'only the first stream asked for a resync');
    assert.equal(instance.lastEventId, '7');
    assert.equal(relay.connections.length, 2);
    assert.deepEqual(seen.errors, []);

    // The new stream's own warning renews again.
    next.response.write(reauth());
    await until(() => relay.connections.length === 3, 'the third stream');
    assert.equal(relay.requests[2].headers.authorization, 'Bearer token-3');
    assert.equal(relay.requests[2].headers['last-event-id'], '7');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('a refused renewal leaves the old stream on, and its end reconnects with another fresh token', async () => {
  const relay = await driven((n, _request, response) => {
    if (n === 1) {
      response.writeHead(401, { 'content-type': 'application/json' });
      response.end('{"error":{"code":"unauthorized","message":"no"}}');
    } else {
      stream(response);
    }
  });
  const { issued, getToken } = tokens();
  const { instance, seen } = client(relay.url, { getToken });
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    const [old] = relay.connections;
    old.response.write(ready(true) + frame(envelope(1)) + reauth());
    await until(() => relay.connections[1]?.closed, 'the refused renewal');
    old.response.write(frame(envelope(2)));
    await until(() => seen.events.length === 2, 'the old stream, still delivering');
    assert.equal(instance.state, 'connected');
    old.response.end();
    await until(() => relay.connections.length === 3, 'the reconnect');
    relay.connections[2].response.write(ready(false) + frame(envelope(3)));
    await until(() => seen.events.length === 3, 'the new stream');
    assert.deepEqual(ids(seen.events), [1, 2, 3]);
    // The refused token is not sent again.
    assert.deepEqual(relay.requests.map((r) => r.headers.authorization), ['Bearer token-1', 'Bearer token-2', 'Bearer token-3']);
    assert.equal(relay.requests[2].headers['last-event-id'], '2');
    assert.deepEqual(issued.length, 3);
    assert.deepEqual(seen.errors, [], 'a failed renewal is not an application error');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('when the old stream ends before the new one is ready, the new one carries on', async () => {
  const relay = await driven();
  const { issued, getToken } = tokens();
  const { instance, seen } = client(relay.url, { getToken });
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    const [old] = relay.connections;
    old.response.write(ready(true) + frame(envelope(1)) + reauth());
    await until(() => relay.connections.length === 2, 'the next stream');
    old.response.end();
    await until(() => instance.state === 'reconnecting', 'reconnecting');
    const next = relay.connections[1];
    next.response.write(frame(envelope(1)) + frame(envelope(2)) + ready(false) + frame(envelope(3)));
    await until(() => seen.events.length === 3, 'the new stream');
    assert.deepEqual(ids(seen.events), [1, 2, 3]);
    assert.deepEqual(seen.states, ['connecting', 'connected', 'reconnecting', 'connected']);
    assert.equal(relay.connections.length, 2, 'no third connection');
    assert.equal(issued.length, 2);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('with getToken, a refused token is replaced once per ready stream; a second refusal in a row stops', async () => {
  const relay = await driven((n, _request, response) => {
    if (n === 1) {
      stream(response, ready(true) + frame(envelope(1)));
      response.end();
    } else {
      response.writeHead(401, { 'content-type': 'application/json' });
      response.end('{"error":{"code":"unauthorized","message":"no"}}');
    }
  });
  const { issued, getToken } = tokens();
  const { instance, seen } = client(relay.url, { getToken });
  try {
    await until(() => instance.state === 'stopped', 'stopped');
    assert.deepEqual(
      relay.requests.map((r) => r.headers.authorization),
      // Refused, renewed and ready; the same token again after the clean
      // end (refused); renewed once more (refused): stop.
      ['Bearer token-1', 'Bearer token-2', 'Bearer token-2', 'Bearer token-3'],
    );
    assert.equal(issued.length, 3);
    assert.deepEqual(ids(seen.events), [1]);
    assert.deepEqual(seen.errors.map((e) => [e.code, e.status]), [['unauthorized', 401]]);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('without getToken, reauth opens no stream early: the client reconnects when the stream ends', async () => {
  const relay = await driven();
  const { instance, seen } = client(relay.url);
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    const [old] = relay.connections;
    old.response.write(ready(true) + frame(envelope(1)) + reauth() + frame(envelope(2)));
    await until(() => seen.events.length === 2, 'the events around the warning');
    old.response.end();
    await until(() => relay.connections.length === 2, 'the reconnect');
    assert.deepEqual(relay.connections[1].openWhenArrived, [], 'only after the old stream ended');
    assert.deepEqual(seen.errors, [], 'the warning is no error');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('getToken or url: a client without a request is refused at creation', () => {
  assert.throws(() => createEventStreamClient({ getToken: async () => 't' }), TypeError);
});

test('with url and getToken, no buildRequest is needed', async () => {
  const relay = await driven((_n, _request, response) => stream(response, ready(true) + frame(envelope(1))));
  const events = [];
  const instance = createEventStreamClient({ url: relay.url, getToken: async () => 'only', onEvent: (e) => events.push(e) });
  instance.start();
  try {
    await until(() => events.length === 1, 'the event');
    assert.equal(relay.requests[0].headers.authorization, 'Bearer only');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('with getToken, a stream that ends on its expired token without a warning reconnects with a fresh one', async () => {
  // A relay with `sse.reauth_lead_secs = 0`: the stream just ends. The
  // token the client holds has expired but is within the relay's clock
  // leeway, so the relay accepts it and ends the stream at once, before
  // `ready`, rather than refusing it.
  const relay = await driven((n, request, response) => {
    if (n === 0) {
      stream(response, ready(true) + frame(envelope(1)));
      response.end();
    } else if (request.headers.authorization === 'Bearer token-1') {
      stream(response);
      response.end();
    } else {
      stream(response, frame(envelope(1)) + ready(false) + frame(envelope(2)));
    }
  });
  const { issued, getToken } = tokens();
  const { instance, seen } = client(relay.url, { getToken });
  try {
    await until(() => seen.events.length === 2, 'the event after the reconnect');
    assert.deepEqual(ids(seen.events), [1, 2]);
    assert.deepEqual(relay.requests.map((r) => r.headers.authorization), ['Bearer token-1', 'Bearer token-1', 'Bearer token-2']);
    assert.equal(relay.requests[2].headers['last-event-id'], '1');
    assert.equal(issued.length, 2);
    assert.equal(instance.state, 'connected');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('a warning during the replay renews too: the new stream’s ready closes the old one', async () => {
  const relay = await driven();
  const { issued, getToken } = tokens();
  const { instance, seen } = client(relay.url, { getToken, lastEventId: '0' });
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    const [old] = relay.connections;
    // A short token and a long replay: the warning comes before `ready`.
    old.response.write(frame(envelope(1)) + reauth(1));
    await until(() => relay.connections.length === 2, 'the next stream');
    assert.equal(relay.requests[1].headers['last-event-id'], '1');
    const next = relay.connections[1];
    next.response.write(frame(envelope(1)) + frame(envelope(2)) + ready(false));
    await until(() => old.closed, 'the old stream to close');
    await until(() => instance.state === 'connected', 'connected');
    assert.deepEqual(ids(seen.events), [1, 2]);
    assert.deepEqual(seen.states, ['connecting', 'connected']);
    assert.equal(issued.length, 2);
  } finally {
    instance.stop();
    await relay.close();
  }
});

// Presence: `event: presence` frames, without an id, after `ready`.

/** A presence frame as the relay writes it; `members: null` is past the cap. */
function presence({ snapshot = false, count, members = [], left = [] }) {
  const listed = members === null ? null : members.map((m) => (typeof m === 'string' ? { id: m, streams: 1 } : m));
  const data = { scopeKey: 'org-1', snapshot, count: count ?? listed?.length ?? 0, members: listed, left: members === null && !snapshot ? null : left };
  return `event: presence\ndata: ${JSON.stringify(data)}\n\n`;
}

/** A client that also records what `onPresence` reports, as member ids. */
function presenceClient(url, options = {}) {
  const reported = [];
  const ids = (members) => members.map((m) => m.id).sort();
  const result = client(url, {
    onPresence: (state, change) =>
      reported.push({
        state,
        change,
        snapshot: change.snapshot,
        joined: ids(change.joined),
        updated: ids(change.updated),
        left: ids(change.left),
      }),
    ...options,
  });
  return { ...result, reported };
}

const memberIds = (state) => [...state.members.keys()].sort();

test('presence: the snapshot sets the members, changes join, update and leave them, and none of it is an event', async () => {
  const relay = await driven();
  const { instance, seen, reported } = presenceClient(relay.url);
  try {
    await until(() => relay.connections.length === 1, 'the stream');
    const [connection] = relay.connections;
    assert.equal(instance.presence, undefined, 'nothing before a snapshot');
    connection.response.write(
      ready(true) +
        frame(envelope(1)) +
        presence({ snapshot: true, members: [{ id: 'ada', streams: 2, info: { name: 'Ada' } }, 'bob'] }),
    );
    await until(() => reported.length === 1, 'the snapshot');
    let state = instance.presence;
    assert.equal(reported[0].state, state);
    assert.deepEqual(memberIds(state), ['ada', 'bob']);
    assert.deepEqual(state.members.get('ada'), { id: 'ada', streams: 2, info: { name: 'Ada' } });
    assert.deepEqual(state.members.get('bob'), { id: 'bob', streams: 1 }, 'no info key when the token carries none');
    assert.deepEqual({ scopeKey: state.scopeKey, count: state.count, countsOnly: state.countsOnly }, { scopeKey: 'org-1', count: 2, countsOnly: false });
    assert.deepEqual(reported[0], { ...reported[0], snapshot: true, joined: ['ada', 'bob'], updated: [], left: [] });
    const bob = state.members.get('bob');

    // Cyd joins and Ada opens a third tab; then Ada leaves; then a change
    // that repeats what is known changes nothing and reports nothing.
    connection.response.write(presence({ count: 3, members: ['cyd', { id: 'ada', streams: 3, info: { name: 'Ada' } }] }));
    await until(() => reported.length === 2, 'the join');
    assert.deepEqual(reported[1], { ...reported[1], snapshot: false, joined: ['cyd'], updated: ['ada'], left: [] });
    assert.equal(instance.presence.members.get('bob'), bob, 'a member that did not change keeps its object');
    assert.notEqual(instance.presence, state, 'a change is a new presence object');
    state = instance.presence;
    assert.equal(state.count, 3);
    connection.response.write(presence({ count: 3, members: ['cyd'] }) + presence({ count: 2, left: ['ada'] }) + frame(envelope(2)));
    await until(() => reported.length === 3 && seen.events.length === 2, 'the leave and the next event');
    assert.deepEqual(reported[2], { ...reported[2], snapshot: false, joined: [], updated: [], left: ['ada'] });
    assert.deepEqual(reported[2].change.left, [{ id: 'ada', streams: 3, info: { name: 'Ada' } }], 'who left, as they were');
    assert.deepEqual(memberIds(instance.presence), ['bob', 'cyd']);
    assert.equal(instance.presence.count, 2);

    assert.deepEqual(ids(seen.events), [1, 2], 'presence frames never reach onEvent');
    assert.equal(instance.lastEventId, '2');
    assert.deepEqual(seen.errors, []);
  } finally {
    instance.stop();
    await relay.close();
  }
  assert.equal(instance.presence, undefined, 'a stopped client forgets who was there');
});

test('presence frames never move the watermark, and one with an id of its own is an event under a reserved name', async () => {
  const relay = await driven();
  const { instance, seen, reported } = presenceClient(relay.url);
  try {
    await until(() => relay.connections.length === 1, 'the stream');
    relay.connections[0].response.write(
      ready(true) +
        frame(envelope(4)) +
        presence({ snapshot: true, members: ['ada'] }) +
        // Not the relay's: a control frame never carries an id.
        `id: 9\nevent: presence\ndata: ${JSON.stringify({ scopeKey: 'org-1', snapshot: true, count: 0, members: [], left: [] })}\n\n` +
        'event: presence\ndata: {"snapshot":"yes"}\n\n' +
        frame(envelope(5, { lane: 'ephemeral' })),
    );
    await until(() => seen.events.length === 2, 'the events');
    assert.deepEqual(
      seen.errors.map((e) => [e.code, e.eventType]),
      [
        ['reserved_event_type', 'presence'],
        ['malformed_presence', undefined],
      ],
    );
    assert.deepEqual(reported.length, 1, 'only the relay’s frame counts');
    assert.deepEqual(memberIds(instance.presence), ['ada']);
    assert.deepEqual(seen.events.map((e) => e.id), [envelope(4).id, envelope(5, { lane: 'ephemeral' }).id]);
    assert.equal(instance.lastEventId, '4');
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('presence: after a reconnect, the next snapshot replaces what was known', async () => {
  const relay = await driven();
  const { instance, seen, reported } = presenceClient(relay.url);
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    relay.connections[0].response.write(ready(true) + frame(envelope(1)) + presence({ snapshot: true, members: ['ada', 'bob'] }));
    await until(() => reported.length === 1, 'the first snapshot');
    relay.connections[0].response.end();
    await until(() => relay.connections.length === 2, 'the reconnect');
    assert.equal(relay.requests[1].headers['last-event-id'], '1');
    // Kept while reconnecting: the last known state until a new one arrives.
    assert.deepEqual(memberIds(instance.presence), ['ada', 'bob']);

    // While the client was away Bob left, Cyd came, and Ada's streams changed.
    relay.connections[1].response.write(ready(false) + presence({ snapshot: true, members: [{ id: 'ada', streams: 2 }, 'cyd'] }));
    await until(() => reported.length === 2, 'the second snapshot');
    assert.deepEqual(reported[1], { ...reported[1], snapshot: true, joined: ['cyd'], updated: ['ada'], left: ['bob'] });
    assert.deepEqual(memberIds(instance.presence), ['ada', 'cyd']);
    assert.equal(instance.presence.count, 2);

    // A third connection finds everyone where they were: nothing to report.
    relay.connections[1].response.end();
    await until(() => relay.connections.length === 3, 'the second reconnect');
    relay.connections[2].response.write(ready(false) + presence({ snapshot: true, members: [{ id: 'ada', streams: 2 }, 'cyd'] }) + frame(envelope(2)));
    await until(() => seen.events.length === 2, 'the event after it');
    assert.equal(reported.length, 2);
    assert.equal(instance.presence, reported[1].state);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('presence: past the relay’s cap only the count is known, until a snapshot lists everyone again', async () => {
  const relay = await driven();
  const { instance, reported } = presenceClient(relay.url);
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    const [connection] = relay.connections;
    connection.response.write(ready(true) + presence({ snapshot: true, members: ['ada', 'bob'] }));
    await until(() => reported.length === 1, 'the snapshot');

    connection.response.write(presence({ count: 3, members: null }));
    await until(() => reported.length === 2, 'the counts-only change');
    assert.deepEqual(
      { count: instance.presence.count, countsOnly: instance.presence.countsOnly, members: instance.presence.members.size },
      { count: 3, countsOnly: true, members: 0 },
    );
    assert.deepEqual(reported[1], { ...reported[1], joined: [], updated: [], left: ['ada', 'bob'] }, 'the list empties');

    // Back under the cap, a change names only who moved: the list cannot
    // be rebuilt from it, so it stays counts-only with the new count.
    connection.response.write(presence({ count: 2, left: ['cyd'] }));
    await until(() => reported.length === 3, 'the listed change');
    assert.deepEqual(
      { count: instance.presence.count, countsOnly: instance.presence.countsOnly, members: instance.presence.members.size },
      { count: 2, countsOnly: true, members: 0 },
    );

    // A snapshot past the cap (`left` stays a list there), then one that lists everyone.
    connection.response.end();
    await until(() => relay.connections.length === 2, 'the reconnect');
    relay.connections[1].response.write(
      ready(false) + `event: presence\ndata: ${JSON.stringify({ scopeKey: 'org-1', snapshot: true, count: 4, members: null, left: [] })}\n\n`,
    );
    await until(() => reported.length === 4, 'the counts-only snapshot');
    assert.deepEqual({ count: instance.presence.count, countsOnly: instance.presence.countsOnly }, { count: 4, countsOnly: true });
    relay.connections[1].response.end();
    await until(() => relay.connections.length === 3, 'the second reconnect');
    relay.connections[2].response.write(ready(false) + presence({ snapshot: true, members: ['ada', 'cyd'] }));
    await until(() => reported.length === 5, 'the listed snapshot');
    assert.deepEqual(
      { count: instance.presence.count, countsOnly: instance.presence.countsOnly, members: memberIds(instance.presence) },
      { count: 2, countsOnly: false, members: ['ada', 'cyd'] },
    );
    assert.deepEqual(reported[4], { ...reported[4], snapshot: true, joined: ['ada', 'cyd'], updated: [], left: [] });
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('presence: while a renewal overlaps two streams, the new one’s snapshot takes over at its ready', async () => {
  const relay = await driven();
  const { getToken } = tokens();
  const { instance, seen, reported } = presenceClient(relay.url, { getToken });
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    const [old] = relay.connections;
    old.response.write(ready(true) + presence({ snapshot: true, members: ['ada'] }) + reauth());
    await until(() => relay.connections.length === 2, 'the next stream');
    const next = relay.connections[1];
    // The old stream still reports until the new one is ready.
    old.response.write(presence({ count: 2, members: ['bob'] }));
    await until(() => reported.length === 2, 'the old stream’s change');
    next.response.write(ready(false) + presence({ snapshot: true, members: ['ada', 'bob', 'cyd'] }));
    await until(() => old.closed && reported.length === 3, 'the new stream’s snapshot');
    assert.deepEqual(reported[2], { ...reported[2], snapshot: true, joined: ['cyd'], updated: [], left: [] });
    assert.deepEqual(memberIds(instance.presence), ['ada', 'bob', 'cyd']);
    assert.deepEqual(seen.states, ['connecting', 'connected']);
    assert.deepEqual(seen.errors, []);
  } finally {
    instance.stop();
    await relay.close();
  }
});

// Several scopes on one stream: `scope` query parameters, a `ready` that
// names the scopes and those to re-read, a compound cursor as the `id:`,
// `revoked` for one scope, and a member list per scope.

/** The `ready` of a stream of several scopes, re-reading `resyncScopes`. */
const readyFor = (scopes, resyncScopes = []) =>
  `event: ready\ndata: ${JSON.stringify({ resync: resyncScopes.length > 0, scopes, resyncScopes })}\n\n`;

/** A durable event of `scopeKey` with a compound cursor as its `id:`, as a stream of several scopes sends it. */
function scoped(n, scopeKey) {
  const event = { ...envelope(n), scopeKey };
  return { event, cursor: `${n.toString(36)}.1g.9zk2a~k3j2~p0aa${n}.1b` };
}
const scopedFrame = ({ event, cursor }) => `id: ${cursor}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`;

/** A client recording each `onResync` call's arguments (an empty list for a call without any). */
function resyncClient(url, options = {}) {
  const resyncs = [];
  const result = client(url, { onResync: (...args) => resyncs.push(args), ...options });
  return { ...result, resyncs };
}

const revokedScope = (scope) => `event: revoked\ndata: ${JSON.stringify({ reason: 'disconnected', scope })}\n\n`;

/** A presence frame of `scopeKey`, as `presence` writes one for org-1. */
function scopePresence(scopeKey, options) {
  const text = presence(options);
  const data = JSON.parse(text.slice(text.indexOf('data: ') + 6));
  return `event: presence\ndata: ${JSON.stringify({ ...data, scopeKey })}\n\n`;
}

test('scopes: one scope parameter each, sorted and without repeats, in place of any the URL had', async () => {
  const relay = await scripted((_n, _request, response) => stream(response, readyFor(['a', 'z'])));
  const withUrl = createEventStreamClient({
    url: `${relay.url}?scope=old&x=a%20b&Scope=kept`,
    scopes: ['org-1', 'doc 7', 'b/c', 'org-1'],
    onError: () => {},
  });
  const built = createEventStreamClient({ buildRequest: () => ({ url: relay.url }), scopes: ['z', 'a'], onError: () => {} });
  const one = createEventStreamClient({ url: relay.url, scopes: ['org-1'], onError: () => {} });
  try {
    withUrl.start();
    await until(() => relay.requests.length === 1, 'the first stream');
    built.start();
    await until(() => relay.requests.length === 2, 'the second stream');
    one.start();
    await until(() => relay.requests.length === 3, 'the third stream');
    assert.deepEqual(
      relay.requests.map((r) => r.url),
      [
        '/v1/events?x=a%20b&Scope=kept&scope=b%2Fc&scope=doc%207&scope=org-1',
        '/v1/events?scope=a&scope=z',
        '/v1/events?scope=org-1',
      ],
    );
  } finally {
    for (const instance of [withUrl, built, one]) instance.stop();
    await relay.close();
  }
  // Without `scopes`, the URL is left as written.
  const plain = await scripted((_n, _request, response) => stream(response, ready(false)));
  const untouched = createEventStreamClient({ url: `${plain.url}?scope=old&x=1`, onError: () => {} });
  try {
    untouched.start();
    await until(() => plain.requests.length === 1, 'the stream');
    assert.equal(plain.requests[0].url, '/v1/events?scope=old&x=1');
  } finally {
    untouched.stop();
    await plain.close();
  }
});

test('scopes must be a non-empty array of non-empty strings', () => {
  for (const scopes of [[], [''], 'org-1', [1], ['org-1', undefined], {}, null]) {
    assert.throws(
      () => createEventStreamClient({ url: 'http://127.0.0.1:9/v1/events', scopes }),
      (error) => error instanceof TypeError && /scopes/.test(error.message),
      JSON.stringify(scopes),
    );
  }
  createEventStreamClient({ url: 'http://127.0.0.1:9/v1/events', scopes: ['org-1'] });
});

/**
 * Puts `value` in place of `navigator` (Node has none, or, from Node 21,
 * one without Web Locks); answers a function that puts the original back.
 */
function standInNavigator(value) {
  const original = Object.getOwnPropertyDescriptor(globalThis, 'navigator');
  Object.defineProperty(globalThis, 'navigator', { value, configurable: true, writable: true });
  return () => {
    if (original) Object.defineProperty(globalThis, 'navigator', original);
    else delete globalThis.navigator;
  };
}

/**
 * The lock name a client started with `options` asks for, with a stand-in
 * for the browser's Web Locks that never grants it.
 */
async function lockNameOf(options) {
  const names = [];
  const restore = standInNavigator({ locks: { request: (name) => (names.push(name), new Promise(() => {})) } });
  try {
    const instance = createEventStreamClient({ shareAcrossTabs: true, ...options });
    instance.start();
    await until(() => names.length === 1, 'the lock request');
    instance.stop();
  } finally {
    restore();
  }
  return names[0];
}

test('tabs share a stream by its set of scopes: the same set in any order, never another set', async () => {
  const url = 'https://relay.example/v1/events';
  const headers = { authorization: 'Bearer opaque' };
  const name = (scopes, form = 'url') =>
    lockNameOf(form === 'url' ? { url, scopes } : { buildRequest: () => ({ url, headers }), scopes });
  const ab = await name(['a', 'b']);
  assert.match(ab, /^eventrelay-v3:[0-9a-f]{32}$/);
  assert.equal(await name(['b', 'a']), ab);
  assert.equal(await name(['b', 'a', 'b']), ab);
  assert.notEqual(await name(['a']), ab);
  assert.notEqual(await name(['a', 'b', 'c']), ab);
  assert.notEqual(await name(undefined), ab);
  assert.notEqual(await name(undefined), await name(['a']));
  const abBuilt = await name(['a', 'b'], 'build');
  assert.equal(await name(['b', 'a'], 'build'), abBuilt);
  assert.notEqual(await name(['a', 'c'], 'build'), abBuilt);
  // The digest of the URL the client opens, as deriveShareName takes it.
  assert.equal(abBuilt, `eventrelay-v3:${await deriveShareName({ url: `${url}?scope=a&scope=b`, headers })}`);
});

test('several scopes: onResync is called for each scope the ready names, and the compound cursor is sent back as it came', async () => {
  const a1 = scoped(1, 'a');
  const b2 = scoped(2, 'b');
  const c3 = scoped(3, 'c');
  const a4 = scoped(4, 'a');
  const relay = await driven();
  const { instance, seen, resyncs } = resyncClient(relay.url, { scopes: ['c', 'a', 'b'] });
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    assert.equal(instance.scopes, undefined, 'nothing known before ready');
    relay.connections[0].response.write(readyFor(['a', 'b', 'c'], ['a', 'c']) + scopedFrame(a1) + scopedFrame(b2));
    await until(() => seen.events.length === 2, 'the first events');
    assert.deepEqual(resyncs, [['a'], ['c']]);
    assert.deepEqual(instance.scopes, ['a', 'b', 'c']);
    assert.equal(instance.lastEventId, b2.cursor);
    relay.connections[0].response.end(scopedFrame(c3));
    await until(() => relay.connections.length === 2, 'the reconnect');
    assert.equal(relay.requests[1].headers['last-event-id'], c3.cursor);
    assert.equal(relay.requests[1].url, '/v1/events?scope=a&scope=b&scope=c');

    // Nothing to re-read: no call at all.
    relay.connections[1].response.write(readyFor(['a', 'b', 'c']) + scopedFrame(a4));
    await until(() => seen.events.length === 4, 'the event after the reconnect');
    assert.deepEqual(resyncs, [['a'], ['c']]);
    relay.connections[1].response.end();
    await until(() => relay.connections.length === 3, 'the second reconnect');
    relay.connections[2].response.write(readyFor(['a', 'b', 'c'], ['b']));
    await until(() => resyncs.length === 3, 'the resync of b');
    assert.deepEqual(resyncs[2], ['b']);
    assert.deepEqual(seen.events.map((e) => [e.scopeKey, e.seq]), [['a', 1], ['b', 2], ['c', 3], ['a', 4]]);
    assert.deepEqual(seen.errors, []);
    assert.deepEqual(seen.states, ['connecting', 'connected', 'reconnecting', 'connected', 'reconnecting', 'connected']);
  } finally {
    instance.stop();
    await relay.close();
  }
  assert.equal(instance.scopes, undefined, 'a stopped client forgets them');
});

test('one scope: onResync is called without an argument, and scopes is the one asked for, if any', async () => {
  const relay = await scripted((n, _request, response) => stream(response, ready(n === 0) + frame(envelope(n + 1))));
  const asked = resyncClient(relay.url, { scopes: ['org-1'] });
  try {
    await until(() => asked.seen.events.length === 1, 'the event');
    assert.deepEqual(asked.resyncs, [[]]);
    assert.deepEqual(asked.instance.scopes, ['org-1']);
  } finally {
    asked.instance.stop();
  }
  const unnamed = resyncClient(relay.url);
  try {
    await until(() => unnamed.seen.events.length === 1, 'the event');
    assert.deepEqual(unnamed.resyncs, [], 'the relay asked for none');
    assert.equal(unnamed.instance.scopes, undefined, 'the stream carries the credentials’ scope, which the relay did not name');
  } finally {
    unnamed.instance.stop();
    await relay.close();
  }
});

test('a ready whose scope lists are unreadable is reported, still connects, and re-reads every scope', async () => {
  const scopes = ['a', 'b'];
  const each = [['a'], ['b']];
  // The ready's data, the onResync calls' arguments, the scopes asked for.
  const cases = [
    [{ resync: true, scopes, resyncScopes: 'a' }, each],
    [{ resync: true, scopes, resyncScopes: ['a', 7] }, each],
    [{ resync: true, scopes }, each],
    [{ resync: true, scopes, resyncScopes: [] }, each],
    [{ resync: false, scopes, resyncScopes: ['a'] }, each],
    [{ resync: true, scopes, resyncScopes: ['x'] }, each],
    // The scopes unreadable: those asked for, else everything in one call.
    [{ resync: false, scopes: [], resyncScopes: [] }, [['p'], ['q']], ['q', 'p']],
    [{ resync: false, scopes: 'a,b', resyncScopes: [] }, [['p'], ['q']], ['q', 'p']],
    [{ resync: false, scopes: ['a', ''], resyncScopes: [] }, [[]]],
  ];
  for (const [data, expected, asked] of cases) {
    const relay = await scripted((_n, _request, response) =>
      stream(response, `event: ready\ndata: ${JSON.stringify(data)}\n\n${frame(envelope(1))}`),
    );
    const { instance, seen, resyncs } = resyncClient(relay.url, { scopes: asked });
    try {
      await until(() => seen.events.length === 1, `the event after ${JSON.stringify(data)}`);
      assert.equal(instance.state, 'connected', JSON.stringify(data));
      assert.deepEqual(seen.errors.map((e) => e.code), ['malformed_ready'], JSON.stringify(data));
      assert.deepEqual(resyncs, expected, JSON.stringify(data));
      assert.equal(relay.requests.length, 1);
    } finally {
      instance.stop();
      await relay.close();
    }
  }
});

test('revoked with a scope takes that scope out and the stream goes on; without one it ends the stream', async () => {
  const relay = await driven();
  const { instance, seen, resyncs } = resyncClient(relay.url, { scopes: ['a', 'b', 'c'] });
  const members = (scope) => [...(instance.presenceOf(scope)?.members.keys() ?? [])];
  try {
    await until(() => relay.connections.length === 1, 'the stream');
    const [connection] = relay.connections;
    connection.response.write(readyFor(['a', 'b', 'c']) + scopePresence('b', { snapshot: true, members: ['ada'] }));
    await until(() => members('b').length === 1, 'b’s member list');
    connection.response.write(scopedFrame(scoped(1, 'a')) + scopedFrame(scoped(2, 'b')) + revokedScope('b') + scopedFrame(scoped(3, 'c')));
    await until(() => seen.events.length === 3, 'the event after the revocation');
    assert.deepEqual(seen.errors.map((e) => [e.name, e.code, e.scope]), [['EventRelayError', 'revoked', 'b']]);
    assert.deepEqual(instance.scopes, ['a', 'c']);
    assert.deepEqual(members('b'), [], 'no member list for a scope the stream no longer carries');
    assert.equal(instance.state, 'connected');
    assert.deepEqual(seen.states, ['connecting', 'connected']);
    assert.equal(relay.requests.length, 1, 'no reconnect');

    // Said again (a second stream, another tab): reported once.
    connection.response.write(revokedScope('b') + scopedFrame(scoped(4, 'a')));
    await until(() => seen.events.length === 4, 'the next event');
    assert.equal(seen.errors.length, 1);

    // Without a scope: the subscriber is disconnected, and the stream ends.
    connection.response.end(`event: revoked\ndata: {"reason":"disconnected"}\n\n`);
    await until(() => relay.connections.length === 2, 'the reconnect');
    assert.deepEqual(seen.errors.map((e) => [e.code, e.scope]), [['revoked', 'b'], ['revoked', undefined]]);
    assert.equal(relay.requests[1].url, '/v1/events?scope=a&scope=b&scope=c', 'a reconnect asks for every scope again');
    relay.connections[1].response.write(readyFor(['a', 'b', 'c']));
    await until(() => instance.state === 'connected', 'connected again');
    assert.deepEqual(instance.scopes, ['a', 'b', 'c'], 'as the new stream’s ready says');
    assert.deepEqual(resyncs, []);
  } finally {
    instance.stop();
    await relay.close();
  }
});

test('several scopes: each scope with presence has its own member list', async () => {
  const relay = await driven();
  const { instance, seen, reported } = presenceClient(relay.url, { scopes: ['a', 'b', 'c'] });
  const scopeOf = (entry) => entry.state.scopeKey;
  try {
    await until(() => relay.connections.length === 1, 'the stream');
    const [connection] = relay.connections;
    connection.response.write(
      readyFor(['a', 'b', 'c'], ['a', 'b', 'c']) +
        scopePresence('a', { snapshot: true, members: ['ada', 'bob'] }) +
        scopePresence('b', { snapshot: true, members: ['bob'] }),
    );
    await until(() => reported.length === 2, 'both snapshots');
    assert.deepEqual(reported.map(scopeOf), ['a', 'b']);
    assert.deepEqual(memberIds(instance.presenceOf('a')), ['ada', 'bob']);
    assert.deepEqual(memberIds(instance.presenceOf('b')), ['bob']);
    assert.equal(instance.presenceOf('c'), undefined, 'a scope without presence');
    assert.equal(instance.presence, undefined, 'no one list stands for a stream of several scopes');

    // A change in one scope leaves the other's list as it was.
    const b = instance.presenceOf('b');
    connection.response.write(scopePresence('a', { count: 1, left: ['bob'] }) + scopePresence('b', { count: 2, members: ['cyd'] }));
    await until(() => reported.length === 4, 'a change in each');
    assert.deepEqual(reported.slice(2).map((r) => [scopeOf(r), r.joined, r.left]), [
      ['a', [], ['bob']],
      ['b', ['cyd'], []],
    ]);
    assert.deepEqual(memberIds(instance.presenceOf('a')), ['ada']);
    assert.deepEqual(memberIds(instance.presenceOf('b')), ['bob', 'cyd']);
    assert.equal(instance.presenceOf('b').members.get('bob'), b.members.get('bob'));

    // After a reconnect whose stream no longer carries b, b's list is gone;
    // a's stays until its next snapshot.
    connection.response.end();
    await until(() => relay.connections.length === 2, 'the reconnect');
    relay.connections[1].response.write(readyFor(['a', 'c']) + frame(envelope(1)));
    await until(() => seen.events.length === 1, 'the event after ready');
    assert.deepEqual(memberIds(instance.presenceOf('a')), ['ada']);
    assert.equal(instance.presenceOf('b'), undefined);
    assert.deepEqual(seen.errors, []);
  } finally {
    instance.stop();
    await relay.close();
  }
  assert.equal(instance.presenceOf('a'), undefined, 'a stopped client forgets who was there');
});

test('one scope: a snapshot of another scope (the credentials changed) replaces the member list', async () => {
  const relay = await driven();
  const { instance, reported } = presenceClient(relay.url);
  try {
    await until(() => relay.connections.length === 1, 'the first stream');
    relay.connections[0].response.write(ready(true) + scopePresence('org-1', { snapshot: true, members: ['ada'] }));
    await until(() => reported.length === 1, 'the first snapshot');
    assert.equal(instance.presence, instance.presenceOf('org-1'));
    relay.connections[0].response.end();
    await until(() => relay.connections.length === 2, 'the reconnect');
    relay.connections[1].response.write(ready(true) + scopePresence('org-2', { snapshot: true, members: ['bob'] }));
    await until(() => reported.length === 2, 'the second snapshot');
    assert.equal(instance.presence.scopeKey, 'org-2');
    assert.deepEqual(memberIds(instance.presence), ['bob']);
    assert.equal(instance.presenceOf('org-1'), undefined);
  } finally {
    instance.stop();
    await relay.close();
  }
});

/**
 * A stand-in for the browser's Web Locks: one holder per
 * name at a time, the others waiting in turn, and a waiter whose signal
 * aborts leaves the queue.
 */
function fakeLocks() {
  const tails = new Map();
  return {
    request(name, options, callback) {
      const previous = tails.get(name) ?? Promise.resolve();
      let release;
      const released = new Promise((resolve) => {
        release = resolve;
      });
      tails.set(name, previous.then(() => released));
      return new Promise((resolve, reject) => {
        let granted = false;
        options.signal?.addEventListener(
          'abort',
          () => {
            if (granted) return;
            release();
            reject(new DOMException('aborted', 'AbortError'));
          },
          { once: true },
        );
        previous.then(async () => {
          if (options.signal?.aborted) return;
          granted = true;
          try {
            resolve(await callback());
          } catch (error) {
            reject(error);
          } finally {
            release();
          }
        });
      });
    },
  };
}

test('a tab following another’s stream of several scopes gets the same resyncs, member lists and revocations', async () => {
  const relay = await driven();
  const restore = standInNavigator({ locks: fakeLocks() });
  const tabs = [];
  const open = () => {
    const reported = [];
    const tab = resyncClient(relay.url, {
      scopes: ['a', 'b', 'c'],
      shareAcrossTabs: true,
      onPresence: (state) => reported.push(state.scopeKey),
    });
    tabs.push(tab);
    return { ...tab, reported };
  };
  try {
    const leader = open();
    await until(() => relay.connections.length === 1, 'the stream');
    const [connection] = relay.connections;
    connection.response.write(
      readyFor(['a', 'b', 'c'], ['a', 'b', 'c']) +
        scopePresence('a', { snapshot: true, members: ['ada'] }) +
        scopePresence('b', { snapshot: true, members: ['bob'] }),
    );
    await until(() => leader.reported.length === 2, 'the leader’s member lists');

    // It joins a stream already live: it re-reads every scope, and learns
    // who is connected to each from the tab holding the stream.
    const follower = open();
    await until(() => follower.instance.state === 'connected' && follower.reported.length === 2, 'the follower to join');
    assert.equal(follower.instance.isLeader, false);
    assert.deepEqual(follower.resyncs, [['a'], ['b'], ['c']]);
    assert.deepEqual(follower.instance.scopes, ['a', 'b', 'c']);
    assert.deepEqual(memberIds(follower.instance.presenceOf('a')), ['ada']);
    assert.deepEqual(memberIds(follower.instance.presenceOf('b')), ['bob']);
    assert.equal(follower.instance.presence, undefined);

    connection.response.write(scopedFrame(scoped(1, 'a')) + scopePresence('b', { count: 2, members: ['cyd'] }) + revokedScope('b'));
    for (const tab of [leader, follower]) {
      await until(() => tab.seen.errors.length === 1 && tab.seen.events.length === 1, 'the event and the revocation');
      assert.deepEqual(tab.seen.errors.map((e) => [e.code, e.scope]), [['revoked', 'b']]);
      assert.deepEqual(tab.instance.scopes, ['a', 'c']);
      assert.equal(tab.instance.presenceOf('b'), undefined);
    }

    // The next stream asks the tabs to re-read c alone.
    connection.response.end();
    await until(() => relay.connections.length === 2, 'the reconnect');
    relay.connections[1].response.write(readyFor(['a', 'c'], ['c']) + scopedFrame(scoped(2, 'c')));
    for (const tab of [leader, follower]) await until(() => tab.seen.events.length === 2, 'the event after the reconnect');
    assert.deepEqual(leader.resyncs, [['a'], ['b'], ['c'], ['c']]);
    assert.deepEqual(follower.resyncs, [['a'], ['b'], ['c'], ['c']]);
    assert.equal(relay.requests.length, 2, 'the follower never opened a stream');
    for (const tab of [leader, follower]) assert.deepEqual(tab.seen.events.map((e) => [e.scopeKey, e.seq]), [['a', 1], ['c', 2]]);

    // A tab that joins now re-reads the scopes the stream carries now.
    const late = open();
    await until(() => late.instance.state === 'connected' && late.reported.length === 1, 'the late tab to join');
    assert.deepEqual(late.resyncs, [['a'], ['c']]);
    assert.deepEqual(late.instance.scopes, ['a', 'c']);
    assert.deepEqual(memberIds(late.instance.presenceOf('a')), ['ada']);
  } finally {
    for (const tab of tabs.reverse()) tab.instance.stop();
    restore();
    await relay.close();
  }
});
