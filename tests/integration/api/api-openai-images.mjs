// api-openai-images.mjs — the official `openai` npm client sends images to a
// running `lmserve serve` on a tiny Gemma 3 with a vision tower (started and
// always killed by test-api-images.c, which passes LMSERVE_URL, LMSERVE_MODEL,
// LMSERVE_IMAGE0 and LMSERVE_IMAGE (two data: URLs) and LMSERVE_EXPECT, the
// greedy text the same request gave over plain HTTP).
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

import { brokenPartTest, greedyChatTests } from './api-stream.mjs';

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

greedyChatTests(test, client, model, messages, expect, 32, 'two images');

brokenPartTest(test, OpenAI, client, model,
  { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } }, 'image');
