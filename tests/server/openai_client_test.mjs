// The official `openai` npm client against a running polychip server: chat (non-streaming),
// completion, streaming chat. Usage: node openai_client_test.mjs BASE_URL API_KEY
// The package is resolved from $POLYCHIP_NPM_DIR/node_modules (installed by
// tests/setup/setup-test-deps.sh).
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseUrl, apiKey] = process.argv.slice(2);
const npmDir = process.env.POLYCHIP_NPM_DIR;
const require = createRequire(path.join(npmDir, 'package.json'));
let OpenAI;
try {
  OpenAI = require('openai');
} catch (e) {
  console.error(`the openai npm package is not in ${npmDir}: run tests/setup/setup-test-deps.sh`);
  process.exit(2);
}
OpenAI = OpenAI.default ?? OpenAI.OpenAI ?? OpenAI;

const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey, maxRetries: 0, timeout: 60000 });
const model = 'tiny';
const sampling = { temperature: 0, max_tokens: 8, ignore_eos: true };
const checks = [];
const check = (name, fn) => checks.push([name, fn]);

check('models.list', async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, model);
});

let chatText;
check('chat.completions.create', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello there' }], ...sampling,
  });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 8);
  chatText = r.choices[0].message.content;
});

check('completions.create', async () => {
  const r = await client.completions.create({ model, prompt: 'Once upon a time', ...sampling });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.id, 'string');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.usage.prompt_tokens, 4);
});

check('chat.completions.create stream', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Hello there' }], ...sampling,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  let id = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    id ??= chunk.id;
    assert.equal(chunk.id, id);  // one id for the whole stream
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    ++chunks;
    text += chunk.choices[0].delta.content ?? '';
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.match(id, /^chatcmpl-/);
  assert.ok(chunks >= 2, `${chunks} chunks`);
  assert.equal(finish, 'length');
  assert.equal(usage?.completion_tokens, 8);
  assert.equal(text, chatText);  // greedy: the same as the non-streaming answer
});

check('wrong key is an AuthenticationError', async () => {
  const bad = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(
    bad.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 401 && e instanceof OpenAI.AuthenticationError);
});

let failed = 0;
for (const [name, fn] of checks) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    ++failed;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}
process.exit(failed ? 1 : 0);
