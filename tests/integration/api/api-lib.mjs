// api-lib.mjs — what the openai-client scripts share: the server they run against
// (LMSERVE_URL, LMSERVE_KEY, LMSERVE_MODEL, set by test-api-openai.c), the client,
// a raw POST, and Gemma 4's special tokens as the server's tokenizer has them.
import assert from 'node:assert/strict';

import OpenAI from 'openai';

export const baseURL = process.env.LMSERVE_URL;
export const apiKey = process.env.LMSERVE_KEY;
export const model = process.env.LMSERVE_MODEL;
assert.ok(baseURL && apiKey && model, 'LMSERVE_URL, _KEY, _MODEL');
export const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
export const root = baseURL.replace(/\/v1$/, '');

// POST path with a JSON body: the status and the JSON answer
export async function post(path, body) {
  const r = await fetch(root + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

// the id of a special token, from the server's own tokenizer
export async function tokenId(text) {
  const r = await post('/tokenize', { model, prompt: text, add_special_tokens: false });
  assert.equal(r.status, 200);
  assert.equal(r.body.tokens.length, 1, `${text} is one token`);
  return r.body.tokens[0];
}

// a grammar that makes Gemma 4 think, then answer: a thought of 1-12 letters and
// spaces, then "done" and 1-3 digits
export async function thoughtGrammar() {
  const open = await tokenId('<|channel>'), close = await tokenId('<channel|>');
  return `root ::= <[${open}]> "thought\\n" [a-z ]{1,12} <[${close}]> "done" [0-9]{1,3}`;
}
