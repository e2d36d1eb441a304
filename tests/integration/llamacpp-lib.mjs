// llamacpp-lib.mjs — what the llama.cpp comparison scripts (gguf-llamacpp.mjs,
// gguf-lora-llamacpp.mjs) share: llama.cpp from the npm package node-llama-cpp
// (tools/llamacpp/, its prebuilt CPU build), and a step's two most likely tokens.
import {createRequire} from "node:module";
import path from "node:path";

// The package installed in dir, and llama.cpp on the CPU (never built here).
export async function openLlama(dir) {
  const req = createRequire(path.join(dir, "package.json"));
  const nlc = await import(req.resolve("node-llama-cpp"));
  return nlc.getLlama({gpu: false, build: "never", logLevel: nlc.LlamaLogLevel.error});
}

// The largest and the second largest of a step's probabilities (a Map of token to
// probability): {p1, p2}.
export function topTwo(probabilities) {
  let p1 = 0, p2 = 0;
  for (const p of probabilities.values()) {
    if (p > p1) [p1, p2] = [p, p1];
    else if (p > p2) p2 = p;
  }
  return {p1, p2};
}
