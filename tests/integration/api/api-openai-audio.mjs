// api-openai-audio.mjs — the official `openai` npm client sends an audio clip
// to a running `lmserve serve` on the tiny Gemma 4 with an audio tower
// (started and always killed by test-api-audio-g4.c, which passes LMSERVE_URL,
// LMSERVE_MODEL, LMSERVE_AUDIO (a float WAV in base64), LMSERVE_TEXT (the
// words before it) and LMSERVE_EXPECT, the greedy text the same request gave
// over plain HTTP).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

import { brokenPartTest, greedyChatTests } from './api-stream.mjs';

const baseURL = process.env.LMSERVE_URL;
const model = process.env.LMSERVE_MODEL;
const data = process.env.LMSERVE_AUDIO;
const text = process.env.LMSERVE_TEXT;
const expect = process.env.LMSERVE_EXPECT;
assert.ok(baseURL && model && data && text && expect !== undefined, 'environment');

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
