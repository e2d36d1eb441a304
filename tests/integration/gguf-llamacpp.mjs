// gguf-llamacpp.mjs — greedy continuations of token-id prompts by llama.cpp
// (the prebuilt CPU build of the npm package node-llama-cpp, tools/llamacpp/),
// for test-gguf.c: llama.cpp is the outside implementation of Gemma 3 that
// checks `lmserve export-gguf` wrote the same model.
//
//   node gguf-llamacpp.mjs LLAMACPP_DIR MODEL.gguf N '[[ids...], [ids...]]' [gaps]
//   node gguf-llamacpp.mjs LLAMACPP_DIR MODEL.gguf tokenize < TEXT
// prints one JSON array of N generated ids per prompt, one per line; with
// "gaps", each is followed by a line of N numbers: at each step, how far
// llama.cpp's top logit lies above its second (ln p1 - ln p2 of its
// probabilities), so that a caller can tell a near-tie from a real
// difference. The
// cache is f32 (llama.cpp's default is f16) so that the comparison is with
// lmserve's --kv-dtype f32.
import {openLlama, topTwo} from "./llamacpp-lib.mjs";

const [dir, modelPath, nArg, promptsArg, gapsArg] = process.argv.slice(2);
const gaps = gapsArg === "gaps";
const llama = await openLlama(dir);
if (nArg === "tokenize") {
  // node gguf-llamacpp.mjs LLAMACPP_DIR MODEL.gguf tokenize < TEXT: the file's own
  // tokenizer's ids of the text (special tokens' text read as those tokens, no BOS
  // added), one JSON array
  const vocab = await llama.loadModel({modelPath, gpuLayers: 0, vocabOnly: true});
  const text = (await import("node:fs")).readFileSync(0, "utf8");
  console.log(JSON.stringify(Array.from(vocab.tokenize(text, true))));
  await vocab.dispose();
  await llama.dispose();
  process.exit(0);
}
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const n = Number(nArg);
for (const ids of JSON.parse(promptsArg)) {
  const ctx = await model.createContext({
    contextSize: ids.length + n + 16, threads: 2, sequences: 1,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
  });
  const seq = ctx.getSequence();
  const out = [], gap = [];
  const steps = gaps ? seq.evaluateWithMetadata(ids, {probabilities: true}, {temperature: 0})
                     : seq.evaluate(ids, {temperature: 0});
  for await (const step of steps) {
    if (gaps) {
      const {p1, p2} = topTwo(step.probabilities);
      out.push(step.token);
      gap.push(Math.log(p1) - Math.log(p2));
    } else {
      out.push(step);
    }
    if (out.length >= n) break;
  }
  console.log(JSON.stringify(out));
  if (gaps) console.log(JSON.stringify(gap));
  await ctx.dispose();
}
await model.dispose();
await llama.dispose();
