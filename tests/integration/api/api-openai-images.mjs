// api-openai-images.mjs — the official `openai` npm client sends images to a
// running `lmserve serve` on a tiny Gemma 3 with a vision tower (started and
// always killed by test-api-images.c, which passes LMSERVE_URL, LMSERVE_MODEL,
// LMSERVE_IMAGE0 and LMSERVE_IMAGE (two data: URLs) and LMSERVE_EXPECT, the
// greedy text the same request gave over plain HTTP).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

import { streamChat } from './api-stream.mjs';

const baseURL = process.env.LMSERVE_URL;
const model = process.env.LMSERVE_MODEL;
const image0 = process.env.LMSERVE_IMAGE0;
const image1 = process.env.LMSERVE_IMAGE;
const expect = process.env.LMSERVE_EXPECT;
assert.ok(baseURL && model && image0 && image1 && expect !== undefined, 'environment');

const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120_000 });

const messages = [{
  role: 'user',
  content: [
    { type: 'text', text: 'Compare' },
    { type: 'image_url', image_url: { url: image0 } },
    { type: 'image_url', image_url: { url: image1, detail: 'auto' } },
    { type: 'text', text: 'Which is brighter?' },
  ],
}];

test('chat.completions.create with two images', async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 8, temperature: 0, ignore_eos: true,
  });
  assert.equal(r.choices[0].message.content, expect);
  assert.equal(r.usage.completion_tokens, 8);
  assert.ok(r.usage.prompt_tokens > 32, 'the image tokens count in prompt_tokens');
});

test('streamed, with usage', async () => {
  const { text, usage } = await streamChat(client, {
    model, messages, max_tokens: 8, temperature: 0, ignore_eos: true,
  });
  assert.equal(text, expect);
  assert.equal(usage.completion_tokens, 8);
});

test('a broken image is a BadRequestError naming its part', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model,
      messages: [{
        role: 'user',
        content: [
          { type: 'text', text: 'Look' },
          { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } },
        ],
      }],
      max_tokens: 4,
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 &&
      e.param === 'messages[0].content[1].image_url',
  );
});
