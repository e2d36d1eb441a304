// api-openai-audio.mjs — the official `openai` npm client sends an audio clip
// to a running `lmserve serve` on the tiny Gemma 4 with an audio tower
// (started and always killed by test-api-audio-g4.c, which passes LMSERVE_URL,
// LMSERVE_MODEL, LMSERVE_AUDIO (a float WAV in base64), LMSERVE_TEXT (the
// words before it) and LMSERVE_EXPECT, the greedy text the same request gave
// over plain HTTP), and LMSERVE_TRANSCRIPT, what /v1/audio/transcriptions
// answered for the clip over plain HTTP (temperature 0, 8 tokens at most).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI, { toFile } from 'openai';

import { brokenPartTest, greedyChatTests } from './api-stream.mjs';

const baseURL = process.env.LMSERVE_URL;
const model = process.env.LMSERVE_MODEL;
const data = process.env.LMSERVE_AUDIO;
const text = process.env.LMSERVE_TEXT;
const expect = process.env.LMSERVE_EXPECT;
const transcript = process.env.LMSERVE_TRANSCRIPT;
assert.ok(baseURL && model && data && text && expect !== undefined && transcript !== undefined,
  'environment');

const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120_000 });

const messages = [{
  role: 'user',
  content: [
    { type: 'text', text },
    { type: 'input_audio', input_audio: { data, format: 'wav' } },
    { type: 'text', text: 'What is heard?' },
  ],
}];

greedyChatTests(test, client, model, messages, expect, 25, 'a clip');

brokenPartTest(test, OpenAI, client, model,
  { type: 'input_audio', input_audio: { data: 'UklGRiQAAABXQVZF', format: 'wav' } }, 'clip');

// The clip as an uploaded file, as an application hands one to the client.
const clipFile = () => toFile(Buffer.from(data, 'base64'), 'clip.wav', { type: 'audio/wav' });

test('audio.transcriptions.create: the text, as JSON and as text', async () => {
  // max_completion_tokens is vLLM's field; the client sends what it is given
  const r = await client.audio.transcriptions.create({
    file: await clipFile(), model, temperature: 0, max_completion_tokens: 8,
  });
  assert.equal(r.text, transcript);
  assert.equal(r.usage?.type, 'tokens');
  assert.ok(r.usage.input_tokens > 25 && r.usage.output_tokens >= 1);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  const t = await client.audio.transcriptions.create({
    file: await clipFile(), model, temperature: 0, max_completion_tokens: 8,
    response_format: 'text',
  });
  assert.equal(t, transcript);
});

test('audio.transcriptions.create: streamed, the deltas add up to the done event\'s text', async () => {
  const stream = await client.audio.transcriptions.create({
    file: await clipFile(), model, temperature: 0, max_completion_tokens: 8, stream: true,
  });
  let text = '';
  let done = null;
  for await (const ev of stream) {
    if (ev.type === 'transcript.text.delta') {
      assert.equal(done, null);
      text += ev.delta;
    } else {
      assert.equal(ev.type, 'transcript.text.done');
      done = ev;
    }
  }
  assert.equal(text, transcript);
  assert.equal(done?.text, transcript);
  assert.equal(done.usage.type, 'tokens');
});

test('audio.transcriptions.create: a language it does not know is a BadRequestError', async () => {
  await assert.rejects(
    client.audio.transcriptions.create({ file: await clipFile(), model, language: 'zz' }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'language');
});
