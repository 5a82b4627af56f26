// Pages on other origins than the relay, in a real browser: headless
// Chromium loads an application page from a second origin (another port)
// and reads the relay's stream cross-origin:
//   - with the client and a bearer token (the preflight passes);
//   - with the native EventSource and a session cookie, in forward-auth mode;
//   - from an origin that is not allowed, which gets nothing;
//   - over HTTPS and HTTP/2, ten streams from one page at once, where
//     HTTP/1.1 lets only six connect (shown on the same page, as a control).
// The test makes its own CA and certificate with the openssl command.
//
// Needs Chromium (CHROMIUM, default /usr/bin/chromium; scripts/test installs
// it), openssl, Postgres (DATABASE_URL) and the eventrelay binary
// (EVENTRELAY_BIN).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createHash, createHmac, X509Certificate } from 'node:crypto';
import path from 'node:path';
import {
  databaseUrl,
  DEADLINE_MS,
  dropSchema,
  launchChromium,
  makeWorkdir,
  publishEvent,
  serveApp,
  skipWithoutChromium,
  startReadyRelay,
  stopRelay,
  uniqueSuffix,
  until,
} from './support.js';

const schema = `cors_${uniqueSuffix()}`;
const SECRET = 'cross-origin-e2e-secret-long-enough-for-hs256';
const PUBLISH_TOKEN = 'cross-origin-e2e-publish-token';
const SESSION = 'alice-session-cookie-value';
const workdir = makeWorkdir('cors');

