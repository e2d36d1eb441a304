// gguf-llamacpp.mjs — greedy continuations of token-id prompts by llama.cpp
// (the prebuilt CPU build of the npm package node-llama-cpp, tools/llamacpp/),
// for test-gguf.c: llama.cpp is the outside implementation of Gemma 3 that
// checks `lmserve export-gguf` wrote the same model.
//
//   node gguf-llamacpp.mjs LLAMACPP_DIR MODEL.gguf N '[[ids...], [ids...]]'
// prints one JSON array of N generated ids per prompt, one per line. The
// cache is f32 (llama.cpp's default is f16) so that the comparison is with
// lmserve's --kv-dtype f32.
import {createRequire} from "node:module";
import path from "node:path";

const [dir, modelPath, nArg, promptsArg] = process.argv.slice(2);
const req = createRequire(path.join(dir, "package.json"));
const nlc = await import(req.resolve("node-llama-cpp"));
const llama = await nlc.getLlama({gpu: false, build: "never", logLevel: nlc.LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const n = Number(nArg);
for (const ids of JSON.parse(promptsArg)) {
  const ctx = await model.createContext({
    contextSize: ids.length + n + 16, threads: 2, sequences: 1,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
  });
  const seq = ctx.getSequence();
  const out = [];
  for await (const t of seq.evaluate(ids, {temperature: 0})) {
    out.push(t);
    if (out.length >= n) break;
  }
  console.log(JSON.stringify(out));
  await ctx.dispose();
}
await model.dispose();
await llama.dispose();
