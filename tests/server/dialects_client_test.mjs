// Anthropic's Messages API through the official `@anthropic-ai/sdk` and OpenAI's Responses API
// through the official `openai` client, against `polychip serve` on a random-weight model:
// plain and streamed answers, forced tool calls whose input validates and that are answered
// and continued, json_schema outputs, previous_response_id, stored responses, and the error
// type each SDK raises for a bad request. Usage: node dialects_client_test.mjs BASE_URL API_KEY
// (the packages are resolved from $POLYCHIP_NPM_DIR/node_modules, installed by
// tests/setup/setup-test-deps.sh).
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

import { validate } from './json_schema_check.mjs';

const [baseUrl, apiKey] = process.argv.slice(2);
const require = createRequire(path.join(process.env.POLYCHIP_NPM_DIR, 'package.json'));
let Anthropic = require('@anthropic-ai/sdk');
Anthropic = Anthropic.default ?? Anthropic.Anthropic ?? Anthropic;
let OpenAI = require('openai');
OpenAI = OpenAI.default ?? OpenAI.OpenAI ?? OpenAI;
// The Anthropic client sends the key as x-api-key.
const anthropic = new Anthropic({ baseURL: baseUrl, apiKey, maxRetries: 0, timeout: 120000 });
const openai = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const model = 'tiny';

const weatherSchema = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 1, maxLength: 10 },
    unit: { enum: ['c', 'f'] },
  },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const ask = 'What is the weather in Paris?';

const checks = [];
const check = (name, fn) => checks.push([name, fn]);

