// api-openai.mjs — the official `openai` npm client against a running
// `lmserve serve` (started and always killed by test-api-openai.c, which
// passes LMSERVE_URL, LMSERVE_KEY, LMSERVE_MODEL and LMSERVE_MAX_LEN). It
// lists models, completes, chats, streams with usage, samples n > 1 with a
// seed, and gets the SDK's exception class for each refused request.
// Plain `node api-openai.mjs`; node:test sets a non-zero exit on failure.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

import { streamChat } from './api-stream.mjs';

const baseURL = process.env.LMSERVE_URL;
const apiKey = process.env.LMSERVE_KEY;
const model = process.env.LMSERVE_MODEL;
const maxLen = Number(process.env.LMSERVE_MAX_LEN);
assert.ok(baseURL && apiKey && model && maxLen > 0, 'LMSERVE_URL, _KEY, _MODEL, _MAX_LEN');

// no retries: a 5xx for a client mistake must show, not be retried away
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });

const messages = [{ role: 'user', content: 'Name three rivers.' }];

test('models.list lists the served model with its max_model_len', async () => {
  const ids = [];
  for await (const m of client.models.list()) {
    ids.push(m.id);
    assert.equal(m.object, 'model');
    if (m.id === model) assert.equal(m.max_model_len, maxLen);
  }
  assert.deepEqual(ids, [model]);
});

test('models.retrieve: the served model, and a 404 for another', async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, 'model');
  assert.equal(m.max_model_len, maxLen);
  await assert.rejects(client.models.retrieve('google/no-such-model'), OpenAI.NotFoundError);
});

test('completions.create', async () => {
  const r = await client.completions.create({
    model, prompt: 'The capital of France is', max_tokens: 6, temperature: 0, ignore_eos: true,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(typeof r.choices[0].text, 'string');
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 6);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 6);
});

test('chat.completions.create', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 5 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0 && r.usage.completion_tokens <= 5);
});

test('chat streamed with usage equals the non-streamed greedy answer', async () => {
  const req = { model, messages, max_tokens: 8, temperature: 0, ignore_eos: true };
  const whole = await client.chat.completions.create(req);
  const { text, usage, finish, chunks } = await streamChat(client, req);
  assert.ok(chunks >= 3);
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage?.completion_tokens, 8);
  assert.equal(usage?.prompt_tokens, whole.usage.prompt_tokens);
});

test('completions streamed with usage equal the non-streamed greedy answer', async () => {
  const req = { model, prompt: 'Once upon a time', max_tokens: 7, temperature: 0, ignore_eos: true };
  const whole = await client.completions.create(req);
  const stream = await client.completions.create({
    ...req, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices ?? []) text += c.text;
  }
  assert.equal(text, whole.choices[0].text);
  assert.equal(usage?.completion_tokens, 7);
});

test('n > 1 with a seed repeats', async () => {
  const req = {
    model, messages, max_tokens: 6, temperature: 1.0, n: 3, seed: 99, ignore_eos: true,
  };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices.length, 3);
  const texts = (r) => [...r.choices].sort((x, y) => x.index - y.index).map((c) => c.message.content);
  assert.deepEqual(texts(b), texts(a));
  assert.deepEqual([...a.choices].map((c) => c.index).sort(), [0, 1, 2]);
  assert.ok(new Set(texts(a)).size > 1, 'three samples are not all the same');
});

// Runs a request that must fail; returns the error after checking its class.
async function refused(cls, fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `want ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`);
    return e;
  }
  assert.fail(`want ${cls.name}, the request succeeded`);
}

test('bad requests raise BadRequestError with the param', async () => {
  let e = await refused(OpenAI.BadRequestError, () =>
    client.completions.create({ model, prompt: 'hi', top_p: 2 }));
  assert.equal(e.status, 400);
  assert.equal(e.param, 'top_p');
  e = await refused(OpenAI.BadRequestError, () =>
    client.chat.completions.create({ model, messages, max_tokens: -1 }));
  assert.equal(e.param, 'max_tokens');
  e = await refused(OpenAI.BadRequestError, () =>
    client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] }));
  assert.equal(e.status, 400);
  e = await refused(OpenAI.BadRequestError, () =>
    client.completions.create({ model, prompt: 'hi', temperature: 'hot' }));
  assert.equal(e.param, 'temperature');
  // streamed requests are refused before the stream starts
  e = await refused(OpenAI.BadRequestError, () =>
    client.completions.create({ model, prompt: 'hi', n: 0, stream: true }));
  assert.equal(e.param, 'n');
});

test('a prompt past max_model_len is a BadRequestError naming both numbers', async () => {
  const prompt = Array.from({ length: maxLen }, (_, i) => `word${i}`).join(' ');
  const e = await refused(OpenAI.BadRequestError, () =>
    client.completions.create({ model, prompt, max_tokens: 4 }));
  assert.equal(e.param, 'prompt');
  assert.match(e.message, new RegExp(`\\b${maxLen}\\b`));
  const n = e.message.match(/\b(\d+)\b/g).map(Number).filter((x) => x > maxLen);
  assert.ok(n.length > 0, `the prompt's length in: ${e.message}`);
});

test('an unknown model raises NotFoundError', async () => {
  const e = await refused(OpenAI.NotFoundError, () =>
    client.chat.completions.create({ model: 'gpt-4o', messages }));
  assert.equal(e.status, 404);
  assert.equal(e.param, 'model');
});

test('a wrong or missing key raises AuthenticationError', async () => {
  const wrong = new OpenAI({ baseURL, apiKey: 'not-the-key', maxRetries: 0 });
  const e = await refused(OpenAI.AuthenticationError, () => wrong.models.list());
  assert.equal(e.status, 401);
  await refused(OpenAI.AuthenticationError, () =>
    wrong.chat.completions.create({ model, messages, stream: true }));
  await refused(OpenAI.AuthenticationError, () =>
    wrong.completions.create({ model, prompt: 'hi' }));
});

test('the server still serves after the refusals', async () => {
  const r = await client.completions.create({ model, prompt: 'hi', max_tokens: 2 });
  assert.equal(r.choices.length, 1);
});
