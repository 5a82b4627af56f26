// What the tests that start a relay share: starting and stopping it (with a
// headless Chromium for the end-to-end tests), and waiting for a condition
// with a deadline. Not a test file itself: it defines no test.
import { spawn, execFileSync } from 'node:child_process';
import { createInterface } from 'node:readline';

/** Starts `binary serve` with `env` (in `cwd`, when given); resolves with its base URL and the process. */
export function startRelay(binary, env, { cwd } = {}) {
  const child = spawn(binary, ['serve'], { env, cwd, stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    createInterface({ input: child.stdout }).once('line', (line) => {
      const match = /listening on (http:\/\/\S+)/.exec(line);
      if (match) resolve({ base: match[1], child });
      else reject(new Error(`unexpected first line: ${line}`));
    });
    child.once('exit', (code) => reject(new Error(`relay exited with ${code}`)));
  });
}

/** Resolves once `condition` (which may be async) holds; throws after `deadlineMs`. */
export async function until(condition, what, deadlineMs) {
  const deadline = Date.now() + deadlineMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Starts the relay, waits until it is ready, and launches headless Chromium. */
export async function startRelayAndBrowser(binary, env, chromiumPath, deadlineMs) {
  const relay = await startRelay(binary, env);
  await until(async () => {
    try {
      return (await fetch(`${relay.base}/readyz`)).ok;
    } catch {
      return false;
    }
  }, 'the relay to be ready', deadlineMs);
  const { chromium: launcher } = await import('playwright-core');
  const browser = await launcher.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  return { relay, browser };
}

/** Closes what `startRelayAndBrowser` started, and drops the test's schema. */
export async function stopRelayAndBrowser({ relay, browser } = {}, env) {
  await browser?.close();
  if (relay) {
    await new Promise((resolve) => {
      relay.child.once('exit', resolve);
      relay.child.kill('SIGTERM');
    });
  }
  try {
    execFileSync('psql', [env.DATABASE_URL, '-qc', `DROP SCHEMA IF EXISTS ${env.EVENTRELAY_DATABASE__SCHEMA} CASCADE`], { stdio: 'ignore' });
  } catch {}
}
