// What the tests that start a relay share: starting it, and waiting for a
// condition with a deadline. Not a test file itself: it defines no test.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

/** Starts `binary serve` with `env`; resolves with its base URL and the process. */
export function startRelay(binary, env) {
  const child = spawn(binary, ['serve'], { env, stdio: ['ignore', 'pipe', 'inherit'] });
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
