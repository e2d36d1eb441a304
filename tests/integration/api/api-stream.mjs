// api-stream.mjs — what the openai-client scripts share: a chat completion
// streamed with usage (stream_options.include_usage), read chunk by chunk with
// the checks every such stream must pass: chat.completion.chunk objects, one
// choice a chunk, and the usage last, in a chunk without choices.
import assert from 'node:assert/strict';

// Streams the chat completion `req` on client: its text, usage, finish reason and
// number of chunks.
export async function streamChat(client, req) {
  const stream = await client.chat.completions.create({
    ...req, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) {
      assert.equal(chunk.choices.length, 0);
      usage = chunk.usage;
      continue;
    }
    assert.equal(usage, null, 'usage comes last');
    text += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  return { text, usage, finish, chunks };
}

// Registers two node tests on client: the greedy answer to `messages` (8 tokens at
// temperature 0, ignore_eos) is `expect`, plain and streamed with usage, and
// prompt_tokens is above minPrompt (the media's soft tokens count in it). what
// names the media in the tests' names.
export function greedyChatTests(test, client, model, messages, expect, minPrompt, what) {
  const req = { model, messages, max_tokens: 8, temperature: 0, ignore_eos: true };
  test(`chat.completions.create with ${what}`, async () => {
    const r = await client.chat.completions.create(req);
    assert.equal(r.choices[0].message.content, expect);
    assert.equal(r.usage.completion_tokens, 8);
    assert.ok(r.usage.prompt_tokens > minPrompt, 'the soft tokens count in prompt_tokens');
  });
  test('streamed, with usage', async () => {
    const { text, usage } = await streamChat(client, req);
    assert.equal(text, expect);
    assert.equal(usage.completion_tokens, 8);
  });
}

// Registers a node test: a user message of a text part then `part` is a 400
// (the client's BadRequestError) whose param is messages[0].content[1].<key>, key
// the part's type.
export function brokenPartTest(test, OpenAI, client, model, part, what) {
  test(`a broken ${what} is a BadRequestError naming its part`, async () => {
    await assert.rejects(
      client.chat.completions.create({
        model,
        messages: [{ role: 'user', content: [{ type: 'text', text: 'Look' }, part] }],
        max_tokens: 4,
      }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 &&
        e.param === `messages[0].content[1].${part.type}`,
    );
  });
}