function which(command) {
  try {
    execFileSync('sh', ['-c', `command -v ${command}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
const skip = skipWithoutChromium || (!which('openssl') && 'no openssl command');

// The application's page: opens clients and EventSources on request and
// keeps what they report for the test to read.
const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>app</title>
<script type="module">
import { createEventStreamClient } from '/eventrelay-client.js';
window.streams = [];
window.openClient = (url, token) => {
  const stream = { events: [], states: [], resyncs: 0 };
  stream.client = createEventStreamClient({
    shareAcrossTabs: false,
    buildRequest: () => ({ url, headers: { authorization: 'Bearer ' + token } }),
    onEvent: (event) => stream.events.push(event.type),
    onStateChange: (state) => stream.states.push(state),
    onResync: () => { stream.resyncs += 1; },
    onError: () => {},
    initialDelayMs: 100,
    maxDelayMs: 300,
  });
  stream.client.start();
  return streams.push(stream) - 1;
};
window.openEventSource = (url, withCredentials, types) => {
  const stream = { events: [], ready: 0, errors: 0, source: new EventSource(url, { withCredentials }) };
  stream.source.addEventListener('ready', () => { stream.ready += 1; });
  for (const type of types) stream.source.addEventListener(type, () => stream.events.push(type));
  stream.source.onerror = () => { stream.errors += 1; };
  return streams.push(stream) - 1;
};
window.view = (i) => {
  const s = streams[i];
  return { events: s.events, states: s.states, resyncs: s.resyncs, ready: s.ready,
           state: s.client?.state, readyState: s.source?.readyState };
};
window.loaded = true;
</script>`;

/**
 * An application origin: its page, the client, and (for forward auth) the
 * endpoint the relay asks who a session cookie belongs to.
 */
function startApp() {
  return serveApp(PAGE, {
    '/auth': (request, response) => {
      const cookies = (request.headers.cookie ?? '').split(';').map((c) => c.trim());
      if (cookies.includes(`session=${SESSION}`)) {
        response.writeHead(200, { 'content-type': 'application/json' });
        response.end(JSON.stringify({ subscriberId: 'alice', scopeKey: 'org-1', grants: {} }));
      } else {
        response.writeHead(401).end();
      }
    },
  });
}

const base64url = (value) => Buffer.from(value).toString('base64url');

/** An HS256 token for the relays' secret. */
function token(subscriber) {
  const header = base64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }));
  const claims = base64url(
    JSON.stringify({ sub: subscriber, scope: 'org-1', grants: {}, exp: Math.floor(Date.now() / 1000) + 600 }),
  );
  const signature = createHmac('sha256', SECRET).update(`${header}.${claims}`).digest('base64url');
  return `${header}.${claims}.${signature}`;
}

/** A CA and a certificate for 127.0.0.1 it signed, made with openssl. */
function makeCertificate() {
  const file = (name) => path.join(workdir, name);
  const openssl = (...args) => execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  openssl('req', '-x509', ...ec, '-keyout', file('ca.key'), '-out', file('ca.pem'), '-days', '2', '-subj', '/CN=eventrelay e2e CA');
  openssl('req', ...ec, '-keyout', file('relay.key'), '-out', file('relay.csr'), '-subj', '/CN=127.0.0.1');
  writeFileSync(
    file('relay.ext'),
    'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n',
  );
  openssl('x509', '-req', '-in', file('relay.csr'), '-CA', file('ca.pem'), '-CAkey', file('ca.key'), '-CAcreateserial',
    '-out', file('relay.pem'), '-days', '2', '-extfile', file('relay.ext'));
  const certificate = new X509Certificate(readFileSync(file('relay.pem')));
  assert.ok(certificate.verify(new X509Certificate(readFileSync(file('ca.pem'))).publicKey), 'the CA signed it');
  // Chromium trusts exactly this key: the digest of its SubjectPublicKeyInfo.
  const spki = certificate.publicKey.export({ type: 'spki', format: 'der' });
  return {
    cert: file('relay.pem'),
    key: file('relay.key'),
    ca: readFileSync(file('ca.pem')),
    spki: createHash('sha256').update(spki).digest('base64'),
  };
}

const relays = [];

/** Starts `eventrelay serve` with a configuration of its own. */
async function startRelay(name, { http = [], auth, tls }) {
  const config = path.join(workdir, `${name}.toml`);
  writeFileSync(
    config,
    [
      '[database]',
      `url = "${databaseUrl}"`,
      `schema = "${schema}"`,
      `channel = "${schema}"`,
      'pool_size = 2',
      '[http]',
      'bind = "127.0.0.1:0"',
      'workers = 1',
      ...http,
      ...(tls ? ['[http.tls]', `cert_file = "${tls.cert}"`, `key_file = "${tls.key}"`] : []),
      '[sse]',
      'max_connections_per_subscriber = 20',
      '[webhooks]',
      'enabled = false',
      '[publish]',
      `token = "${PUBLISH_TOKEN}"`,
      '[auth]',
      ...auth,
      '[log]',
      'level = "warn"',
    ].join('\n'),
  );
  // The file is the whole configuration: no EVENTRELAY_* from outside.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('EVENTRELAY_')));
  delete env.DATABASE_URL;
  const relay = await startReadyRelay(env, { cwd: workdir, args: ['--config', config], ca: tls?.ca });
  relays.push(relay.child);
  return relay.base;
}

async function publish(type) {
  await publishEvent(plain, PUBLISH_TOKEN, { type, scopeKey: 'org-1', data: {} });
}

/** A fresh browser profile (its own connections and cookies) with one app page. */
async function openPage(origin, contextOptions = {}) {
  const context = await browser.newContext(contextOptions);
  const page = await context.newPage();
  await page.goto(`${origin}/`);
  await page.waitForFunction(() => window.loaded === true, undefined, { timeout: DEADLINE_MS });
  return { context, page };
}

const view = (page, i) => page.evaluate((i) => window.view(i), i);

async function waitFor(page, i, predicate, what) {
  await until(async () => predicate(await view(page, i)), what);
}

let app;
let other;
let plain;
let forward;
let secure;
let certificate;
let browser;

before(async () => {
  if (skip) return;
  app = await startApp();
  other = await startApp();
  certificate = makeCertificate();
  const allowed = `allowed_origins = ["${app.origin}"]`;
  const jwt = ['mode = "jwt"', `secret = "${SECRET}"`, 'query_param = "access_token"'];
  plain = await startRelay('plain', { http: [allowed], auth: jwt });
  forward = await startRelay('forward', {
    http: [allowed],
    auth: ['mode = "forward"', `url = "${app.origin}/auth"`, 'cache_secs = 0'],
  });
  secure = await startRelay('secure', { http: [allowed], auth: jwt, tls: certificate });
  browser = await launchChromium({ args: [`--ignore-certificate-errors-spki-list=${certificate.spki}`] });
});

after(async () => {
  await browser?.close();
  await Promise.all(relays.map(stopRelay));
  await Promise.all([app?.close(), other?.close()]);
  dropSchema(databaseUrl, schema);
  rmSync(workdir, { recursive: true, force: true });
});

test('a page on another origin streams with the client and a bearer token', { skip }, async () => {
  const { context, page } = await openPage(app.origin);
  try {
    // An Authorization header makes the browser ask the relay first: the
    // stream opens only if the preflight passes.
    const i = await page.evaluate(([url, token]) => window.openClient(url, token), [`${plain}/v1/events`, token('alice')]);
    await waitFor(page, i, (s) => s.state === 'connected' && s.resyncs === 1, 'the client to connect');
    await publish('bearer.one');
    await publish('bearer.two');
    await waitFor(page, i, (s) => s.events.includes('bearer.one') && s.events.includes('bearer.two'), 'both events');
    assert.ok(!(await view(page, i)).states.includes('degraded'));
  } finally {
    await context.close();
  }
});

test('the native EventSource streams with a session cookie in forward-auth mode', { skip }, async () => {
  const { context, page } = await openPage(app.origin);
  try {
    // The application's session cookie, which the relay passes to the
    // application's /auth endpoint to learn who this is.
    await context.addCookies([{ name: 'session', value: SESSION, url: forward, sameSite: 'Lax' }]);
    const types = ['cookie.one', 'cookie.two'];
    const withCookie = await page.evaluate(([url, types]) => window.openEventSource(url, true, types), [`${forward}/v1/events`, types]);
    // Without credentials the browser sends no cookie: refused, and closed.
    const without = await page.evaluate(([url, types]) => window.openEventSource(url, false, types), [`${forward}/v1/events`, types]);
    await waitFor(page, withCookie, (s) => s.ready === 1, 'the EventSource to get ready');
    await waitFor(page, without, (s) => s.readyState === 2, 'the cookieless EventSource to fail');
    for (const type of types) await publish(type);
    await waitFor(page, withCookie, (s) => types.every((t) => s.events.includes(t)), 'both events');
    assert.deepEqual((await view(page, without)).events, []);
  } finally {
    await context.close();
  }
});

test('a page from an origin that is not allowed gets nothing', { skip }, async () => {
  const bad = await openPage(other.origin);
  const good = await openPage(app.origin);
  try {
    const types = ['denied.one'];
    // The client's preflight is refused; the EventSource needs none (its
    // query token is valid and the relay streams), but without CORS headers
    // the browser hands the page nothing and closes it.
    const client = await bad.page.evaluate(([url, token]) => window.openClient(url, token), [`${plain}/v1/events`, token('mallory')]);
    const source = await bad.page.evaluate(
      ([url, types]) => window.openEventSource(url, false, types),
      [`${plain}/v1/events?access_token=${token('mallory')}`, types],
    );
    const control = await good.page.evaluate(
      ([url, types]) => window.openEventSource(url, false, types),
      [`${plain}/v1/events?access_token=${token('alice')}`, types],
    );
    await waitFor(bad.page, client, (s) => s.state === 'degraded', 'the refused client to give up');
    await waitFor(bad.page, source, (s) => s.readyState === 2, 'the refused EventSource to close');
    await waitFor(good.page, control, (s) => s.ready === 1, 'the allowed page to get ready');
    await publish('denied.one');
    await waitFor(good.page, control, (s) => s.events.includes('denied.one'), 'the allowed page to get the event');
    const refused = await view(bad.page, client);
    assert.deepEqual(refused.events, []);
    assert.equal(refused.resyncs, 0, 'the refused client never saw ready');
    assert.ok(!refused.states.includes('connected'));
    const closed = await view(bad.page, source);
    assert.deepEqual([closed.events, closed.ready], [[], 0]);
  } finally {
    await bad.context.close();
    await good.context.close();
  }
});

test('over HTTPS and HTTP/2 one page holds ten streams; over HTTP/1.1 six', { skip }, async () => {
  const streams = 10;
  const { context, page } = await openPage(app.origin);
  try {
    // What the browser negotiated, per stream response.
    const cdp = await context.newCDPSession(page);
    await cdp.send('Network.enable');
    const protocols = [];
    cdp.on('Network.responseReceived', ({ type, response }) => {
      if (type === 'Fetch' && response.url.startsWith(`${secure}/v1/events`)) protocols.push(response.protocol);
    });
    const indexes = [];
    for (let n = 0; n < streams; n++) {
      indexes.push(await page.evaluate(([url, token]) => window.openClient(url, token), [`${secure}/v1/events`, token(`tab-${n}`)]));
    }
    for (const i of indexes) await waitFor(page, i, (s) => s.state === 'connected' && s.resyncs === 1, `stream ${i} to connect`);
    await publish('h2.one');
    await publish('h2.two');
    for (const i of indexes) {
      await waitFor(page, i, (s) => s.events.includes('h2.one') && s.events.includes('h2.two'), `stream ${i} to get both events`);
    }
    assert.equal(protocols.length, streams);
    assert.ok(protocols.every((p) => p === 'h2'), `negotiated ${protocols}`);
  } finally {
    await context.close();
  }

  // The control: the same page against the plain HTTP/1.1 relay. Six
  // streams connect and receive; the other four wait in the browser for a
  // free connection, which the six never give back.
  const control = await openPage(app.origin);
  try {
    const indexes = [];
    for (let n = 0; n < streams; n++) {
      indexes.push(await control.page.evaluate(([url, token]) => window.openClient(url, token), [`${plain}/v1/events`, token(`tab-${n}`)]));
    }
    const connected = async () => (await Promise.all(indexes.map((i) => view(control.page, i)))).filter((s) => s.resyncs === 1);
    await until(async () => (await connected()).length === 6, 'six streams to connect');
    await publish('h1.one');
    await until(async () => (await connected()).filter((s) => s.events.includes('h1.one')).length === 6, 'the six to get the event');
    assert.equal((await connected()).length, 6, 'the seventh never connected');
  } finally {
    await control.context.close();
  }
});
