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
