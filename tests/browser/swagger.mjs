// Loads kas's Swagger UI in headless Chromium (Debian's /usr/bin/chromium, never a downloaded
// browser), checks that the operations render, authorizes with a JWT and runs GetPods through
// "Try it out". Prints one JSON line with what it saw; exits non-zero on any failure.
//
//   node tests/browser/swagger.mjs <rest base url> <jwt> <screenshot.png>
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const [base, jwt, screenshot] = process.argv.slice(2);
if (!base || !jwt || !screenshot) {
  console.error('usage: node swagger.mjs <rest base url> <jwt> <screenshot.png>');
  process.exit(2);
}
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const userDataDir = mkdtempSync(join(tmpdir(), 'kas-swagger-chromium-'));
const timeout = 30_000;

const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath,
  headless: true,
  viewport: { width: 1280, height: 1400 },
  args: [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
  ],
});
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.setDefaultTimeout(timeout);
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));

  await page.goto(`${base}/swagger-ui/`);
  await page.waitForSelector('.opblock-summary-path');
  const title = (await page.textContent('.info .title')).trim();
  const operations = await page.$$eval('.opblock-summary', (els) =>
    els.map((el) => {
      const method = el.querySelector('.opblock-summary-method')?.textContent.trim();
      const path = el.querySelector('.opblock-summary-path')?.getAttribute('data-path');
      return `${method} ${path}`;
    }),
  );
  for (const want of [
    'GET /api/v1/agents/{agent_id}/connections',
    'GET /api/v1/projects/{project_id}/agents',
    'GET /api/v1/agents/{agent_id}/pods',
    'GET /api/v1/agents/{agent_id}/kubernetes/{path}',
  ]) {
    if (!operations.includes(want)) throw new Error(`operation ${want} not rendered; saw ${operations.join(', ')}`);
  }

  // Authorize: the bearer scheme from components.securitySchemes.
  await page.click('.auth-wrapper .authorize');
  await page.fill('.modal-ux input', jwt);
  await page.click('.modal-ux .auth-btn-wrapper .authorize');
  await page.click('.modal-ux .btn-done');

  // Try it out: GetPods for agent 1.
  const op = page.locator('#operations-agents-getPods');
  await op.locator('.opblock-summary').click();
  await op.locator('.try-out__btn').click();
  await op.locator('tr[data-param-name="agent_id"] input').fill('1');
  await op.locator('.execute').click();
  const status = op.locator('.live-responses-table .response .response-col_status');
  await status.first().waitFor();
  const code = (await status.first().textContent()).trim();
  const body = (await op.locator('.live-responses-table .response-col_description pre').first().textContent()).trim();
  const curl = (await op.locator('.curl-command .curl, .curl-command pre').first().textContent()).trim();
  await op.scrollIntoViewIfNeeded();
  await page.screenshot({ path: screenshot, fullPage: true });
  const result = { title, operations, status: code, body, authorized: curl.includes(`Bearer ${jwt}`), errors };
  console.log(JSON.stringify(result));
  if (code !== '200') throw new Error(`try it out answered ${code}: ${body}`);
  if (!result.authorized) throw new Error(`the request did not carry the JWT: ${curl}`);
  if (!JSON.parse(body).pods) throw new Error(`no pods in ${body}`);
} finally {
  await context.close();
  rmSync(userDataDir, { recursive: true, force: true });
}
