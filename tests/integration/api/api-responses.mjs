// api-responses.mjs — POST /v1/responses (OpenAI's Responses API) through the
// official `openai` npm client, against `lmserve serve` on a random-weight tiny
// Gemma 4 with Gemma 4's tokenizer and chat format (started by test-api-openai.c
// with LMSERVE_URL, LMSERVE_KEY, LMSERVE_MODEL).
//
// The client's own machinery is the judge of the form: responses.create's types,
// its output_text, and responses.stream, whose ResponseStream rebuilds the
// response from the events and throws on an event that names an item or part it
// has not seen. What the answer holds is held to the chat completion of the same
// conversation, the same seed: the Responses request must be that chat request
// underneath, item by item. Where a test needs a thought or a call, a grammar that
// names Gemma 4's special tokens makes it happen.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

import { apiKey, client, model, post, root, thoughtGrammar } from './api-lib.mjs';

const weatherParams = {
  type: 'object', required: ['city', 'unit'], additionalProperties: false,
  properties: { city: { type: 'string', maxLength: 8 }, unit: { enum: ['c', 'f'] } },
};
const addParams = {
  type: 'object', required: ['a', 'b'], additionalProperties: false,
  properties: { a: { type: 'integer' }, b: { type: 'integer' } },
};
// the same tools in the two APIs' forms
const tools = [
  { type: 'function', name: 'get_weather', description: 'The weather in a city', parameters: weatherParams, strict: true },
  { type: 'function', name: 'add', description: 'Adds two numbers', parameters: addParams, strict: true },
];
const chatTools = tools.map(({ type, strict, ...fn }) => ({ type, function: fn }));

function checkResponse(r) {
  assert.match(r.id, /^resp_[0-9a-f]+$/);
  assert.equal(r.object, 'response');
  assert.ok(Number.isInteger(r.created_at));
  assert.equal(r.model, model);
  assert.equal(r.error, null);
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  if (r.status === 'incomplete') assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  else assert.equal(r.incomplete_details, null);
  const u = r.usage;
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.ok(Number.isInteger(u.input_tokens_details.cached_tokens));
  assert.ok(Number.isInteger(u.output_tokens_details.reasoning_tokens));
  for (const item of r.output) {
    assert.ok(['completed', 'incomplete'].includes(item.status), JSON.stringify(item));
    if (item.type === 'message') {
      assert.match(item.id, /^msg_/);
      assert.equal(item.role, 'assistant');
      assert.equal(item.content.length, 1);
      assert.equal(item.content[0].type, 'output_text');
      assert.deepEqual(item.content[0].annotations, []);
    } else if (item.type === 'reasoning') {
      assert.match(item.id, /^rs_/);
      assert.deepEqual(item.summary, []);
      assert.equal(item.content[0].type, 'reasoning_text');
    } else {
      assert.equal(item.type, 'function_call');
      assert.match(item.id, /^fc_/);
      assert.match(item.call_id, /^call_/);
      JSON.parse(item.arguments);
    }
  }
}

// the text of a response's message items (finalResponse() has no output_text
// unless it parsed a format)
function textOf(r) {
  return r.output.filter((i) => i.type === 'message').flatMap((i) => i.content)
    .filter((c) => c.type === 'output_text').map((c) => c.text).join('');
}

// The chat completion the Responses request stands for.
async function chatOf(messages, extra) {
  return client.chat.completions.create({ model, messages, ...extra });
}