async function expectError(promise, ErrorType, status) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof ErrorType, `${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    return e;
  }
  assert.fail(`no ${ErrorType.name}`);
}

// ---- Anthropic Messages ----------------------------------------------------------------------

check('anthropic messages.create', async () => {
  const r = await anthropic.messages.create({
    model, max_tokens: 8, temperature: 0, system: 'Be brief.',
    messages: [{ role: 'user', content: 'Hello there' }],
  });
  assert.match(r.id, /^msg_/);
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.equal(r.model, model);
  assert.ok(['max_tokens', 'end_turn'].includes(r.stop_reason), r.stop_reason);
  assert.equal(r.content[0]?.type ?? 'text', 'text');
  assert.ok(r.usage.input_tokens > 0);
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 8);
});

check('anthropic messages.stream: event sequence and final message', async () => {
  const stream = anthropic.messages.stream({
    model, max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Hello there' }],
  });
  const types = [];
  let text = '';
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
  }
  const final = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  assert.equal(final.content.map((b) => b.text).join(''), text);
  assert.ok(final.usage.output_tokens >= 1 && final.usage.output_tokens <= 12);
});

const anthropicTool = { name: 'get_weather', description: 'The weather', input_schema: weatherSchema };
check('anthropic forced tool_use validates, answered with tool_result and continued', async () => {
  const messages = [{ role: 'user', content: ask }];
  const r = await anthropic.messages.create({
    model, max_tokens: 600, temperature: 1, messages, tools: [anthropicTool],
    tool_choice: { type: 'tool', name: 'get_weather' },
  });
  assert.equal(r.stop_reason, 'tool_use', JSON.stringify(r.content));
  const use = r.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_weather');
  validate(weatherSchema, use.input);
  const next = await anthropic.messages.create({
    model, max_tokens: 8, tools: [anthropicTool],
    messages: [...messages, { role: 'assistant', content: r.content },
               { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny, 21 C' }] }],
  });
  assert.equal(next.type, 'message');
  // The call and its result joined the prompt (prompt tokens found in the prefix cache are
  // counted apart).
  const prompt = (u) => u.input_tokens + u.cache_read_input_tokens;
  assert.ok(prompt(next.usage) > prompt(r.usage));
});

check('anthropic streamed forced tool_use: input_json_delta reassembles', async () => {
  const stream = anthropic.messages.stream({
    model, max_tokens: 600, temperature: 1, messages: [{ role: 'user', content: ask }],
    tools: [anthropicTool], tool_choice: { type: 'any' },
  });
  const partial = [];  // per content block
  for await (const ev of stream) {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') {
      partial[ev.index] = (partial[ev.index] ?? '') + ev.delta.partial_json;
    }
  }
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  const uses = final.content.filter((b) => b.type === 'tool_use');
  assert.ok(uses.length >= 1);
  final.content.forEach((b, i) => {
    if (b.type !== 'tool_use') return;
    assert.deepEqual(b.input, JSON.parse(partial[i]));
    validate(weatherSchema, b.input);
  });
});

check('anthropic output_config json_schema validates', async () => {
  const r = await anthropic.messages.create({
    model, max_tokens: 600, temperature: 1, messages: [{ role: 'user', content: ask }],
    output_config: { format: { type: 'json_schema', schema: weatherSchema } },
  });
  assert.equal(r.stop_reason, 'end_turn');
  validate(weatherSchema, JSON.parse(r.content[0].text));
});

check('anthropic messages.countTokens', async () => {
  const r = await anthropic.messages.countTokens({ model, messages: [{ role: 'user', content: ask }] });
  const m = await anthropic.messages.create({ model, max_tokens: 1, messages: [{ role: 'user', content: ask }] });
  assert.equal(r.input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
});

check('anthropic errors: missing max_tokens, unknown model, bad key', async () => {
  const e = await expectError(
    anthropic.messages.create({ model, messages: [{ role: 'user', content: 'x' }] }),
    Anthropic.BadRequestError, 400);
  assert.equal(e.error.type, 'error');
  assert.equal(e.error.error.type, 'invalid_request_error');
  assert.match(e.error.error.message, /max_tokens/);
  await expectError(
    anthropic.messages.create({ model: 'claude-nope', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    Anthropic.NotFoundError, 404);
  const stranger = new Anthropic({ baseURL: baseUrl, apiKey: 'wrong', maxRetries: 0 });
  const a = await expectError(
    stranger.messages.create({ model, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    Anthropic.AuthenticationError, 401);
  assert.equal(a.error.error.type, 'authentication_error');
});

// ---- OpenAI Responses ------------------------------------------------------------------------

check('openai responses.create', async () => {
  const r = await openai.responses.create({ model, input: 'Hello there', max_output_tokens: 8, temperature: 0 });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.equal(r.output[0].type, 'message');
  assert.equal(typeof r.output_text, 'string');
  assert.ok(r.usage.output_tokens >= 1 && r.usage.output_tokens <= 8);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

check('openai responses stream: event sequence and final response', async () => {
  const stream = await openai.responses.create({
    model, input: [{ role: 'user', content: 'Hello there' }], max_output_tokens: 12,
    temperature: 0, stream: true,
  });
  const types = [];
  let text = '';
  let final;
  for await (const ev of stream) {
    types.push(ev.type);
    assert.equal(ev.sequence_number, types.length - 1);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  assert.deepEqual(types.slice(0, 3), ['response.created', 'response.in_progress', 'response.output_item.added']);
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.at(-1));
  assert.equal(final.output[0].content[0].text, text);
});

const openaiTool = { type: 'function', name: 'get_weather', parameters: weatherSchema, strict: true };
check('openai forced function_call validates, answered with function_call_output and continued', async () => {
  const r = await openai.responses.create({
    model, input: ask, tools: [openaiTool], tool_choice: { type: 'function', name: 'get_weather' },
    temperature: 1, max_output_tokens: 600,
  });
  const call = r.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(r.output));
  assert.equal(call.name, 'get_weather');
  validate(weatherSchema, JSON.parse(call.arguments));
  const next = await openai.responses.create({
    model, previous_response_id: r.id, tools: [openaiTool], max_output_tokens: 8,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: 'sunny, 21 C' }],
  });
  assert.equal(next.previous_response_id, r.id);
  assert.ok(next.usage.input_tokens > r.usage.input_tokens);  // the stored exchange came first
});

check('openai streamed function_call arguments reassemble', async () => {
  const stream = await openai.responses.create({
    model, input: ask, tools: [openaiTool], tool_choice: 'required', temperature: 1,
    max_output_tokens: 600, stream: true,
  });
  const args = {};  // per item
  let calls = 0;
  for await (const ev of stream) {
    if (ev.type === 'response.function_call_arguments.delta') {
      args[ev.item_id] = (args[ev.item_id] ?? '') + ev.delta;
    }
    if (ev.type === 'response.function_call_arguments.done') {
      assert.equal(ev.arguments, args[ev.item_id]);
      validate(weatherSchema, JSON.parse(ev.arguments));
      ++calls;
    }
  }
  assert.ok(calls >= 1);
});

check('openai text.format json_schema validates', async () => {
  const r = await openai.responses.create({
    model, input: ask, temperature: 1, max_output_tokens: 600,
    text: { format: { type: 'json_schema', name: 'weather', schema: weatherSchema, strict: true } },
  });
  assert.equal(r.status, 'completed');
  validate(weatherSchema, JSON.parse(r.output_text));
});

check('openai previous_response_id, retrieve and delete', async () => {
  const first = await openai.responses.create({ model, input: 'My name is Ada.', max_output_tokens: 4 });
  const second = await openai.responses.create({
    model, previous_response_id: first.id, input: 'What is my name?', max_output_tokens: 4,
  });
  // The first exchange is part of the second prompt.
  assert.ok(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens);
  const got = await openai.responses.retrieve(first.id);
  assert.equal(got.id, first.id);
  assert.equal(got.output[0].content[0].text, first.output_text);
  await openai.responses.del(first.id);
  await expectError(openai.responses.retrieve(first.id), OpenAI.NotFoundError, 404);
  const e = await expectError(
    openai.responses.create({ model, previous_response_id: first.id, input: 'x', max_output_tokens: 2 }),
    OpenAI.BadRequestError, 400);
  assert.match(e.message, /deleted/);
});

check('openai responses errors: unknown model, bad field', async () => {
  await expectError(openai.responses.create({ model: 'gpt-nope', input: 'x' }), OpenAI.NotFoundError, 404);
  const e = await expectError(
    openai.responses.create({ model, input: 'x', tools: [{ type: 'web_search' }] }),
    OpenAI.BadRequestError, 400);
  assert.equal(e.param, 'tools.0.type');
  await expectError(openai.responses.create({ model, input: 'x', temperature: 5 }), OpenAI.BadRequestError, 400);
});

let failed = 0;
for (const [name, fn] of checks) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}
process.exit(failed ? 1 : 0);
