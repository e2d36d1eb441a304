// api-gemma4.mjs — Gemma 4's thinking channel and native tool calls through the
// official `openai` npm client, against `lmserve serve` on a random-weight tiny
// Gemma 4 with Gemma 4's tokenizer and chat format (make-tiny-model --chat-format
// gemma4; started by test-api-openai.c with LMSERVE_URL, LMSERVE_KEY,
// LMSERVE_MODEL). The weights are random: where a test needs a thought or a call
// to happen, a grammar that names the special tokens (<[N]>) makes it happen,
// and every answer is checked for what the parser must give.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { client, model, post, thoughtGrammar, tokenId } from './api-lib.mjs';

const weather = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'The weather in a city',
    parameters: {
      type: 'object', required: ['city', 'unit'],
      properties: { city: { type: 'string', maxLength: 8 }, unit: { enum: ['c', 'f'] },
                    days: { type: 'integer' } },
    },
  },
};
const add = {
  type: 'function',
  function: {
    name: 'add', description: 'Adds two numbers',
    parameters: { type: 'object', required: ['a', 'b'],
                  properties: { a: { type: 'integer' }, b: { type: 'integer' },
                                exact: { type: 'boolean' } } },
  },
};
const tools = [weather, add];
const user = [{ role: 'user', content: 'What is the weather in Paris?' }];

function checkCall(c) {
  assert.equal(c.type, 'function');
  assert.match(c.id, /^call_/);
  const args = JSON.parse(c.function.arguments);
  if (c.function.name === 'get_weather') {
    assert.equal(typeof args.city, 'string');
    assert.ok([...args.city].length <= 8, `city ${args.city}`);
    assert.ok(['c', 'f'].includes(args.unit));
    if ('days' in args) assert.ok(Number.isInteger(args.days));
    assert.deepEqual(Object.keys(args).filter((k) => !['city', 'unit', 'days'].includes(k)), []);
  } else {
    assert.equal(c.function.name, 'add');
    assert.ok(Number.isInteger(args.a) && Number.isInteger(args.b));
    if ('exact' in args) assert.equal(typeof args.exact, 'boolean');
  }
  return args;
}

// a stream's deltas put together: content, reasoning, calls by index
async function collect(stream) {
  const out = { content: '', reasoning: '', calls: [], pieces: [], finish: null };
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    const d = ch.delta ?? {};
    if (d.content) {
      assert.ok(!d.content.includes('<|') && !d.content.includes('|>'), `content ${d.content}`);
      out.content += d.content;
    }
    if (d.reasoning) {
      assert.equal(d.reasoning_content, d.reasoning);
      out.reasoning += d.reasoning;
    }
    for (const c of d.tool_calls ?? []) {
      if (!out.calls[c.index]) { // a call's first delta: its id, type and name, once
        assert.ok(c.id && c.type === 'function' && c.function.name, JSON.stringify(c));
        out.calls[c.index] = { id: c.id, type: c.type, function: { name: c.function.name, arguments: '' } };
        out.pieces[c.index] = 0;
      } else {
        assert.ok(c.id === undefined && c.function.name === undefined, JSON.stringify(c));
      }
      out.calls[c.index].function.arguments += c.function.arguments ?? '';
      out.pieces[c.index]++;
    }
    if (ch.finish_reason) out.finish = ch.finish_reason;
  }
  return out;
}

test('chat_template_kwargs.enable_thinking reaches the template', async () => {
  const think = await tokenId('<|think|>');
  const open = await tokenId('<|channel>'), close = await tokenId('<channel|>');
  const on = await post('/tokenize', { model, messages: user, chat_template_kwargs: { enable_thinking: true } });
  assert.equal(on.status, 200);
  assert.ok(on.body.tokens.includes(think));
  assert.notEqual(on.body.tokens.at(-1), close);
  const off = await post('/tokenize', { model, messages: user, chat_template_kwargs: { enable_thinking: false } });
  assert.ok(!off.body.tokens.includes(think));
  // OpenAI's reasoning_effort says the same; the request's own kwargs win over it
  const high = await post('/tokenize', { model, messages: user, reasoning_effort: 'high' });
  assert.deepEqual(high.body.tokens, on.body.tokens);
  const none = await post('/tokenize', { model, messages: user, reasoning_effort: 'none' });
  assert.deepEqual(none.body.tokens, off.body.tokens);
  const both = await post('/tokenize', { model, messages: user, reasoning_effort: 'high',
                                         chat_template_kwargs: { enable_thinking: false } });
  assert.deepEqual(both.body.tokens, off.body.tokens);
  assert.equal(off.body.tokens.at(-1), close); // an empty thought after the generation prompt
  assert.ok(off.body.tokens.includes(open));
});

