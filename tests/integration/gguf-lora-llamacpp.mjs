// gguf-lora-llamacpp.mjs — greedy continuations of token-id prompts by llama.cpp
// (the prebuilt CPU build of the npm package node-llama-cpp, tools/llamacpp/) with
// GGUF LoRA adapters, for test-gguf-lora.c: llama.cpp is the outside implementation
// that checks lmserve reads its adapter files (convert_lora_to_gguf.py's layout) as
// it applies them.
//
//   node gguf-lora-llamacpp.mjs LLAMACPP_DIR MODEL.gguf N '[[ids...], ...]' ADAPTER...
// ADAPTER: a .gguf adapter file, or "-" for none. For each ADAPTER in turn and each
// prompt, prints a line with the JSON array of N generated ids, then a line of N
// numbers: at each step, how far llama.cpp's top logit lies above its second (ln p1 -
// ln p2), so that a caller can tell a near-tie from a real difference, then a line of
// N numbers: the log probability of the token it took (ln p1). An adapter is
// given to the context at scale 1 (llama.cpp's default: each module's alpha / r). The
// KV cache is f32 (llama.cpp's default is f16), as lmserve's for an f32 model.
import {openLlama, topTwo} from "./llamacpp-lib.mjs";

const [dir, modelPath, nArg, promptsArg, ...adapters] = process.argv.slice(2);
const llama = await openLlama(dir);
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const n = Number(nArg);
for (const adapter of adapters) {
  for (const ids of JSON.parse(promptsArg)) {
    const ctx = await model.createContext({
      contextSize: ids.length + n + 16, threads: 2, sequences: 1,
      experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
      ...(adapter === "-" ? {} : {lora: {adapters: [{filePath: adapter, scale: 1}]}}),
    });
    const seq = ctx.getSequence();
    const out = [], gap = [], top = [];
    const steps = seq.evaluateWithMetadata(ids, {probabilities: true}, {temperature: 0});
    for await (const step of steps) {
      const {p1, p2} = topTwo(step.probabilities);
      out.push(step.token);
      gap.push(Math.log(p1) - Math.log(p2));
      top.push(Math.log(p1));
      if (out.length >= n) break;
    }
    console.log(JSON.stringify(out));
    console.log(JSON.stringify(gap));
    console.log(JSON.stringify(top));
    await ctx.dispose();
  }
}
await model.dispose();
await llama.dispose();
