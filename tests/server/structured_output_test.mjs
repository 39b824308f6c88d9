// Structured outputs through the official `openai` npm client against `polychip serve` on a
// random-weight model: whatever the weights say, every response must parse and validate.
// Usage: node structured_output_test.mjs BASE_URL API_KEY (the package is resolved from
// $POLYCHIP_NPM_DIR/node_modules, installed by tests/setup/setup-test-deps.sh).
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import path from 'node:path';

import { validate } from './json_schema_check.mjs';

const [baseUrl, apiKey] = process.argv.slice(2);
const require = createRequire(path.join(process.env.POLYCHIP_NPM_DIR, 'package.json'));
let OpenAI = require('openai');
OpenAI = OpenAI.default ?? OpenAI.OpenAI ?? OpenAI;
const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const model = 'tiny';

const schema = {
  $defs: {
    color: { type: 'string', enum: ['red', 'green', 'blue'] },
    point: {
      type: 'object',
      properties: {
        x: { type: 'integer', minimum: -100, maximum: 100 },
        y: { type: 'integer', minimum: 0, maximum: 9 },
      },
      required: ['x', 'y'],
      additionalProperties: false,
    },
  },
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 8 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    ok: { type: 'boolean' },
    color: { $ref: '#/$defs/color' },
    where: { $ref: '#/$defs/point' },
    tags: { type: 'array', items: { $ref: '#/$defs/color' }, minItems: 1, maxItems: 3 },
    score: { type: 'number', minimum: 0, maximum: 1 },
    nick: { anyOf: [{ type: 'string', maxLength: 4 }, { type: 'null' }] },
  },
  required: ['name', 'age', 'color', 'where', 'tags'],
  additionalProperties: false,
};

const checks = [];
const check = (name, fn) => checks.push([name, fn]);

check('50 json_schema responses at temperature 1 validate', async () => {
  const runs = Array.from({ length: 50 }, (_, i) => client.chat.completions.create({
    model, messages: [{ role: 'user', content: `Describe person ${i} as JSON.` }],
    temperature: 1, max_tokens: 900, seed: 1000 + i,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
  }));
  const keyOrder = Object.keys(schema.properties);
  for (const r of await Promise.all(runs)) {
    const text = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, 'stop', `did not finish: ${text}`);
    const v = JSON.parse(text);
    validate(schema, v);
    // Properties come in the schema's order.
    const keys = Object.keys(v);
    assert.deepEqual(keys, keyOrder.filter((k) => keys.includes(k)));
  }
});

check('json_object', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'JSON please' }], temperature: 0, max_tokens: 200,
    response_format: { type: 'json_object' },
  });
  const text = r.choices[0].message.content;
  // A random model may not close an open string in 200 tokens; what it wrote is a JSON prefix.
  assert.equal(text[0], '{');
  if (r.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(text), 'object');
});

check('streamed json_schema reassembles', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'stream it' }], temperature: 1, seed: 7,
    max_tokens: 900, stream: true,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema } },
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  validate(schema, JSON.parse(text));
});

const regex = '(yes|no), [0-9]{3}-[a-z]{2,5}!';
check('regex on completions (SGLang extra parameter)', async () => {
  for (let i = 0; i < 10; ++i) {
    const r = await client.completions.create({
      model, prompt: 'Answer:', temperature: 1, seed: i, max_tokens: 64, regex,
    });
    assert.match(r.choices[0].text, new RegExp(`^${regex}$`));
    assert.equal(r.choices[0].finish_reason, 'stop');
  }
});

