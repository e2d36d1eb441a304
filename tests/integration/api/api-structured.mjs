// api-structured.mjs — structured outputs through the official `openai` npm
// client against a running `lmserve serve` on a random-weight tiny model (started
// by test-api-openai.c with LMSERVE_URL, LMSERVE_KEY, LMSERVE_MODEL). A random
// model wanders every path a grammar leaves open, so each finished output is
// checked by an oracle that is not ours: JavaScript's own RegExp for regexes,
// JSON.parse for JSON, plain comparisons for choices and schema constraints.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import OpenAI from 'openai';

const baseURL = process.env.LMSERVE_URL;
const apiKey = process.env.LMSERVE_KEY;
const model = process.env.LMSERVE_MODEL;
assert.ok(baseURL && apiKey && model, 'LMSERVE_URL, _KEY, _MODEL');
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });

const SEEDS = [1, 2, 3, 4, 5, 6];
const whole = (p) => new RegExp(`^(?:${p})$`, 'u');

const REGEXES = [
  '[0-9]{3}-[a-z]{2,5}',
  '(yes|no|maybe)',
  '\\d{4}-\\d{2}-\\d{2}',
  '[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8}){0,2}',
  '[αβγ]{2,4}é?',
  '(0|[1-9][0-9]{0,3})(\\.[0-9]{1,2})?',
  '"[^"\\\\]{0,12}"',
];

test('structured_outputs.regex: every completion matches (RegExp with the u flag)', async () => {
  for (const p of REGEXES) {
    for (const seed of SEEDS) {
      const r = await client.completions.create({
        model, prompt: 'Answer:', max_tokens: 60, temperature: 1, seed,
        structured_outputs: { regex: p },
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', `${p} seed ${seed}: ${JSON.stringify(c.text)}`);
      assert.ok(whole(p).test(c.text), `${p} seed ${seed}: ${JSON.stringify(c.text)}`);
    }
  }
});

test('guided_regex on chat, and the same text streamed', async () => {
  const p = '[a-z]{3,6}(, [a-z]{3,6}){1,3}';
  for (const seed of SEEDS.slice(0, 3)) {
    const body = {
      model, messages: [{ role: 'user', content: 'List some words.' }], max_tokens: 60,
      temperature: 1, seed, guided_regex: p,
    };
    const r = await client.chat.completions.create(body);
    const text = r.choices[0].message.content;
    assert.ok(whole(p).test(text), JSON.stringify(text));
    let streamed = '';
    for await (const ch of await client.chat.completions.create({ ...body, stream: true }))
      streamed += ch.choices[0]?.delta?.content ?? '';
    assert.equal(streamed, text);
  }
});

test('choices: structured_outputs.choice and guided_choice', async () => {
  const choices = ['red', 'green', 'blue', 'ultraviolet', 'día'];
  const seen = new Set();
  for (const seed of [...SEEDS, 7, 8, 9, 10]) {
    const r = await client.completions.create({
      model, prompt: 'Pick a color:', max_tokens: 20, temperature: 1, seed,
      ...(seed % 2 ? { structured_outputs: { choice: choices } } : { guided_choice: choices }),
    });
    assert.ok(choices.includes(r.choices[0].text), JSON.stringify(r.choices[0].text));
    assert.equal(r.choices[0].finish_reason, 'stop');
    seen.add(r.choices[0].text);
  }
  assert.ok(seen.size > 1, 'a random model at temperature 1 picks more than one choice');
});

test('response_format json_object: finished outputs are JSON objects', async () => {
  let finished = 0;
  for (const seed of [...SEEDS, 7, 8, 9, 10, 11, 12]) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Give me JSON.' }], max_tokens: 120,
      temperature: 1, seed, response_format: { type: 'json_object' },
    });
    const c = r.choices[0];
    const text = c.message.content;
    assert.ok(text.trimStart().startsWith('{'), JSON.stringify(text));
    if (c.finish_reason !== 'stop') continue;
    finished++;
    const v = JSON.parse(text);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v), text);
  }
  console.log(`json_object: ${finished} of 12 outputs finished within 120 tokens`);
});

test('response_format json_schema: finished outputs follow the schema', async () => {
  const schema = {
    type: 'object',
    properties: {
      id: { type: 'integer', minimum: 0, maximum: 999 },
      tag: { enum: ['alpha', 'beta', 'gamma'] },
      ok: { type: 'boolean' },
    },
    required: ['id', 'tag', 'ok'],
    additionalProperties: false,
  };
  for (const seed of SEEDS) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Describe it.' }], max_tokens: 80,
      temperature: 1, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'thing', schema } },
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(c.message.content));
    const v = JSON.parse(c.message.content);
    assert.deepEqual(Object.keys(v).sort(), ['id', 'ok', 'tag']);
    assert.ok(Number.isInteger(v.id) && v.id >= 0 && v.id <= 999, c.message.content);
    assert.ok(['alpha', 'beta', 'gamma'].includes(v.tag), c.message.content);
    assert.equal(typeof v.ok, 'boolean');
  }
});

test('structured_outputs.grammar (GBNF): outputs are sentences of the grammar', async () => {
  const grammar = 'root ::= greeting " " name "!"\ngreeting ::= "hello" | "hi" | "hey"\n' +
    'name ::= [A-Z] [a-z]{1,6}';
  const re = /^(hello|hi|hey) [A-Z][a-z]{1,6}!$/u;
  for (const seed of SEEDS) {
    const r = await client.completions.create({
      model, prompt: 'Greet:', max_tokens: 30, temperature: 1, seed,
      ...(seed % 2 ? { structured_outputs: { grammar } } : { guided_grammar: grammar }),
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.ok(re.test(r.choices[0].text), JSON.stringify(r.choices[0].text));
  }
});

test('bad constraints are 400s naming the field', async () => {
  const cases = [
    [{ structured_outputs: { regex: 'a(b' } }, 'structured_outputs.regex'],
    [{ guided_regex: '(?<=a)b' }, 'guided_regex'],
    [{ structured_outputs: { choice: [] } }, 'structured_outputs.choice'],
    [{ guided_choice: ['a', 7] }, 'guided_choice'],
    [{ guided_grammar: 'root ::= "a' }, 'guided_grammar'],
    [{ structured_outputs: { regex: 'a', choice: ['a'] } }, 'structured_outputs'],
    [{ response_format: { type: 'json_object' }, guided_regex: 'a' }, 'guided_regex'],
    [{ response_format: { type: 'xml' } }, 'response_format.type'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x',
        schema: { type: 'array', uniqueItems: true } } } }, 'response_format.json_schema.schema'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(
      client.completions.create({ model, prompt: 'x', max_tokens: 4, ...extra }),
      (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(extra)}: ${e}`);
        assert.ok(e.param.startsWith(param), `${JSON.stringify(extra)}: param ${e.param}`);
        return true;
      });
  }
  // the unsupported keyword is named, with where it is
  await assert.rejects(client.completions.create({
    model, prompt: 'x', max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'object', properties: { t: { type: 'array', uniqueItems: true } } } } },
  }), (e) => e instanceof OpenAI.BadRequestError && /uniqueItems/.test(e.message) &&
    /properties\/t/.test(e.message));
});