// responses.stream's events checked as they come, and its final response
async function streamed(params) {
  const s = client.responses.stream(params);
  const events = [];
  const text = {}; // output index -> text put together from its deltas
  for await (const e of s) {
    assert.equal(e.sequence_number, events.length, `${e.type} in order`);
    events.push(e);
    if (e.type.endsWith('.delta')) text[e.output_index] = (text[e.output_index] ?? '') + e.delta;
    if (e.type === 'response.output_text.done' || e.type === 'response.reasoning_text.done')
      assert.equal(e.text, text[e.output_index] ?? '');
    if (e.type === 'response.function_call_arguments.done')
      assert.equal(e.arguments, text[e.output_index] ?? '');
  }
  const final = await s.finalResponse();
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[0].response.status, 'in_progress');
  assert.equal(events[1].type, 'response.in_progress');
  const last = events.at(-1);
  assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
  assert.equal(last.response.id, events[0].response.id);
  // each item: added, then its events, then done, one item at a time
  let open = -1;
  for (const e of events.slice(2, -1)) {
    if (e.type === 'response.output_item.added') {
      assert.equal(open, -1);
      open = e.output_index;
      assert.equal(e.item.status, 'in_progress');
    } else {
      assert.equal(e.output_index, open, e.type);
      if (e.type === 'response.output_item.done') {
        assert.deepEqual(e.item, last.response.output[open]);
        open = -1;
      }
    }
  }
  assert.equal(open, -1);
  checkResponse(last.response);
  return { events, final, response: last.response };
}

const user = 'What is the weather in Paris?';

