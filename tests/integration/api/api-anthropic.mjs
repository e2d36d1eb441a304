// api-anthropic.mjs — POST /v1/messages and /v1/messages/count_tokens (Anthropic's
// Messages API) through the official `@anthropic-ai/sdk` npm client, against
// `lmserve serve` on a random-weight tiny Gemma 4 with Gemma 4's tokenizer and chat
// format (started by test-api-openai.c with LMSERVE_URL, LMSERVE_KEY,
// LMSERVE_MODEL).
//
// The client's own machinery is the judge of the form: messages.create's answer,
// messages.stream, whose MessageStream rebuilds the message from the events (and
// throws on a delta for a block it has not seen), countTokens, and its error
// classes. What an answer holds is held to the chat completion of the same
// conversation, the same seed: the Messages request must be that chat request
// underneath, block for block. Where a test needs a thought or a call, a grammar
// that names Gemma 4's special tokens makes it happen. The client sends its key as
// X-Api-Key, which the server must take.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';

import { apiKey, client, model, root, thoughtGrammar } from './api-lib.mjs';

const anthropic = new Anthropic({ baseURL: root, apiKey, maxRetries: 0, timeout: 120_000 });

const weatherSchema = {
  type: 'object', required: ['city', 'unit'], additionalProperties: false,
  properties: { city: { type: 'string', maxLength: 8 }, unit: { enum: ['c', 'f'] } },
};
const addSchema = {
  type: 'object', required: ['a', 'b'], additionalProperties: false,
  properties: { a: { type: 'integer' }, b: { type: 'integer' } },
};
// the same tools in the two APIs' forms
const tools = [
  { name: 'get_weather', description: 'The weather in a city', input_schema: weatherSchema },
  { name: 'add', description: 'Adds two numbers', input_schema: addSchema },
];
const chatTools = tools.map(({ name, description, input_schema }) => (
  { type: 'function', function: { name, description, parameters: input_schema } }));

const user = 'What is the weather in Paris?';

function checkMessage(m) {
  assert.match(m.id, /^msg_[0-9a-f]+$/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, model);
  assert.ok(['end_turn', 'max_tokens', 'stop_sequence', 'tool_use'].includes(m.stop_reason), m.stop_reason);
  if (m.stop_reason !== 'stop_sequence') assert.equal(m.stop_sequence, null);
  const u = m.usage;
  for (const k of ['input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'])
    assert.ok(Number.isInteger(u[k]) && u[k] >= 0, k);
  assert.ok(m.content.length >= 1);
  for (const b of m.content) {
    if (b.type === 'tool_use') {
      assert.match(b.id, /^toolu_/);
      assert.equal(typeof b.input, 'object');
    } else if (b.type === 'thinking') {
      assert.equal(typeof b.signature, 'string');
    } else {
      assert.equal(b.type, 'text');
    }
  }
}

const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
// the prompt's tokens, as Anthropic counts them: those read from the cache apart
const inputOf = (m) => m.usage.input_tokens + m.usage.cache_read_input_tokens;

// The chat completion the Messages request stands for.
async function chatOf(messages, extra) {
  return client.chat.completions.create({ model, messages, ...extra });
}

const stopReason = { stop: 'end_turn', length: 'max_tokens', tool_calls: 'tool_use' };

// messages.stream's events checked as they come, and its final message
async function streamed(params) {
  const s = anthropic.messages.stream(params);
  const events = [];
  for await (const e of s) events.push(e);
  const final = await s.finalMessage();
  // (the client builds the final message in message_start's object: its content and
  // stop reason are not what the event said by now)
  assert.equal(events[0].type, 'message_start');
  assert.equal(events[0].message.id, final.id);
  assert.equal(events.at(-1).type, 'message_stop');
  assert.equal(events.at(-2).type, 'message_delta');
  // blocks one at a time, numbered in order
  let open = -1, next = 0;
  for (const e of events.slice(1, -2)) {
    if (e.type === 'ping') continue;
    if (e.type === 'content_block_start') {
      assert.equal(open, -1);
      assert.equal(e.index, next++);
      open = e.index;
    } else {
      assert.equal(e.index, open, e.type);
      if (e.type === 'content_block_stop') open = -1;
    }
  }
  assert.equal(open, -1);
  assert.equal(next, final.content.length);
  checkMessage(final);
  return { events, final };
}

