// Watches an agent's cluster state with a browser's own EventSource in headless Chromium (Debian's
// /usr/bin/chromium): the page is kas's origin, the JWT travels as `access_token` (EventSource
// cannot send headers). Prints one JSON line per event it receives ({"event", "id", "data"}),
// and exits after an `upsert` of the object named <name>; non-zero on any failure.
//
//   node tests/browser/events.mjs <rest base url> <jwt> <agent id> <name>
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const [base, jwt, agent, name] = process.argv.slice(2);
if (!base || !jwt || !agent || !name) {
  console.error('usage: node events.mjs <rest base url> <jwt> <agent id> <name>');
  process.exit(2);
}
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const userDataDir = mkdtempSync(join(tmpdir(), 'kas-events-chromium-'));

const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath,
  headless: true,
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
});
let code = 0;
try {
  const page = context.pages()[0] ?? (await context.newPage());
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  await page.exposeFunction('report', (line) => {
    console.log(line);
    const e = JSON.parse(line);
    if (e.event === 'error') done(new Error(`EventSource error: ${line}`));
    if (e.event === 'upsert' && JSON.parse(e.data).object.name === name) done(null);
  });
  // Any page of kas's origin: the stream is same-origin, no CORS involved.
  await page.goto(`${base}/openapi.json`);
  await page.evaluate(({ agent, jwt }) => {
    const source = new EventSource(`/api/v1/agents/${agent}/events?access_token=${encodeURIComponent(jwt)}`);
    for (const event of ['snapshot', 'upsert', 'delete', 'resource_removed', 'freshness']) {
      source.addEventListener(event, (e) => window.report(JSON.stringify({ event, id: e.lastEventId, data: e.data })));
    }
    source.onerror = () => { if (source.readyState === EventSource.CLOSED) window.report(JSON.stringify({ event: 'error' })); };
  }, { agent, jwt });
  const timer = setTimeout(() => done(new Error(`no upsert of ${name} within 60 s`)), 60_000);
  const failure = await finished;
  clearTimeout(timer);
  if (failure) throw failure;
  if (errors.length) throw new Error(`page errors: ${errors.join('; ')}`);
} catch (e) {
  console.error(String(e));
  code = 1;
} finally {
  await context.close();
  rmSync(userDataDir, { recursive: true, force: true });
}
process.exit(code);
