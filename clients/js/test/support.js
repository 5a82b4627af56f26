// What the tests that start a relay share: where the relay binary and
// Chromium are, the relay's environment, starting and stopping the relay
// (with a headless Chromium for the end-to-end tests), a throwaway Postgres
// for the logical wake-up mode, the application origin that serves a
// test's page, emitting and publishing events, and waiting for a condition
// with a deadline. Not a test file itself: it defines no test.
import { spawn, execFile, execFileSync } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer, request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { createInterface } from 'node:readline';
import { randomUUID } from 'node:crypto';
import { tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import assert from 'node:assert/strict';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const clientSource = path.join(here, '../eventrelay-client.js');
const chromium = process.env.CHROMIUM ?? '/usr/bin/chromium';
// Chromium as a test needs it: no sandbox (tests may run as root), no GPU,
// QUIC or background traffic that would add connections of its own.
const CHROMIUM_ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'];

/** How long an end-to-end test waits for any one thing before it fails. */
export const DEADLINE_MS = 15000;

/** The workspace's target/ folder: where cargo puts the relay and the tests their screenshots. */
export const targetDir = path.join(here, '../../../target');

/** The relay binary under test: EVENTRELAY_BIN, or the debug build. */
export const binary = process.env.EVENTRELAY_BIN ?? path.join(targetDir, 'debug/eventrelay');

/** The Postgres the relays use: DATABASE_URL, or the local server. */
export const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';

/** A test's `skip` option: false with Chromium at CHROMIUM (default /usr/bin/chromium), else why not. */
export const skipWithoutChromium = !existsSync(chromium) && `no Chromium at ${chromium}`;

/** 16 random hex digits, to give a test's schema, tokens and names their own. */
export function uniqueSuffix() {
  return randomUUID().replaceAll('-', '').slice(0, 16);
}

/** A fresh temporary folder named after the test, for its configuration files. */
export function makeWorkdir(name) {
  return mkdtempSync(path.join(tmpdir(), `eventrelay-${name}-`));
}

/**
 * The relay's environment: this process's without EVENTRELAY_BIN (a test
 * setting, not a relay one), Postgres schema and channel `schema` of its
 * own so tests do not see each other's events, warnings only, and `settings`.
 */
export function relayEnv(schema, settings = {}) {
  const { EVENTRELAY_BIN: _binary, ...inherited } = process.env;
  return {
    ...inherited,
    DATABASE_URL: databaseUrl,
    EVENTRELAY_DATABASE__SCHEMA: schema,
    EVENTRELAY_DATABASE__CHANNEL: schema,
    RUST_LOG: 'warn',
    ...settings,
  };
}

/** Starts `binary serve` (then `args`) with `env` (in `cwd`, when given); resolves with its base URL and the process. */
export function startRelay(binary, env, { cwd, args = [] } = {}) {
  const child = spawn(binary, ['serve', ...args], { env, cwd, stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout }).once('line', (line) => {
      const match = /listening on (https?:\/\/\S+)/.exec(line);
      if (match) {
        resolve({ base: match[1], child });
      } else {
        child.kill('SIGTERM');
        reject(new Error(`unexpected first line: ${line}`));
      }
    });
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`relay exited with ${code}`)));
  });
}

/** Stops a relay process with SIGTERM and resolves once it has exited (at once if it already has). */
export function stopRelay(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', resolve);
    child.kill('SIGTERM');
  });
}

/** The status of a GET, or 0 when the request fails; `ca` trusts a test CA for https. */
function statusOf(url, ca) {
  if (!url.startsWith('https:')) {
    return fetch(url).then((r) => r.status, () => 0);
  }
  return new Promise((resolve) => {
    const request = httpsRequest(url, { ca }, (response) => {
      response.resume();
      resolve(response.statusCode);
    });
    request.on('error', () => resolve(0));
    request.end();
  });
}

/**
 * Starts the relay (as `startRelay`, with the binary under test) and waits
 * until its /readyz answers 200, over https trusting `ca` when given; stops
 * it again when it never does.
 */
export async function startReadyRelay(env, { cwd, args, ca } = {}) {
  const relay = await startRelay(binary, env, { cwd, args });
  try {
    await until(async () => (await statusOf(`${relay.base}/readyz`, ca)) === 200, 'the relay to be ready');
  } catch (error) {
    await stopRelay(relay.child);
    throw error;
  }
  return relay;
}

