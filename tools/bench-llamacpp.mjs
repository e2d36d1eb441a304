#!/usr/bin/env node
// bench-llamacpp.mjs — llama.cpp's prefill and single-sequence decode on a GGUF
// file (`lmserve export-gguf`), measured the way `lmserve bench model` measures
// lmserve, for side-by-side figures in BENCHMARKS.md:
//   - the same prompt ids (the bench's generator: an LCG from seed 12345, ids
//     (s >> 8) % vocab, the first one bos);
//   - the prompt once as a warm-up (the thread pool's start and the first
//     touches of the batch's buffers, which a server pays on its first request
//     only), then the prompt in one batch on an empty cache,
//     then `--decode-tokens` greedy tokens one at a time;
//   - `--threads` threads for both batch and single-token evaluation.
// llama.cpp is the prebuilt CPU build of the npm package node-llama-cpp (its
// ggml CPU backend picks a variant for this processor at load: the line
// "ggml cpu" names it). Install it with `tools/setup --with-llamacpp`.
//
//   node tools/bench-llamacpp.mjs --model m.gguf [--threads 2]
//        [--prompt-tokens 256] [--decode-tokens 32] [--reps 1] [--json]
import {createRequire} from "node:module";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const opts = {model: null, threads: 2, "prompt-tokens": 256, "decode-tokens": 32, reps: 1,
              json: false};
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  const m = /^--([a-z-]+)(?:=(.*))?$/.exec(a);
  if (!m || !(m[1] in opts)) die(`unknown argument '${a}'`);
  if (typeof opts[m[1]] === "boolean") { opts[m[1]] = true; continue; }
  const v = m[2] ?? process.argv[++i];
  if (v === undefined) die(`--${m[1]} needs a value`);
  if (m[1] === "model") { opts.model = v; continue; }
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 1 << 20) die(`--${m[1]}: '${v}' is not a count`);
  opts[m[1]] = n;
}
if (!opts.model) die("--model FILE.gguf is required");

function die(msg) {
  console.error(`bench-llamacpp: ${msg}`);
  process.exit(2);
}

let nlc;
try {
  const req = createRequire(path.join(here, "llamacpp", "package.json"));
  nlc = await import(req.resolve("node-llama-cpp"));
} catch (e) {
  die(`node-llama-cpp is not installed (tools/setup --with-llamacpp): ${e.message}`);
}

let variant = "?";
const llama = await nlc.getLlama({
  gpu: false, build: "never", logLevel: nlc.LlamaLogLevel.debug,
  logger(level, message) {
    const m = /loaded CPU backend from .*libggml-cpu-([a-z0-9_]+)\.so/.exec(message);
    if (m) variant = m[1];
    else if (level === nlc.LlamaLogLevel.error) console.error(message);
  },
});
const model = await llama.loadModel({modelPath: opts.model, gpuLayers: 0});
const nVocab = Number(model.fileInfo.metadata.tokenizer?.ggml?.tokens?.length ??
                      model.fileInfo.metadata.gemma3?.vocab_size);
const bos = model.tokens.bos ?? 2;
const P = opts["prompt-tokens"], D = opts["decode-tokens"];
const ids = new Array(P);
let s = 12345;
for (let i = 0; i < P; i++) {
  s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
  ids[i] = (s >>> 8) % nVocab;
}
ids[0] = bos;

const weightBytes = model.size;
for (let rep = 0; rep < opts.reps; rep++) {
  const ctx = await model.createContext({
    contextSize: P + D + 16, batchSize: P, threads: {ideal: opts.threads, min: opts.threads},
    sequences: 1,
  });
  const seq = ctx.getSequence();
  await seq.evaluateWithoutGeneratingNewTokens(ids); // warm-up: thread pool, first touches
  await seq.eraseContextTokenRanges([{start: 0, end: seq.nextTokenIndex}]);
  let t0 = performance.now();
  await seq.evaluateWithoutGeneratingNewTokens(ids);
  const tPrefill = (performance.now() - t0) / 1e3;
  // D single-token steps, as lmserve's bench runs after its prefill step
  t0 = performance.now();
  let n = 0;
  const out = [];
  for await (const tok of seq.evaluate([ids[P - 1]], {temperature: 0})) {
    out.push(tok);
    if (++n >= D) break;
  }
  const tDecode = (performance.now() - t0) / 1e3;
  const r = {engine: "llama.cpp", isa: `ggml-cpu-${variant}`, threads: opts.threads,
             model: opts.model, weight_bytes: weightBytes, prompt_tokens: P,
             prefill_tokens_per_s: P / tPrefill, decode_tokens: n,
             decode_tokens_per_s: n / tDecode, first_tokens: out.slice(0, 8)};
  if (opts.json) console.log(JSON.stringify(r));
  else
    console.log(`llama.cpp  ggml-cpu-${variant}, ${opts.threads} threads, ${opts.model}: ` +
                `prefill ${P} tokens in ${tPrefill.toFixed(3)} s: ` +
                `${r.prefill_tokens_per_s.toFixed(1)} tokens/s; decode ${n} tokens in ` +
                `${tDecode.toFixed(3)} s: ${r.decode_tokens_per_s.toFixed(2)} tokens/s`);
  await ctx.dispose();
}
await model.dispose();
await llama.dispose();
