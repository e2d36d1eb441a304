// api-tools.mjs — OpenAI tool calls through the official `openai` npm client
// against a running `lmserve serve` on a random-weight tiny model (started by
// test-api-openai.c with LMSERVE_URL, LMSERVE_KEY, LMSERVE_MODEL). The model
// wanders every path the tool-call constraint leaves open, so each call's name
// and arguments are checked against the tools' schemas here, by hand.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

const baseURL = process.env.LMSERVE_URL;
const apiKey = process.env.LMSERVE_KEY;
const model = process.env.LMSERVE_MODEL;
assert.ok(baseURL && apiKey && model, 'LMSERVE_URL, _KEY, _MODEL');
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather', description: 'The weather in a city',
      parameters: {
        type: 'object', additionalProperties: false, required: ['city', 'unit'],
        properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } },
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'add', description: 'Adds two numbers',
      parameters: {
        type: 'object', additionalProperties: false, required: ['a', 'b'],
        properties: { a: { type: 'integer', minimum: 0, maximum: 99 },
                      b: { type: 'integer', minimum: 0, maximum: 99 } },
      },
    },
  },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris, and what is 2 + 3?' }];

// A call's arguments against its tool's schema, checked here.
function checkCall(call, only) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_[0-9a-f]+$/);
  const args = JSON.parse(call.function.arguments);
  if (only) assert.equal(call.function.name, only);
  if (call.function.name === 'get_weather') {
    assert.deepEqual(Object.keys(args).sort(), ['city', 'unit']);
    assert.equal(typeof args.city, 'string');
    assert.ok([...args.city].length <= 12, args.city);
    assert.ok(['c', 'f'].includes(args.unit));
  } else {
    assert.equal(call.function.name, 'add');
    assert.deepEqual(Object.keys(args).sort(), ['a', 'b']);
    for (const v of [args.a, args.b]) assert.ok(Number.isInteger(v) && v >= 0 && v <= 99, `${v}`);
  }
}

const SEEDS = [1, 2, 3, 4, 5, 6];

test('tool_choice required: finished answers are tool calls that fit the schemas', async () => {
  let called = 0;
  for (const seed of SEEDS) {
    const r = await client.chat.completions.create({
      model, messages, tools, tool_choice: 'required', max_tokens: 300, temperature: 1, seed,
    });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue;
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.content, null);
    assert.ok(c.message.tool_calls.length >= 1);
    for (const call of c.message.tool_calls) checkCall(call);
    called++;
  }
  assert.ok(called > 0, 'some answers finished within 300 tokens');
});

test('a named tool, one call at a time', async () => {
  for (const seed of SEEDS.slice(0, 4)) {
    const r = await client.chat.completions.create({
      model, messages, tools, max_tokens: 300, temperature: 1, seed, parallel_tool_calls: false,
      tool_choice: { type: 'function', function: { name: 'add' } },
    });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue;
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.tool_calls.length, 1);
    checkCall(c.message.tool_calls[0], 'add');
  }
});

test('tool_choice auto: calls or a plain answer', async () => {
  const seen = new Set();
  for (const seed of [...SEEDS, 7, 8, 9, 10]) {
    const r = await client.chat.completions.create({
      model, messages, tools, max_tokens: 300, temperature: 1, seed,
    });
    const c = r.choices[0];
    seen.add(c.finish_reason);
    if (c.finish_reason === 'tool_calls') {
      assert.equal(c.message.content, null);
      for (const call of c.message.tool_calls) checkCall(call);
    } else if (c.finish_reason === 'stop') {
      assert.equal(typeof c.message.content, 'string');
      assert.equal(c.message.tool_calls, undefined);
    }
  }
  console.log(`auto: finish reasons ${[...seen].join(', ')}`);
});