test('bad chat_template_kwargs and tool history are 400s naming the field', async () => {
  for (const [body, param] of [
    [{ chat_template_kwargs: [1] }, 'chat_template_kwargs'],
    [{ chat_template_kwargs: 'x' }, 'chat_template_kwargs'],
    [{ chat_template_kwargs: { enable_thinking: 'yes' } }, 'chat_template_kwargs.enable_thinking'],
    [{ reasoning_effort: 'max' }, 'reasoning_effort'],
    [{ messages: [...user, { role: 'tool', tool_call_id: 'nope', content: 'x' }] }, 'messages[1].tool_call_id'],
    [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name'],
  ]) {
    const r = await post('/v1/chat/completions', { model, messages: user, max_tokens: 4, ...body });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.equal(r.body.error.param, param);
  }
  // what the native notation's grammar cannot enforce, under required / named: a 400 naming
  // the keyword and where it is (never a call that breaks the schema)
  const withParams = (parameters) => [{ type: 'function', function: { name: 'f', parameters } }];
  for (const [parameters, what] of [
    [{ type: 'object', properties: { s: { type: 'string', pattern: '^[a-z]+$' } } },
     "keyword 'pattern' at tools[0].function.parameters/properties/s"],
    [{ type: 'object', properties: { n: { type: 'integer', minimum: 3 } } },
     "keyword 'minimum' at tools[0].function.parameters/properties/n"],
    [{ type: 'object', properties: { d: { type: 'string', format: 'date' } } }, "keyword 'format'"],
    [{ type: 'object', properties: { l: { type: 'array', items: { type: 'integer' }, maxItems: 2 } } },
     "keyword 'maxItems' at tools[0].function.parameters/properties/l"],
    [{ type: 'object', properties: { o: { enum: [{ a: 1 }] } } }, "keyword 'enum'"],
    [{ type: 'object', properties: { x: { oneOf: [{ type: 'integer' }, { type: 'number' }] } } },
     "keyword 'oneOf' at /properties/x"],
  ]) {
    for (const tool_choice of ['required', { type: 'function', function: { name: 'f' } }]) {
      const r = await post('/v1/chat/completions',
                           { model, messages: user, max_tokens: 4, tools: withParams(parameters), tool_choice });
      assert.equal(r.status, 400, JSON.stringify(parameters));
      assert.equal(r.body.error.param, 'tools[0].function.parameters', r.body.error.message);
      assert.ok(r.body.error.message.includes(what), r.body.error.message);
    }
  }
  const ok = await client.chat.completions.create({ model, messages: user, max_tokens: 2 });
  assert.equal(ok.choices.length, 1); // and the server goes on serving
});

test('reasoning apart from the content, not streamed', async () => {
  const grammar = await thoughtGrammar();
  for (let seed = 0; seed < 3; seed++) {
    const r = await client.chat.completions.create({
      model, messages: user, max_tokens: 40, seed, temperature: 1,
      structured_outputs: { grammar },
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.match(m.content, /^done[0-9]{1,3}$/);
    assert.match(m.reasoning, /^[a-z ]{1,12}$/); // the "thought\n" label is gone
    assert.equal(m.reasoning_content, m.reasoning);
  }
});

test('reasoning apart from the content, streamed', async () => {
  const grammar = await thoughtGrammar();
  for (let seed = 0; seed < 3; seed++) {
    const s = await client.chat.completions.create({
      model, messages: user, max_tokens: 40, seed, stream: true, structured_outputs: { grammar },
    });
    const out = await collect(s);
    assert.equal(out.finish, 'stop');
    assert.match(out.content, /^done[0-9]{1,3}$/);
    assert.match(out.reasoning, /^[a-z ]{1,12}$/);
  }
});

test('a JSON schema with thinking on: the answer after the thought matches', async () => {
  const schema = { type: 'object', required: ['n'], additionalProperties: false,
                   properties: { n: { type: 'integer', minimum: 0, maximum: 9 } } };
  let finished = 0;
  for (let seed = 0; seed < 8; seed++) {
    const r = await client.chat.completions.create({
      model, messages: user, max_tokens: 60, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'n', schema } },
      chat_template_kwargs: { enable_thinking: true },
    });
    const c = r.choices[0];
    assert.ok(!(c.message.content ?? '').includes('<|'));
    if (c.finish_reason !== 'stop') continue; // a random thought may not end in time
    finished++;
    const v = JSON.parse(c.message.content);
    assert.ok(Number.isInteger(v.n) && v.n >= 0 && v.n <= 9);
  }
  assert.ok(finished >= 1, 'some answers finished');
});

test('tool_choice required: native calls, not streamed', async () => {
  let multi = 0;
  for (let seed = 0; seed < 16; seed++) {
    const r = await client.chat.completions.create({
      model, messages: user, tools, tool_choice: 'required', max_tokens: 200, seed,
    });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue;
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.content, null);
    assert.ok(c.message.tool_calls.length >= 1);
    c.message.tool_calls.forEach(checkCall);
    if (c.message.tool_calls.length > 1) multi++;
    assert.equal(new Set(c.message.tool_calls.map((t) => t.id)).size, c.message.tool_calls.length);
  }
  assert.ok(multi >= 1, 'parallel calls happened');
});

