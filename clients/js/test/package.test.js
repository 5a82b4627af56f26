// The package as a user gets it: `npm pack` makes a tarball, a fresh
// project installs it with no registry, and the module imports in Node and,
// through an import map, in a plain browser page in Chromium.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createServer } from 'node:http';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { launchChromium, skipWithoutChromium } from './support.js';

const packageDir = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const EXPORTS = ['EventRelayError', 'SseParser', 'createEventStreamClient', 'deriveShareName', 'isReservedEventType', 'parseRetryAfter'];

/** Packs the client and installs the tarball into a new project; returns the project's folder. */
function installedProject(work) {
  const packed = JSON.parse(execFileSync('npm', ['pack', '--json', '--pack-destination', work], { cwd: packageDir, encoding: 'utf8' }));
  const [{ filename, files }] = packed;
  assert.deepEqual(
    files.map((file) => file.path).sort(),
    ['README.md', 'eventrelay-client.d.ts', 'eventrelay-client.js', 'package.json'],
    'the tarball holds the module, its declarations, its README and nothing else',
  );
  const project = path.join(work, 'app');
  mkdirSync(project);
  writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }));
  execFileSync('npm', ['install', '--offline', '--no-audit', '--no-fund', '--silent', path.join(work, filename)], { cwd: project });
  return project;
}

test('the packed client installs in a fresh project and imports in Node and in a browser', async (t) => {
  const work = mkdtempSync(path.join(os.tmpdir(), 'eventrelay-pack-'));
  t.after(() => rmSync(work, { recursive: true, force: true }));
  const project = installedProject(work);

  await t.test('Node imports it by its package name', () => {
    const printed = execFileSync(
      'node',
      ['--input-type=module', '-e', "import * as client from '@eventrelay/client'; console.log(JSON.stringify(Object.keys(client).sort()))"],
      { cwd: project, encoding: 'utf8' },
    );
    assert.deepEqual(JSON.parse(printed), EXPORTS);
  });

  await t.test('a plain page imports it through an import map', { skip: skipWithoutChromium }, async () => {
    writeFileSync(path.join(project, 'index.html'), `<!doctype html>
<script type="importmap">{"imports": {"@eventrelay/client": "./node_modules/@eventrelay/client/eventrelay-client.js"}}</script>
<script type="module">
  import * as client from '@eventrelay/client';
  window.exported = Object.keys(client).sort();
  window.reserved = client.isReservedEventType('ready');
</script>`);
    const server = createServer((request, response) => {
      const file = path.join(project, decodeURIComponent(new URL(request.url, 'http://x').pathname));
      if (!file.startsWith(project)) {
        response.writeHead(403).end();
        return;
      }
      let body;
      try {
        body = readFileSync(file);
      } catch {
        response.writeHead(404).end();
        return;
      }
      const type = file.endsWith('.js') ? 'text/javascript' : 'text/html';
      response.writeHead(200, { 'content-type': type }).end(body);
    });
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
    const browser = await launchChromium();
    try {
      const page = await browser.newPage();
      await page.goto(`http://127.0.0.1:${server.address().port}/index.html`);
      await page.waitForFunction(() => Array.isArray(window.exported));
      assert.deepEqual(await page.evaluate(() => window.exported), EXPORTS);
      assert.equal(await page.evaluate(() => window.reserved), true);
    } finally {
      await browser.close();
      server.close();
    }
  });
});