const post = async (route, body) => {
  const r = await fetch(`${baseUrl}${route}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
};

check('/generate json_schema, regex and ebnf', async () => {
  const small = { type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 5 } }, required: ['n'] };
  const a = await post('/generate', {
    text: 'x', sampling_params: { temperature: 1, max_new_tokens: 200, json_schema: JSON.stringify(small) },
  });
  assert.equal(a.status, 200, JSON.stringify(a.body));
  validate(small, JSON.parse(a.body.text));
  const b = await post('/generate', {
    text: 'x', sampling_params: { temperature: 1, max_new_tokens: 64, regex: '[A-C]{2}[0-9]' },
  });
  assert.match(b.body.text, /^[A-C]{2}[0-9]$/);
  const c = await post('/generate', {
    text: 'x', sampling_params: {
      temperature: 1, max_new_tokens: 64,
      ebnf: 'root ::= "(" num ("+" num){0,3} ")"\nnum ::= [1-9]',
    },
  });
  assert.match(c.body.text, /^\([1-9](\+[1-9]){0,3}\)$/);
});

check('unsupported schema keywords and bad constraints are 400s naming them', async () => {
  const bad = await post('/v1/chat/completions', {
    model, messages: [{ role: 'user', content: 'x' }],
    response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'integer', multipleOf: 3 } } },
  });
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /multipleOf/);
  assert.equal(bad.body.error.param, 'response_format');
  const re = await post('/v1/completions', { model, prompt: 'x', regex: '(a' });
  assert.equal(re.status, 400);
  assert.equal(re.body.error.param, 'regex');
  const two = await post('/v1/completions', { model, prompt: 'x', regex: 'a', ebnf: 'root ::= "a"' });
  assert.equal(two.status, 400);
});

const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 1, maxLength: 10 },
        unit: { enum: ['c', 'f'] },
        days: { type: 'integer', minimum: 1, maximum: 7 },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const clock = {
  type: 'function',
  function: {
    name: 'get_time',
    parameters: { type: 'object', properties: { tz: { type: 'string', maxLength: 6 } }, required: ['tz'] },
  },
};
const toolSchemas = { get_weather: weather.function.parameters, get_time: clock.function.parameters };
const validateCall = (call) => {
  assert.match(call.id, /^call_/);
  assert.equal(call.type, 'function');
  assert.ok(call.function.name in toolSchemas, call.function.name);
  validate(toolSchemas[call.function.name], JSON.parse(call.function.arguments));
};
const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];

check('tool_choice required: tool_calls whose arguments validate', async () => {
  for (let i = 0; i < 5; ++i) {
    const r = await client.chat.completions.create({
      model, messages: ask, tools: [weather, clock], tool_choice: 'required', temperature: 1,
      seed: 100 + i, max_tokens: 600,
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(m));
    assert.ok(m.tool_calls.length >= 1 && m.tool_calls.length <= 4);
    m.tool_calls.forEach(validateCall);
  }
});

check('named tool_choice without parallel calls: exactly that call', async () => {
  const r = await client.chat.completions.create({
    model, messages: ask, tools: [weather, clock], temperature: 1, seed: 5, max_tokens: 600,
    tool_choice: { type: 'function', function: { name: 'get_time' } }, parallel_tool_calls: false,
  });
  const calls = r.choices[0].message.tool_calls;
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_time');
  validateCall(calls[0]);
});

check('streamed tool-call deltas reassemble to the same call', async () => {
  const req = {
    model, messages: ask, tools: [weather, clock], temperature: 1, seed: 11, max_tokens: 600,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  };
  const whole = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    for (const d of ch.delta?.tool_calls ?? []) {
      const c = (calls[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
      if (d.id) c.id = d.id;
      if (d.function?.name) c.function.name += d.function.name;
      if (d.function?.arguments) c.function.arguments += d.function.arguments;
    }
    finish = ch.finish_reason ?? finish;
  }
  assert.equal(finish, 'tool_calls');
  calls.forEach(validateCall);
  const expected = whole.choices[0].message.tool_calls;
  assert.deepEqual(calls.map((c) => [c.function.name, c.function.arguments]),
                   expected.map((c) => [c.function.name, c.function.arguments]));
});

check('streamed tool call: id, type and name first, then its arguments in several deltas', async () => {
  const note = {
    type: 'function',
    function: {
      name: 'save_note',
      parameters: {
        type: 'object',
        properties: { text: { type: 'string', minLength: 40, maxLength: 60 } },
        required: ['text'], additionalProperties: false,
      },
    },
  };
  const req = {
    model, messages: [{ role: 'user', content: 'note this' }], tools: [note], temperature: 1,
    seed: 3, max_tokens: 400, tool_choice: 'required', parallel_tool_calls: false,
  };
  const whole = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true });
  const entries = [];
  let finish = null;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    entries.push(...(ch.delta?.tool_calls ?? []));
    finish = ch.finish_reason ?? finish;
  }
  assert.equal(finish, 'tool_calls');
  assert.ok(entries.length >= 3, `only ${entries.length} tool-call deltas`);
  const [first, ...rest] = entries;
  assert.equal(first.index, 0);
  assert.match(first.id, /^call_/);
  assert.equal(first.type, 'function');
  assert.equal(first.function.name, 'save_note');
  for (const d of rest) {
    assert.equal(d.index, 0);
    assert.equal(d.id, undefined);
    assert.equal(d.function.name, undefined);
  }
  const args = entries.map((d) => d.function.arguments ?? '').join('');
  const argDeltas = entries.filter((d) => d.function.arguments).length;
  assert.ok(argDeltas > 1, `the arguments came in ${argDeltas} delta(s)`);
  const parsed = JSON.parse(args);
  assert.ok([...parsed.text].length >= 40, args);
  assert.equal(args, whole.choices[0].message.tool_calls[0].function.arguments);
});

check('tool results in the next turn; tool_choice none answers in text', async () => {
  const r = await client.chat.completions.create({
    model, tools: [weather], tool_choice: 'none', temperature: 0, max_tokens: 8,
    messages: [
      ...ask,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: '{"city":"Paris","unit":"c"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
    ],
  });
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].message.tool_calls, undefined);
});

check('/v1/tokenize and /v1/detokenize', async () => {
  const t = await post('/v1/tokenize', { model, prompt: 'hello world', add_special_tokens: false });
  assert.equal(t.status, 200);
  assert.equal(t.body.count, t.body.tokens.length);
  const d = await post('/v1/detokenize', { model, tokens: t.body.tokens });
  assert.equal(d.body.text, 'hello world');
});

check('honest parameters: logit_bias works, unimplemented ones are 400s naming them', async () => {
  const t = (await post('/v1/tokenize', { prompt: 'hello', add_special_tokens: false })).body.tokens;
  const forced = t[t.length - 1];
  const r = await client.completions.create({
    model, prompt: 'x', temperature: 0, max_tokens: 4, ignore_eos: true,
    logit_bias: { [forced]: 100 },
  });
  const expected = (await post('/v1/detokenize', { tokens: [forced, forced, forced, forced] })).body.text;
  assert.equal(r.choices[0].text, expected);
  const m = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'x' }], max_completion_tokens: 3, ignore_eos: true, n: 2,
  });
  assert.equal(m.choices.length, 2);
  assert.equal(m.usage.completion_tokens, 6);
  for (const [body, param] of [
    [{ model, prompt: 'x', suffix: 'tail' }, 'suffix'],
    [{ model, prompt: 'x', best_of: 3 }, 'best_of'],
  ]) {
    const e = await post('/v1/completions', body);
    assert.equal(e.status, 400, JSON.stringify(e.body));
    assert.equal(e.body.error.param, param);
  }
  for (const [extra, param] of [[{ audio: { voice: 'x' } }, 'audio'],
                                [{ functions: [{ name: 'f' }] }, 'functions'],
                                [{ modalities: ['text', 'audio'] }, 'modalities']]) {
    const e = await post('/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], ...extra });
    assert.equal(e.status, 400, JSON.stringify(e.body));
    assert.equal(e.body.error.param, param);
  }
  // Parameters that change nothing are accepted.
  const ok = await post('/v1/chat/completions', {
    model, messages: [{ role: 'user', content: 'x' }], max_tokens: 2, user: 'u', store: false,
    metadata: { a: 'b' }, service_tier: 'auto',
  });
  assert.equal(ok.status, 200, JSON.stringify(ok.body));
});

let failed = 0;
for (const [name, fn] of checks) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack ?? e}`);
  }
}
process.exit(failed ? 1 : 0);