test('a named tool and parallel_tool_calls false: one call of it', async () => {
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.chat.completions.create({
      model, messages: user, tools, max_tokens: 200, seed, parallel_tool_calls: false,
      tool_choice: { type: 'function', function: { name: 'add' } },
    });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue;
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.tool_calls.length, 1);
    assert.equal(c.message.tool_calls[0].function.name, 'add');
    checkCall(c.message.tool_calls[0]);
  }
});

test('legacy functions: Gemma 4 native calls come back as function_call', async () => {
  const functions = tools.map((t) => t.function);
  let done = 0;
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.chat.completions.create({
      model, messages: user, functions, function_call: { name: 'add' }, max_tokens: 200, seed,
    });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue;
    done++;
    assert.equal(c.finish_reason, 'function_call');
    assert.equal(c.message.tool_calls, undefined);
    assert.equal(c.message.function_call.name, 'add');
    checkCall({ id: 'call_0', type: 'function', function: c.message.function_call });
  }
  assert.ok(done >= 1);
});

test('tool_choice required, streamed: calls with their index, no marker in content', async () => {
  let done = 0;
  for (let seed = 0; seed < 4; seed++) {
    const s = await client.chat.completions.create({
      model, messages: user, tools, tool_choice: 'required', max_tokens: 200, seed, stream: true,
    });
    const out = await collect(s);
    if (out.finish === 'length') continue;
    done++;
    assert.equal(out.finish, 'tool_calls');
    assert.equal(out.content, '');
    assert.ok(out.calls.length >= 1);
    out.calls.forEach(checkCall);
    // the arguments arrived in fragments as they were written, not whole at the end
    assert.ok(out.pieces.every((p) => p >= 3), JSON.stringify(out.pieces));
  }
  assert.ok(done >= 1);
});

// auto: the model may write text, then calls; a grammar makes it do exactly that
async function autoGrammar() {
  const call = await tokenId('<|tool_call>'), end = await tokenId('<tool_call|>');
  const q = await tokenId('<|"|>');
  return `root ::= "Checking." <[${call}]> "call:get_weather{city:" <[${q}]> [a-z]{1,6} <[${q}]> ",unit:" <[${q}]> "c" <[${q}]> "}" <[${end}]> (<[${call}]> "call:add{a:" [0-9]{1,2} ",b:2}" <[${end}]>)?`;
}

test('tool_choice auto: text before the calls is content, the calls are parsed', async () => {
  const grammar = await autoGrammar();
  for (const stream of [false, true]) {
    for (let seed = 0; seed < 3; seed++) {
      const req = { model, messages: user, tools, tool_choice: 'auto', max_tokens: 80, seed,
                    structured_outputs: { grammar } };
      let content, calls, finish;
      if (stream) {
        const out = await collect(await client.chat.completions.create({ ...req, stream: true }));
        ({ content, calls, finish } = out);
      } else {
        const r = await client.chat.completions.create(req);
        ({ content, tool_calls: calls } = r.choices[0].message);
        finish = r.choices[0].finish_reason;
      }
      assert.equal(finish, 'tool_calls');
      assert.equal(content, 'Checking.');
      assert.ok(calls.length === 1 || calls.length === 2);
      const a = checkCall(calls[0]);
      assert.equal(calls[0].function.name, 'get_weather');
      assert.match(a.city, /^[a-z]{1,6}$/);
      assert.equal(a.unit, 'c');
      if (calls[1]) assert.equal(JSON.parse(calls[1].function.arguments).b, 2);
    }
  }
});

test('the history round trip renders in Gemma 4 notation and is served', async () => {
  const history = [
    ...user,
    { role: 'assistant', content: null, tool_calls: [
      { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris","unit":"c"}' } },
      { id: 'call_2', type: 'function', function: { name: 'add', arguments: '{"a":2,"b":3}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp":21}' },
    { role: 'tool', tool_call_id: 'call_2', content: '5' },
  ];
  const t = await post('/tokenize', { model, messages: history, tools });
  assert.equal(t.status, 200);
  const d = await post('/detokenize', { model, tokens: t.body.tokens });
  const text = d.body.prompt;
  assert.ok(text.includes('<|tool>declaration:get_weather{'), text);
  assert.ok(text.includes('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>c<|"|>}<tool_call|>' +
                          '<|tool_call>call:add{a:2,b:3}<tool_call|>'), text);
  assert.ok(text.includes('<|tool_response>response:get_weather{temp:21}<tool_response|>' +
                          '<|tool_response>response:add{value:<|"|>5<|"|>}<tool_response|>'), text);
  const r = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 8 });
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
});
