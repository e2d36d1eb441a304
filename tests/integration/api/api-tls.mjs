// api-tls.mjs — the official `openai` npm client against `lmserve serve` over
// HTTPS with a certificate from a CA made for the test (started and always
// killed by test-api-tls.c, which passes LMSERVE_URL, LMSERVE_KEY and
// LMSERVE_MODEL, and the CA in NODE_EXTRA_CA_CERTS). It lists models,
// completes, chats, and streams a chat that must equal the greedy answer.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

import { streamChat } from './api-stream.mjs';

const baseURL = process.env.LMSERVE_URL;
const apiKey = process.env.LMSERVE_KEY;
const model = process.env.LMSERVE_MODEL;
assert.ok(baseURL && baseURL.startsWith('https://') && apiKey && model,
  'LMSERVE_URL (https), _KEY, _MODEL');
assert.ok(process.env.NODE_EXTRA_CA_CERTS, 'NODE_EXTRA_CA_CERTS: the test CA');

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
const messages = [{ role: 'user', content: 'Name three rivers.' }];

test('models.list over HTTPS', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [model]);
});

test('completions.create over HTTPS', async () => {
  const r = await client.completions.create({
    model, prompt: 'The capital of France is', max_tokens: 6, temperature: 0, ignore_eos: true,
  });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 6);
});

test('chat streamed over HTTPS equals the non-streamed greedy answer', async () => {
  const req = { model, messages, max_tokens: 8, temperature: 0, ignore_eos: true };
  const whole = await client.chat.completions.create(req);
  const { text, usage, chunks } = await streamChat(client, req);
  assert.ok(chunks >= 2);
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(usage.completion_tokens, 8);
});

test('a wrong key over HTTPS is the SDK\'s AuthenticationError', async () => {
  const bad = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), OpenAI.AuthenticationError);
});
