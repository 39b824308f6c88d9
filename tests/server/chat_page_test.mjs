// The chat page at `/` in a real browser: Debian's chromium, headless, driven by puppeteer-core.
// Types a message, waits for the streamed answer and checks it is the answer the API gives for
// the same request; saves a screenshot. Usage:
//   node chat_page_test.mjs BASE_URL API_KEY SCREENSHOT.png
// (puppeteer-core from $POLYCHIP_NPM_DIR/node_modules; chromium from $CHROMIUM or /usr/bin/chromium)
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseUrl, apiKey, screenshot] = process.argv.slice(2);
const require = createRequire(path.join(process.env.POLYCHIP_NPM_DIR, 'package.json'));
const puppeteer = require('puppeteer-core');

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
let failed = false;
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 700 });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  // Nothing may come from anywhere but the server itself.
  const foreign = [];
  page.on('request', (r) => { if (!r.url().startsWith(baseUrl)) foreign.push(r.url()); });
  await page.goto(`${baseUrl}/`, { waitUntil: 'networkidle0' });
  assert.equal(await page.title(), 'polychip chat');
  const set = async (sel, value) => {
    await page.$eval(sel, (el, v) => { el.value = v; }, value);
  };
  await set('#api_key', apiKey);
  await set('#temperature', '0');
  await set('#max_tokens', '12');
  await set('#system', 'You are terse.');
  await page.type('#input', 'Hello, who are you?');
  await page.click('#send');
  await page.waitForSelector('.msg.assistant[data-done="1"]', { timeout: 60000 });
  const answer = await page.$eval('.msg.assistant .content', (el) => el.textContent);
  const stats = await page.$eval('#stats', (el) => el.textContent);
  await page.screenshot({ path: screenshot });

  // The same request through the API, not streamed.
  const r = await fetch(`${baseUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({
      messages: [{ role: 'system', content: 'You are terse.' },
                 { role: 'user', content: 'Hello, who are you?' }],
      temperature: 0, max_tokens: 12,
    }),
  });
  const expected = (await r.json()).choices[0].message.content;
  assert.ok(answer.length > 0, 'the page shows no answer');
  assert.equal(answer, expected);
  assert.match(stats, /tokens\/s/);
  assert.deepEqual(errors, []);
  assert.deepEqual(foreign, []);
  console.log(`ok   chat page streamed ${JSON.stringify(answer)} (${stats})`);

  // The other two APIs give the same conversation the same prompt, hence the same answer.
  for (const api of ['messages', 'responses']) {
    await page.click('#clear');
    await page.select('#api', api);
    await page.type('#input', 'Hello, who are you?');
    await page.click('#send');
    await page.waitForSelector('.msg.assistant[data-done="1"]', { timeout: 60000 });
    const got = await page.$eval('.msg.assistant .content', (el) => el.textContent);
    assert.equal(got, expected, api);
    assert.match(await page.$eval('#stats', (el) => el.textContent), /tokens\/s/, api);
    console.log(`ok   chat page over ${api}`);
  }
  assert.deepEqual(errors, []);
} catch (e) {
  failed = true;
  console.log(`FAIL chat page: ${e.stack ?? e}`);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