/** Launches headless Chromium with the flags every test uses, then `args`. */
export async function launchChromium({ args = [] } = {}) {
  const { chromium: launcher } = await import('playwright-core');
  return launcher.launch({ executablePath: chromium, headless: true, args: [...CHROMIUM_ARGS, ...args] });
}

/** Resolves once `condition` (which may be async) holds; throws after `deadlineMs`. */
export async function until(condition, what, deadlineMs = DEADLINE_MS) {
  const deadline = Date.now() + deadlineMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Starts the relay with `env` (in `cwd`), waits until it is ready, and launches headless Chromium. */
export async function startRelayAndBrowser(env, { cwd } = {}) {
  const relay = await startReadyRelay(env, { cwd });
  try {
    return { relay, browser: await launchChromium() };
  } catch (error) {
    await stopRelay(relay.child);
    throw error;
  }
}

/** Closes what `startRelayAndBrowser` started, and drops the test's schema. */
export async function stopRelayAndBrowser({ relay, browser } = {}, env) {
  await browser?.close();
  if (relay) await stopRelay(relay.child);
  dropSchema(env.DATABASE_URL, env.EVENTRELAY_DATABASE__SCHEMA);
}

/** Postgres's server programs (initdb, pg_ctl): PG_BINDIR, else the newest of Debian's packages; undefined without any. */
function postgresBinaries() {
  const hasInitdb = (dir) => (existsSync(path.join(dir, 'initdb')) ? dir : undefined);
  if (process.env.PG_BINDIR) return hasInitdb(process.env.PG_BINDIR);
  let versions = [];
  try {
    versions = readdirSync('/usr/lib/postgresql').filter((v) => /^[0-9]+$/.test(v));
  } catch {}
  versions.sort((a, b) => Number(b) - Number(a));
  for (const version of versions) {
    const dir = hasInitdb(`/usr/lib/postgresql/${version}/bin`);
    if (dir) return dir;
  }
  return undefined;
}

const isRoot = typeof process.getuid === 'function' && process.getuid() === 0;

/** Runs a Postgres server program, as the postgres user when this runs as root (Postgres refuses root). */
function runPostgresTool(bin, program, args) {
  const tool = path.join(bin, program);
  const [command, all] = isRoot ? ['runuser', ['-u', 'postgres', '--', tool, ...args]] : [tool, args];
  return execFileSync(command, all, { stdio: ['ignore', 'pipe', 'pipe'] });
}

/** A free TCP port on 127.0.0.1 (free when asked; a test takes it at once). */
function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** A test's `skip` option for the logical wake-up mode: false with Postgres's server programs, else why not. */
export const skipWithoutPostgresBinaries = !postgresBinaries() && 'no Postgres server programs (initdb, pg_ctl): install them or set PG_BINDIR';

/**
 * Starts a throwaway Postgres cluster with `wal_level = logical` on a free
 * loopback port, for relays in the logical wake-up mode (the shared server
 * need not have it); resolves with its URL and `stop()`, which removes it.
 */
export async function startLogicalCluster() {
  const bin = postgresBinaries();
  if (!bin) throw new Error(skipWithoutPostgresBinaries);
  const root = mkdtempSync(path.join(tmpdir(), 'eventrelay-pg-'));
  const data = path.join(root, 'data');
  if (isRoot) {
    const uid = Number(execFileSync('id', ['-u', 'postgres']).toString());
    const gid = Number(execFileSync('id', ['-g', 'postgres']).toString());
    chownSync(root, uid, gid);
  }
  const port = await freePort();
  const stop = () => {
    try {
      runPostgresTool(bin, 'pg_ctl', ['-D', data, '-m', 'immediate', 'stop']);
    } catch {}
    rmSync(root, { recursive: true, force: true });
  };
  try {
    runPostgresTool(bin, 'initdb', ['-A', 'trust', '-U', 'postgres', '--no-sync', '-D', data]);
    const options = `-p ${port} -k ${root} -c listen_addresses=127.0.0.1 -c fsync=off -c wal_level=logical -c max_wal_senders=10 -c max_replication_slots=10`;
    runPostgresTool(bin, 'pg_ctl', ['-D', data, '-w', '-l', path.join(root, 'log'), '-o', options, 'start']);
  } catch (error) {
    let log = '';
    try {
      log = readFileSync(path.join(root, 'log'), 'utf8');
    } catch {}
    stop();
    throw new Error(`the logical cluster did not start: ${error.stderr ?? error.message}\n${log}`);
  }
  return { url: `postgres://postgres@127.0.0.1:${port}/postgres`, stop };
}

/** Drops a test's Postgres schema and what is in it, so runs leave nothing behind; never fails. */
export function dropSchema(url, schema) {
  try {
    execFileSync('psql', [url, '-qc', `DROP SCHEMA IF EXISTS ${schema} CASCADE`], { stdio: 'ignore' });
  } catch {}
}

/** Returns emit(type, data, scope): `eventrelay emit` in `scope` (default org-1) straight into Postgres, as an application's transaction would; answers the event. */
export function emitter(env, { cwd } = {}) {
  return (type, data, scope = 'org-1') => {
    const out = execFileSync(binary, ['emit', '--type', type, '--scope', scope, '--data', JSON.stringify(data)], { env, cwd });
    return JSON.parse(out.toString());
  };
}

/** A token from `eventrelay token` for `subscriber` in `scope` (a scope key, or an array of them to grant several), living `ttlSecs`, as an application's backend would mint it. */
export async function mintToken(env, subscriber, scope, ttlSecs) {
  const scopes = (Array.isArray(scope) ? scope : [scope]).flatMap((key) => ['--scope', key]);
  const args = ['token', '--subscriber', subscriber, ...scopes, '--ttl-secs', String(ttlSecs)];
  const { stdout } = await promisify(execFile)(binary, args, { env });
  return stdout.trim();
}

/** Publishes `event` (durable unless it says otherwise) through the relay's API with `token`; answers the published event. */
export async function publishEvent(base, token, event) {
  const response = await fetch(`${base}/v1/events`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ lane: 'durable', ...event }),
  });
  assert.equal(response.status, 200, await response.clone().text());
  return (await response.json()).events[0];
}