test('streamed tool calls carry index, id, name and arguments', async () => {
  for (const seed of SEEDS.slice(0, 3)) {
    const body = {
      model, messages, tools, tool_choice: 'required', max_tokens: 300, temperature: 1, seed,
    };
    const whole = await client.chat.completions.create(body);
    const calls = [], pieces = [];
    let finish = null;
    for await (const ch of await client.chat.completions.create({ ...body, stream: true })) {
      const c = ch.choices[0];
      if (!c) continue;
      for (const d of c.delta?.tool_calls ?? []) {
        if (!calls[d.index]) { // a call's first delta: its id, type and name, once
          assert.ok(d.id && d.type === 'function' && d.function?.name, JSON.stringify(d));
          pieces[d.index] = 0;
        } else {
          assert.ok(d.id === undefined && d.function?.name === undefined, JSON.stringify(d));
        }
        pieces[d.index]++;
        calls[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
        if (d.id) calls[d.index].id = d.id;
        if (d.function?.name) calls[d.index].function.name += d.function.name;
        if (d.function?.arguments) calls[d.index].function.arguments += d.function.arguments;
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(finish, whole.choices[0].finish_reason);
    if (finish !== 'tool_calls') continue;
    const strip = (cs) => cs.map((x) => [x.function.name, x.function.arguments]);
    assert.deepEqual(strip(calls), strip(whole.choices[0].message.tool_calls));
    for (const call of calls) checkCall(call);
    // the arguments came in fragments while they were written
    assert.ok(pieces.every((p) => p >= 3), JSON.stringify(pieces));
  }
});

test('the history round trip: assistant tool calls and tool results', async () => {
  const history = [
    ...messages,
    { role: 'assistant', content: null, tool_calls: [
      { id: 'call_1', type: 'function', function: { name: 'get_weather',
        arguments: '{"city":"Paris","unit":"c"}' } },
      { id: 'call_2', type: 'function', function: { name: 'add', arguments: '{"a":2,"b":3}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '18 degrees, sunny' },
    { role: 'tool', tool_call_id: 'call_2', content: '5' },
  ];
  const r = await client.chat.completions.create({
    model, messages: history, tools, max_tokens: 40, temperature: 0,
  });
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  const plain = await client.chat.completions.create({
    model, messages: history, max_tokens: 4, temperature: 0,
  });
  assert.ok(plain.usage.prompt_tokens < r.usage.prompt_tokens, 'the tools are in the prompt');
});

// OpenAI's deprecated function calling: functions and function_call are the tools and
// tool_choice with one call at most; the call comes back as message.function_call (and
// streamed as delta.function_call), the finish reason "function_call"; a history's
// function_call and "function" results are read back.
test('legacy functions and function_call', async () => {
  const functions = tools.map((t) => t.function);
  let called = 0;
  for (const seed of SEEDS.slice(0, 4)) {
    const body = {
      model, messages, functions, function_call: { name: 'add' }, max_tokens: 300,
      temperature: 1, seed,
    };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0];
    let fc = { name: '', arguments: '' }, finish = null;
    for await (const ch of await client.chat.completions.create({ ...body, stream: true })) {
      const d = ch.choices[0]?.delta?.function_call;
      assert.equal(ch.choices[0]?.delta?.tool_calls, undefined);
      if (d?.name) fc.name += d.name;
      if (d?.arguments) fc.arguments += d.arguments;
      if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
    }
    assert.equal(finish, c.finish_reason);
    if (c.finish_reason === 'length') continue;
    assert.equal(c.finish_reason, 'function_call');
    assert.equal(c.message.tool_calls, undefined);
    assert.equal(c.message.content, null);
    assert.deepEqual(Object.keys(c.message.function_call).sort(), ['arguments', 'name']);
    checkCall({ id: 'call_0', type: 'function', function: c.message.function_call }, 'add');
    assert.deepEqual(fc, c.message.function_call);
    called++;
  }
  assert.ok(called > 0, 'some answers finished within 300 tokens');
  const history = [
    ...messages,
    { role: 'assistant', content: null,
      function_call: { name: 'add', arguments: '{"a":2,"b":3}' } },
    { role: 'function', name: 'add', content: '5' },
  ];
  const r = await client.chat.completions.create({
    model, messages: history, functions, function_call: 'none', max_tokens: 8, temperature: 0,
  });
  assert.equal(r.choices[0].message.function_call, undefined);
  const asTools = await client.chat.completions.create({
    model, max_tokens: 8, temperature: 0, messages: [
      ...messages,
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_fn1', type: 'function',
        function: { name: 'add', arguments: '{"a":2,"b":3}' } }] },
      { role: 'tool', tool_call_id: 'call_fn1', content: '5' },
    ],
  });
  // the same prompt as the history in tools' terms
  assert.equal(r.usage.prompt_tokens, asTools.usage.prompt_tokens);
  assert.equal(r.choices[0].message.content, asTools.choices[0].message.content);
  await assert.rejects(
    client.chat.completions.create({ model, messages, max_tokens: 4, functions, tools }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'functions');
});

test('bad tool requests are 400s naming the field', async () => {
  const cases = [
    [{ tools: [{ type: 'retrieval' }] }, 'tools[0]'],
    [{ tools: [{ type: 'function', function: { name: 'a b' } }] }, 'tools[0].function.name'],
    [{ tools: [tools[0], tools[0]] }, 'tools[1].function.name'],
    [{ tools: [{ type: 'function', function: { name: 'x', parameters: {
      type: 'object', properties: { l: { type: 'array', uniqueItems: true } } } } }] },
    'tools[0].function.parameters'],
    [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } },
      'tool_choice.function.name'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools, tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tools, response_format: { type: 'json_object' } }, 'response_format'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(
      client.chat.completions.create({ model, messages, max_tokens: 4, ...extra }),
      (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(extra)}: ${e}`);
        assert.equal(e.param, param, `${JSON.stringify(extra)}: ${e.message}`);
        return true;
      });
  }
  await assert.rejects(client.chat.completions.create({
    model, max_tokens: 4, messages: [...messages, { role: 'assistant', content: null,
      tool_calls: [{ id: 'c', type: 'function', function: { name: 'add', arguments: '[1]' } }] }],
  }), (e) => e instanceof OpenAI.BadRequestError &&
    e.param === 'messages[1].tool_calls[0].function');
});

// The Responses API's truncation auto with this protocol: tool results are a user turn
// of the protocol's own, which belongs to the turn of its calls; the kept chat starts at
// a user's message, never at a results turn.
test('responses truncation auto keeps a call and its results together', async () => {
  const maxLen = Number(process.env.LMSERVE_MAX_LEN);
  assert.ok(maxLen > 0, 'LMSERVE_MAX_LEN');
  const words = 'a long line of words about the weather in many cities of the world. '.repeat(6);
  const input = [], chat = [];
  for (let i = 0; i < 30; i++) {
    const id = `call_${i}`, args = `{"a":${i},"b":1}`;
    input.push({ role: 'user', content: `${i}: ${words}` },
               { type: 'function_call', call_id: id, name: 'add', arguments: args },
               { type: 'function_call_output', call_id: id, output: `${i + 1}` },
               { role: 'assistant', content: `It is ${i + 1}.` });
    chat.push({ role: 'user', content: `${i}: ${words}` },
              { role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: 'add', arguments: args } }] },
              { role: 'tool', tool_call_id: id, content: `${i + 1}` },
              { role: 'assistant', content: `It is ${i + 1}.` });
  }
  input.push({ role: 'user', content: 'And now?' });
  chat.push({ role: 'user', content: 'And now?' });
  const rtools = tools.map((t) => ({ type: 'function', ...t.function }));
  const r = await client.responses.create({ model, input, tools: rtools, truncation: 'auto',
                                            max_output_tokens: 8, temperature: 1, seed: 1 });
  assert.ok(r.usage.input_tokens + 8 <= maxLen, `${r.usage.input_tokens}`);
  // the fewest whole turns dropped that fit: k turns of four messages
  let k = 0, n = 0;
  for (; k < 30; k++) { // (a chat too long is a 400)
    const t = await client.chat.completions.create({ model, messages: chat.slice(4 * k), tools, max_tokens: 8 })
      .catch((e) => { assert.ok(e instanceof OpenAI.BadRequestError, `${e}`); return null; });
    if (!t) continue;
    n = t.usage.prompt_tokens;
    break;
  }
  assert.ok(k > 0 && k < 30, `${k}`);
  assert.equal(r.usage.input_tokens, n);
});