test('text in, text out: the chat completion of the same turn, with usage', async () => {
  for (const seed of [1, 2]) {
    const m = await anthropic.messages.create({
      model, max_tokens: 12, system: 'Be brief.', messages: [{ role: 'user', content: user }],
      temperature: 1, seed,
    });
    checkMessage(m);
    const c = await chatOf([{ role: 'system', content: 'Be brief.' }, { role: 'user', content: user }],
                           { max_tokens: 12, temperature: 1, seed });
    assert.equal(m.content.length, 1);
    assert.equal(textOf(m), c.choices[0].message.content);
    assert.equal(m.stop_reason, stopReason[c.choices[0].finish_reason]);
    assert.equal(inputOf(m), c.usage.prompt_tokens);
    assert.equal(m.usage.output_tokens, c.usage.completion_tokens);
    // the system prompt as text blocks, the turn as a text block: the same request
    const b = await anthropic.messages.create({
      model, max_tokens: 12, system: [{ type: 'text', text: 'Be ' }, { type: 'text', text: 'brief.' }],
      messages: [{ role: 'user', content: [{ type: 'text', text: user }] }], temperature: 1, seed,
    });
    assert.equal(textOf(b), textOf(m));
    assert.equal(inputOf(b), inputOf(m));
  }
});

test('streamed: the events rebuild the same message', async () => {
  const params = { model, max_tokens: 10, messages: [{ role: 'user', content: user }], temperature: 1, seed: 5 };
  const whole = await anthropic.messages.create(params);
  const { final, events } = await streamed(params);
  assert.deepEqual(final.content, whole.content);
  assert.equal(final.stop_reason, whole.stop_reason);
  assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  assert.equal(inputOf(final), inputOf(whole));
  const deltas = events.filter((e) => e.type === 'content_block_delta' && e.delta.type === 'text_delta');
  assert.ok(deltas.length >= 2, 'the text comes in pieces');
});

test('stop_sequences: the text ends before the sequence, which the answer names', async () => {
  const params = { model, max_tokens: 16, messages: [{ role: 'user', content: user }], temperature: 1, seed: 3 };
  const whole = textOf(await anthropic.messages.create(params));
  assert.ok([...whole].length >= 6, whole);
  const seq = [...whole].slice(3, 5).join(''), cut = whole.slice(0, whole.indexOf(seq));
  const m = await anthropic.messages.create({ ...params, stop_sequences: [seq, 'never said'] });
  checkMessage(m);
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, seq);
  assert.equal(textOf(m), cut);
  const { final, events } = await streamed({ ...params, stop_sequences: [seq] });
  assert.equal(final.stop_reason, 'stop_sequence');
  assert.equal(final.stop_sequence, seq);
  assert.equal(textOf(final), cut);
  assert.equal(events.at(-2).delta.stop_sequence, seq);
});

test('thinking: the thought is a thinking block, streamed with its signature', async () => {
  const grammar = await thoughtGrammar();
  for (const seed of [0, 1]) {
    const params = { model, max_tokens: 40, messages: [{ role: 'user', content: user }], temperature: 1, seed,
                     structured_outputs: { grammar } };
    const m = await anthropic.messages.create(params);
    checkMessage(m);
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
    assert.match(m.content[0].thinking, /^[a-z ]{1,12}$/);
    assert.match(m.content[1].text, /^done[0-9]{1,3}$/);
    const c = await chatOf([{ role: 'user', content: user }],
                           { max_tokens: 40, temperature: 1, seed, structured_outputs: { grammar } });
    assert.equal(m.content[0].thinking, c.choices[0].message.reasoning);
    assert.equal(m.content[1].text, c.choices[0].message.content);
    const { final, events } = await streamed(params);
    assert.deepEqual(final.content, m.content);
    assert.ok(events.some((e) => e.type === 'content_block_delta' && e.delta.type === 'thinking_delta'));
    assert.ok(events.some((e) => e.type === 'content_block_delta' && e.delta.type === 'signature_delta'));
  }
});