test('text in, text out: the chat completion of the same turn, with usage', async () => {
  for (const seed of [1, 2]) {
    const r = await client.responses.create({
      model, input: user, instructions: 'Be brief.', max_output_tokens: 12, temperature: 1, seed,
    });
    checkResponse(r);
    const c = await chatOf([{ role: 'system', content: 'Be brief.' }, { role: 'user', content: user }],
                           { max_tokens: 12, temperature: 1, seed });
    assert.equal(r.output.length, 1);
    assert.equal(r.output_text, c.choices[0].message.content);
    assert.equal(r.status, c.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
    assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
    assert.equal(r.usage.output_tokens, c.usage.completion_tokens);
    assert.equal(r.instructions, 'Be brief.');
    assert.equal(r.max_output_tokens, 12);
    assert.equal(r.temperature, 1);
    assert.equal(r.store, true);
    assert.deepEqual(r.text, { format: { type: 'text' } });
  }
});

test('streamed: the events rebuild the same response', async () => {
  const params = { model, input: [{ role: 'user', content: [{ type: 'input_text', text: user }] }],
                   max_output_tokens: 10, temperature: 1, seed: 5 };
  const whole = await client.responses.create(params);
  const { final, response, events } = await streamed(params);
  assert.equal(textOf(final), whole.output_text);
  assert.equal(textOf(response), whole.output_text);
  assert.deepEqual(response.usage, whole.usage);
  assert.equal(response.status, whole.status);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  assert.ok(deltas.length >= 2, 'the text comes in pieces');
});

test('reasoning: the thought is a reasoning item, its tokens counted apart', async () => {
  const grammar = await thoughtGrammar();
  for (const seed of [0, 1]) {
    const params = { model, input: user, max_output_tokens: 40, temperature: 1, seed,
                     structured_outputs: { grammar }, include: ['message.output_text.logprobs'] };
    const r = await client.responses.create(params);
    checkResponse(r);
    assert.deepEqual(r.output.map((i) => i.type), ['reasoning', 'message']);
    assert.match(r.output[0].content[0].text, /^[a-z ]{1,12}$/);
    assert.match(r.output_text, /^done[0-9]{1,3}$/);
    const c = await chatOf([{ role: 'user', content: user }],
                           { max_tokens: 40, temperature: 1, seed, structured_outputs: { grammar }, logprobs: true });
    assert.equal(r.output[0].content[0].text, c.choices[0].message.reasoning);
    assert.equal(r.output_text, c.choices[0].message.content);
    // the chat answer's logprobs hold every token; the text's are those after the thought's
    const all = c.choices[0].logprobs.content;
    const lps = r.output[1].content[0].logprobs;
    const think = r.usage.output_tokens_details.reasoning_tokens;
    assert.equal(all.length, r.usage.output_tokens);
    assert.equal(all[think - 1].token, '<channel|>', 'the thought ends with its marker');
    assert.equal(lps.length, r.usage.output_tokens - think);
    assert.deepEqual(lps.map((l) => l.token), all.slice(think).map((l) => l.token));
    for (let i = 0; i < lps.length; i++) assert.ok(Math.abs(lps[i].logprob - all[think + i].logprob) < 1e-5);
    const st = await streamed(params);
    assert.deepEqual(st.response.output.map((i) => i.type), ['reasoning', 'message']);
    assert.equal(st.response.output[0].content[0].text, r.output[0].content[0].text);
    assert.equal(textOf(st.final), r.output_text);
    assert.deepEqual(st.response.usage, r.usage);
    assert.ok(st.events.some((e) => e.type === 'response.reasoning_text.delta'));
    const slps = st.events.filter((e) => e.type === 'response.output_text.delta').flatMap((e) => e.logprobs);
    assert.deepEqual(slps.map((l) => l.token), lps.map((l) => l.token));
  }
});

test('reasoning.effort turns Gemma 4 thinking on in the prompt', async () => {
  const on = await client.responses.create({ model, input: user, max_output_tokens: 1, reasoning: { effort: 'high' } });
  const off = await client.responses.create({ model, input: user, max_output_tokens: 1, reasoning: { effort: 'none' } });
  const c = await chatOf([{ role: 'user', content: user }], { max_tokens: 1, chat_template_kwargs: { enable_thinking: true } });
  assert.equal(on.usage.input_tokens, c.usage.prompt_tokens);
  assert.notEqual(on.usage.input_tokens, off.usage.input_tokens);
  assert.deepEqual(on.reasoning, { effort: 'high' });
});

function checkCall(item) {
  const args = JSON.parse(item.arguments);
  if (item.name === 'get_weather') {
    assert.deepEqual(Object.keys(args).sort(), ['city', 'unit']);
    assert.ok([...args.city].length <= 8, args.city);
    assert.ok(['c', 'f'].includes(args.unit));
  } else {
    assert.equal(item.name, 'add');
    assert.deepEqual(Object.keys(args).sort(), ['a', 'b']);
    assert.ok(Number.isInteger(args.a) && Number.isInteger(args.b));
  }
}

test('function tools: calls are function_call items, streamed the same', async () => {
  let calls = 0;
  for (const seed of [1, 2, 3]) {
    const params = { model, input: user, tools, tool_choice: 'required', max_output_tokens: 120, temperature: 1, seed };
    const r = await client.responses.create(params);
    checkResponse(r);
    const c = await chatOf([{ role: 'user', content: user }],
                           { tools: chatTools, tool_choice: 'required', max_tokens: 120, temperature: 1, seed });
    const fc = r.output.filter((i) => i.type === 'function_call');
    const cc = c.choices[0].message.tool_calls ?? [];
    assert.deepEqual(fc.map((i) => [i.name, i.arguments]), cc.map((t) => [t.function.name, t.function.arguments]));
    if (r.status !== 'completed') continue;
    calls += fc.length;
    for (const item of fc) checkCall(item);
    const st = await streamed(params);
    assert.deepEqual(st.response.output.map((i) => [i.type, i.name, i.arguments]),
                     r.output.map((i) => [i.type, i.name, i.arguments]));
    assert.ok(st.events.some((e) => e.type === 'response.function_call_arguments.delta'));
  }
  assert.ok(calls > 0, 'some answers made calls within 120 tokens');
  // a named tool
  const r = await client.responses.create({ model, input: user, tools, tool_choice: { type: 'function', name: 'add' },
                                            max_output_tokens: 120, temperature: 1, seed: 4 });
  checkResponse(r);
  for (const item of r.output.filter((i) => i.type === 'function_call')) assert.equal(item.name, 'add');
  assert.deepEqual(r.tool_choice, { type: 'function', name: 'add' });
  assert.equal(r.tools.length, 2);
});

test('a conversation of items is the chat conversation it stands for', async () => {
  const items = [
    { role: 'developer', content: 'You check the weather.' },
    { role: 'user', content: user },
    { type: 'reasoning', id: 'rs_1', summary: [] },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Let me look.' }] },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris","unit":"c"}' },
    { type: 'function_call', call_id: 'call_2', name: 'add', arguments: '{"a":2,"b":3}' },
    { type: 'function_call_output', call_id: 'call_1', output: '{"temp":21}' },
    { type: 'function_call_output', call_id: 'call_2', output: '5' },
  ];
  const messages = [
    { role: 'system', content: 'You check the weather.' },
    { role: 'user', content: user },
    { role: 'assistant', content: 'Let me look.', tool_calls: [
      { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","unit":"c"}' } },
      { id: 'call_2', type: 'function', function: { name: 'add', arguments: '{"a":2,"b":3}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp":21}' },
    { role: 'tool', tool_call_id: 'call_2', content: '5' },
  ];
  for (const seed of [1, 2]) {
    const r = await client.responses.create({ model, input: items, tools, max_output_tokens: 16, temperature: 1, seed });
    checkResponse(r);
    const c = await chatOf(messages, { tools: chatTools, max_tokens: 16, temperature: 1, seed });
    assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
    assert.equal(r.output_text, c.choices[0].message.content ?? '');
  }
});

test('text.format json_schema: the text is JSON that fits', async () => {
  const schema = { type: 'object', required: ['n'], additionalProperties: false,
                   properties: { n: { type: 'integer', minimum: 0, maximum: 9 } } };
  let done = 0;
  for (const seed of [1, 2, 3]) {
    const r = await client.responses.create({ model, input: user, max_output_tokens: 30, temperature: 1, seed,
                                              text: { format: { type: 'json_schema', name: 'n', schema, strict: true } } });
    checkResponse(r);
    assert.equal(r.text.format.type, 'json_schema');
    if (r.status !== 'completed') continue;
    const v = JSON.parse(r.output_text);
    assert.deepEqual(Object.keys(v), ['n']);
    assert.ok(Number.isInteger(v.n) && v.n >= 0 && v.n <= 9);
    done++;
  }
  assert.ok(done > 0);
});

test('top_logprobs: the chat completion\'s, entry for entry', async () => {
  const r = await client.responses.create({ model, input: user, max_output_tokens: 6, temperature: 1, seed: 3,
                                            top_logprobs: 3, include: ['message.output_text.logprobs'] });
  const c = await chatOf([{ role: 'user', content: user }], { max_tokens: 6, temperature: 1, seed: 3, logprobs: true, top_logprobs: 3 });
  const a = r.output[0].content[0].logprobs, b = c.choices[0].logprobs.content;
  assert.equal(r.top_logprobs, 3);
  assert.equal(a.length, b.length);
  for (let i = 0; i < a.length; i++) {
    assert.equal(a[i].token, b[i].token);
    assert.deepEqual(a[i].bytes, b[i].bytes);
    assert.ok(Math.abs(a[i].logprob - b[i].logprob) < 1e-5);
    assert.deepEqual(a[i].top_logprobs.map((t) => t.token), b[i].top_logprobs.map((t) => t.token));
  }
});

test('what is not served is a 400 naming the field; the server goes on', async () => {
  const img = 'data:image/png;base64,iVBORw0KGgo=';
  for (const [body, param] of [
    [{ previous_response_id: 7 }, 'previous_response_id'],
    [{ background: true }, 'background'],
    [{ conversation: 'conv_1' }, 'conversation'],
    [{ include: ['file_search_call.results'] }, 'include'],
    [{ tools: [{ type: 'web_search' }] }, 'tools[0].type'],
    [{ tools, tool_choice: { type: 'file_search' } }, 'tool_choice'],
    [{ input: [] }, 'input'],
    [{ input: 7 }, 'input'],
    [{ input: [{ role: 'robot', content: 'x' }] }, 'input[0].role'],
    [{ input: [{ role: 'user', content: 'x' }, { type: 'web_search_call' }] }, 'input[1]'],
    [{ input: [{ type: 'item_reference', id: 'msg_1' }] }, 'input[0]'],
    [{ input: [{ role: 'user', content: [{ type: 'input_file', file_id: 'f' }] }] }, 'input[0].content[0]'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', file_id: 'f' }] }] }, 'input[0].content[0]'],
    [{ input: [{ role: 'user', content: [{ type: 'input_text', text: 'a' }, { type: 'input_image', image_url: img, detail: 'auto' }] }] }, 'input[0].content[1].image_url'],
    [{ input: [{ type: 'function_call', name: 'add', arguments: '{}' }] }, 'input[0].call_id'],
    [{ input: [{ type: 'function_call_output', call_id: 'nope', output: '1' }] }, 'input[0].call_id'],
    [{ max_output_tokens: 0 }, 'max_output_tokens'],
    [{ temperature: 9 }, 'temperature'],
    [{ text: { format: { type: 'json_schema', name: 'x' } } }, 'text.format'],
    [{ truncation: 'sometimes' }, 'truncation'],
    [{ reasoning: { effort: 'extreme' } }, 'reasoning.effort'],
  ]) {
    const r = await post('/v1/responses', { model, input: user, max_output_tokens: 4, ...body });
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.error.param, param, JSON.stringify(r.body));
    assert.ok(r.body.error.message.length > 0);
  }
  await assert.rejects(client.responses.create({ model, input: user, previous_response_id: 'resp_1' }),
                       (e) => e instanceof OpenAI.NotFoundError && e.param === 'previous_response_id');
  const bad = await fetch(root + '/v1/responses', { method: 'POST', body: '{"input": "x"',
                                                    headers: { Authorization: `Bearer ${apiKey}` } });
  assert.equal(bad.status, 400);
  const ok = await client.responses.create({ model, input: user, max_output_tokens: 2 });
  assert.equal(ok.usage.output_tokens, 2);
});

// what the store keeps of a response, as the client reads it back (create adds output_text)
function kept(r) {
  const { output_text, ...rest } = r;
  return rest;
}

test('previous_response_id goes on from a stored response, as the chat conversation would', async () => {
  const first = await client.responses.create({ model, input: user, instructions: 'Be brief.',
                                                max_output_tokens: 8, temperature: 1, seed: 7 });
  assert.equal(first.store, true);
  const next = await client.responses.create({ model, previous_response_id: first.id, input: 'And tomorrow?',
                                               max_output_tokens: 8, temperature: 1, seed: 8 });
  checkResponse(next);
  assert.equal(next.previous_response_id, first.id);
  // the instructions are the first request's own: they do not carry over
  const c = await chatOf([{ role: 'user', content: user }, { role: 'assistant', content: first.output_text },
                          { role: 'user', content: 'And tomorrow?' }], { max_tokens: 8, temperature: 1, seed: 8 });
  assert.equal(next.usage.input_tokens, c.usage.prompt_tokens);
  assert.equal(next.output_text, c.choices[0].message.content);
  // a third turn goes on from the second, the whole chain before it
  const third = await client.responses.create({ model, previous_response_id: next.id, input: 'Thanks.',
                                                max_output_tokens: 4, temperature: 1, seed: 9 });
  const c3 = await chatOf([{ role: 'user', content: user }, { role: 'assistant', content: first.output_text },
                           { role: 'user', content: 'And tomorrow?' }, { role: 'assistant', content: next.output_text },
                           { role: 'user', content: 'Thanks.' }], { max_tokens: 4, temperature: 1, seed: 9 });
  assert.equal(third.usage.input_tokens, c3.usage.prompt_tokens);
  assert.equal(third.output_text, c3.choices[0].message.content);
});

test('a stored call goes on with its outputs', async () => {
  let first;
  for (let seed = 1; seed < 20; seed++) {
    first = await client.responses.create({ model, input: user, tools, tool_choice: 'required',
                                            max_output_tokens: 120, temperature: 1, seed });
    if (first.status === 'completed') break;
  }
  const calls = first.output.filter((i) => i.type === 'function_call');
  assert.ok(calls.length >= 1);
  const outputs = calls.map((i, k) => ({ type: 'function_call_output', call_id: i.call_id, output: `${k}` }));
  const next = await client.responses.create({ model, previous_response_id: first.id, input: outputs, tools,
                                               max_output_tokens: 8, temperature: 1, seed: 3 });
  const c = await chatOf([{ role: 'user', content: user },
                          { role: 'assistant', content: null, tool_calls: calls.map((i) => (
                            { id: i.call_id, type: 'function', function: { name: i.name, arguments: i.arguments } })) },
                          ...calls.map((i, k) => ({ role: 'tool', tool_call_id: i.call_id, content: `${k}` }))],
                         { tools: chatTools, max_tokens: 8, temperature: 1, seed: 3 });
  assert.equal(next.usage.input_tokens, c.usage.prompt_tokens);
  assert.equal(next.output_text, c.choices[0].message.content ?? '');
});

test('a stored response is read back, its input items listed page by page, and deleted', async () => {
  const items = [{ role: 'user', content: 'one' }, { role: 'assistant', content: 'two' },
                 { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'three' }] }];
  const r = await client.responses.create({ model, input: items, max_output_tokens: 3 });
  assert.deepEqual(kept(await client.responses.retrieve(r.id)), kept(r));
  const desc = await client.responses.inputItems.list(r.id);
  assert.equal(desc.data.length, 3);
  assert.deepEqual(desc.data.map((i) => i.role), ['user', 'assistant', 'user']);
  assert.equal(desc.data[0].content[0].text, 'three'); // newest first by default
  const ids = desc.data.map((i) => i.id);
  assert.equal(new Set(ids).size, 3);
  const paged = [];
  for await (const item of client.responses.inputItems.list(r.id, { limit: 1, order: 'asc' })) paged.push(item.id);
  assert.deepEqual(paged, [...ids].reverse());
  // a streamed response is kept as its last event has it
  const st = await streamed({ model, input: user, max_output_tokens: 3, seed: 2 });
  assert.deepEqual(kept(await client.responses.retrieve(st.response.id)), st.response);
  await client.responses.delete(r.id);
  await assert.rejects(client.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
  // store: false keeps nothing
  const gone = await client.responses.create({ model, input: user, max_output_tokens: 2, store: false });
  assert.equal(gone.store, false);
  await assert.rejects(client.responses.retrieve(gone.id), (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(client.responses.create({ model, input: 'x', previous_response_id: gone.id }),
                       (e) => e instanceof OpenAI.NotFoundError);
});

test('truncation auto drops the fewest oldest turns that make the conversation fit', async () => {
  const maxLen = Number(process.env.LMSERVE_MAX_LEN);
  assert.ok(maxLen > 0, 'LMSERVE_MAX_LEN');
  const words = 'the quick brown fox jumps over the lazy dog and runs far away. '.repeat(8);
  const turns = [];
  for (let i = 0; i < 30; i++) turns.push({ role: 'user', content: `${i}: ${words}` }, { role: 'assistant', content: `ok ${i}` });
  turns.push({ role: 'user', content: 'Last question?' });
  const base = { model, instructions: 'Be brief.', input: turns, max_output_tokens: 16, temperature: 1, seed: 2 };
  const long = await post('/v1/responses', base);
  assert.equal(long.status, 400);
  assert.equal(long.body.error.param, 'input');
  const r = await client.responses.create({ ...base, truncation: 'auto' });
  checkResponse(r);
  assert.equal(r.truncation, 'auto');
  assert.ok(r.usage.input_tokens + 16 <= maxLen, `${r.usage.input_tokens}`);
  // the chat of the instructions and the newest turns: the first k dropped that fits
  const kept = (k) => [{ role: 'system', content: 'Be brief.' }, ...turns.slice(2 * k)];
  let k = 0, n = 0;
  for (; k < 30; k++) {
    const t = await post('/tokenize', { model, messages: kept(k) });
    assert.equal(t.status, 200);
    n = t.body.count;
    if (n + 16 <= maxLen) break;
  }
  assert.ok(k > 0 && k < 30, `${k} turns dropped`);
  assert.equal(r.usage.input_tokens, n);
  const c = await chatOf(kept(k), { max_tokens: 16, temperature: 1, seed: 2 });
  assert.equal(r.output_text, c.choices[0].message.content);
  // a last turn too long alone is still refused
  const huge = await post('/v1/responses', { model, input: words.repeat(40), truncation: 'auto', max_output_tokens: 4 });
  assert.equal(huge.status, 400);
  assert.equal(huge.body.error.param, 'input');
});