/**
 * A webhook receiver on 127.0.0.1 that records each delivery's webhook-id
 * and whether it was accepted: 200 while `succeed` is set, else 500
 * `receiver down`, so a test can make deliveries fail and recover.
 */
export async function startReceiver({ succeed = true } = {}) {
  const receiver = { succeed, received: [] };
  receiver.server = createServer((request, response) => {
    request.resume();
    request.on('end', () => {
      receiver.received.push({ id: request.headers['webhook-id'], ok: receiver.succeed });
      response.writeHead(receiver.succeed ? 200 : 500, { 'content-type': 'text/plain' });
      response.end(receiver.succeed ? 'thanks' : 'receiver down');
    });
  });
  await new Promise((resolve) => receiver.server.listen(0, '127.0.0.1', resolve));
  receiver.url = `http://127.0.0.1:${receiver.server.address().port}/hook`;
  return receiver;
}

/**
 * An application's origin on 127.0.0.1, as the browser sees one: `page` at
 * /, the client from this folder at /eventrelay-client.js (neither cached),
 * `routes[pathname](request, response, url)` for the rest, else 404.
 */
export async function serveApp(page, routes = {}) {
  const server = createServer(async (request, response) => {
    const url = new URL(request.url, 'http://app');
    if (url.pathname === '/') {
      response.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
      response.end(page);
    } else if (url.pathname === '/eventrelay-client.js') {
      response.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8', 'cache-control': 'no-store' });
      response.end(readFileSync(clientSource));
    } else if (Object.hasOwn(routes, url.pathname)) {
      await routes[url.pathname](request, response, url);
    } else {
      response.writeHead(404).end();
    }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    origin: `http://127.0.0.1:${server.address().port}`,
    server,
    close() {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

/**
 * Passes a GET (an event stream) through to the relay at `relayBase`, ends
 * it upstream when the browser goes, and cuts the browser's off when the
 * relay's is cut off (a relay that stops mid-stream): piping alone would
 * leave it open, and the browser would never reconnect.
 */
export function forwardStream(relayBase, request, response) {
  const relay = new URL(relayBase);
  const headers = { ...request.headers, host: relay.host };
  const upstream = httpRequest(
    { host: relay.hostname, port: relay.port, path: request.url, method: 'GET', headers },
    (answer) => {
      response.writeHead(answer.statusCode, answer.headers);
      answer.pipe(response);
      answer.on('close', () => {
        if (!answer.complete) response.destroy();
      });
    },
  );
  upstream.on('error', () => response.destroy());
  upstream.end();
  response.on('close', () => upstream.destroy());
}

/** What a tab's client reported (the page's window.tab), its state, and whether it holds the connection. */
export const tabState = (page) =>
  page.evaluate(() => ({ ...window.tab, state: window.client?.state, leader: window.client?.isLeader }));