test('thinking.type enabled turns Gemma 4 thinking on in the prompt', async () => {
  const messages = [{ role: 'user', content: user }];
  const on = await anthropic.messages.countTokens({ model, messages, thinking: { type: 'enabled', budget_tokens: 1024 } });
  const off = await anthropic.messages.countTokens({ model, messages, thinking: { type: 'disabled' } });
  const c = await chatOf(messages, { max_tokens: 1, chat_template_kwargs: { enable_thinking: true } });
  assert.equal(on.input_tokens, c.usage.prompt_tokens);
  assert.notEqual(on.input_tokens, off.input_tokens);
  const m = await anthropic.messages.create({ model, messages, max_tokens: 4, thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(inputOf(m), on.input_tokens);
});

function checkCall(b) {
  if (b.name === 'get_weather') {
    assert.deepEqual(Object.keys(b.input).sort(), ['city', 'unit']);
    assert.ok([...b.input.city].length <= 8, b.input.city);
    assert.ok(['c', 'f'].includes(b.input.unit));
  } else {
    assert.equal(b.name, 'add');
    assert.deepEqual(Object.keys(b.input).sort(), ['a', 'b']);
    assert.ok(Number.isInteger(b.input.a) && Number.isInteger(b.input.b));
  }
}

test('tools: calls are tool_use blocks, streamed the same', async () => {
  let calls = 0;
  for (const seed of [1, 2, 3]) {
    const params = { model, max_tokens: 120, messages: [{ role: 'user', content: user }], tools,
                     tool_choice: { type: 'any' }, temperature: 1, seed };
    const m = await anthropic.messages.create(params);
    checkMessage(m);
    const c = await chatOf([{ role: 'user', content: user }],
                           { tools: chatTools, tool_choice: 'required', max_tokens: 120, temperature: 1, seed });
    const uses = m.content.filter((b) => b.type === 'tool_use');
    const cc = c.choices[0].message.tool_calls ?? [];
    assert.equal(m.stop_reason, stopReason[c.choices[0].finish_reason]);
    if (m.stop_reason !== 'tool_use') continue;
    assert.deepEqual(uses.map((b) => [b.name, b.input]), cc.map((t) => [t.function.name, JSON.parse(t.function.arguments)]));
    calls += uses.length;
    for (const b of uses) checkCall(b);
    const { final, events } = await streamed(params);
    assert.deepEqual(final.content.map((b) => [b.type, b.name, b.input]), m.content.map((b) => [b.type, b.name, b.input]));
    assert.ok(events.some((e) => e.type === 'content_block_delta' && e.delta.type === 'input_json_delta'));
  }
  assert.ok(calls > 0, 'some answers made calls within 120 tokens');
  // a named tool
  const m = await anthropic.messages.create({ model, max_tokens: 120, messages: [{ role: 'user', content: user }], tools,
                                              tool_choice: { type: 'tool', name: 'add' }, temperature: 1, seed: 4 });
  checkMessage(m);
  for (const b of m.content.filter((x) => x.type === 'tool_use')) assert.equal(b.name, 'add');
});

test('a conversation of tool_use and tool_result blocks is the chat conversation it stands for', async () => {
  const messages = [
    { role: 'user', content: user },
    { role: 'assistant', content: [
      { type: 'thinking', thinking: 'Two calls.', signature: '' },
      { type: 'text', text: 'Let me look.' },
      { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris', unit: 'c' } },
      { type: 'tool_use', id: 'toolu_2', name: 'add', input: { a: 2, b: 3 } }] },
    { role: 'user', content: [
      { type: 'tool_result', tool_use_id: 'toolu_1', content: '{"temp":21}' },
      { type: 'tool_result', tool_use_id: 'toolu_2', content: [{ type: 'text', text: '5' }] }] },
  ];
  const chat = [
    { role: 'user', content: user },
    { role: 'assistant', content: 'Let me look.', tool_calls: [
      { id: 'toolu_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","unit":"c"}' } },
      { id: 'toolu_2', type: 'function', function: { name: 'add', arguments: '{"a":2,"b":3}' } }] },
    { role: 'tool', tool_call_id: 'toolu_1', content: '{"temp":21}' },
    { role: 'tool', tool_call_id: 'toolu_2', content: '5' },
  ];
  for (const seed of [1, 2]) {
    const m = await anthropic.messages.create({ model, max_tokens: 16, messages, tools, temperature: 1, seed });
    checkMessage(m);
    const c = await chatOf(chat, { tools: chatTools, max_tokens: 16, temperature: 1, seed });
    assert.equal(inputOf(m), c.usage.prompt_tokens);
    assert.equal(textOf(m), c.choices[0].message.content ?? '');
  }
  const n = await anthropic.messages.countTokens({ model, messages, tools });
  const c = await chatOf(chat, { tools: chatTools, max_tokens: 1 });
  assert.equal(n.input_tokens, c.usage.prompt_tokens);
});

test('output_format json_schema: the text is JSON that fits', async () => {
  const schema = { type: 'object', required: ['n'], additionalProperties: false,
                   properties: { n: { type: 'integer', minimum: 0, maximum: 9 } } };
  let done = 0;
  for (const seed of [1, 2, 3]) {
    const m = await anthropic.messages.create({ model, max_tokens: 30, messages: [{ role: 'user', content: user }],
                                                temperature: 1, seed, output_format: { type: 'json_schema', schema } });
    checkMessage(m);
    if (m.stop_reason !== 'end_turn') continue;
    const v = JSON.parse(textOf(m));
    assert.deepEqual(Object.keys(v), ['n']);
    assert.ok(Number.isInteger(v.n) && v.n >= 0 && v.n <= 9);
    done++;
  }
  assert.ok(done > 0);
});

test('errors come in Anthropic\'s envelope, as the client\'s error classes; the server goes on', async () => {
  const base = { model, max_tokens: 4, messages: [{ role: 'user', content: user }] };
  for (const body of [
    { messages: [] },
    { max_tokens: 0 },
    { messages: [{ role: 'system', content: 'x' }] },
    { messages: [{ role: 'user', content: [{ type: 'document', source: {} }] }] },
    { tools: [{ type: 'web_search_20250305', name: 'web_search' }] },
    { tool_choice: { type: 'tool' } },
    { thinking: { type: 'enabled', budget_tokens: 5 } },
    { temperature: 9 },
  ]) {
    await assert.rejects(anthropic.messages.create({ ...base, ...body }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError, `${JSON.stringify(body)}: ${e}`);
      assert.equal(e.error.type, 'error');
      assert.equal(e.error.error.type, 'invalid_request_error');
      assert.ok(e.error.error.message.length > 0);
      return true;
    });
  }
  await assert.rejects(anthropic.messages.create({ ...base, model: 'claude-opus' }),
                       (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
  const wrong = new Anthropic({ baseURL: root, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrong.messages.create(base),
                       (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
  // the key as a bearer token works too, and a body that is not JSON is a 400 in the envelope
  const bad = await fetch(root + '/v1/messages', { method: 'POST', body: '{"model": "x"',
                                                   headers: { Authorization: `Bearer ${apiKey}` } });
  assert.equal(bad.status, 400);
  const eb = await bad.json();
  assert.equal(eb.type, 'error');
  assert.equal(eb.error.type, 'invalid_request_error');
  // a prompt longer than the model takes
  await assert.rejects(anthropic.messages.create({ ...base, messages: [{ role: 'user', content: 'a '.repeat(3000) }] }),
                       (e) => e instanceof Anthropic.BadRequestError && /context length/.test(e.error.error.message));
  const ok = await anthropic.messages.create(base);
  assert.equal(ok.usage.output_tokens, 4);
  assert.equal(ok.stop_reason, 'max_tokens');
});
