#!/usr/bin/env node
// bench-vs-llamacpp.mjs — lmserve and llama.cpp side by side on the same
// weights: exports the checkpoint to GGUF (`lmserve export-gguf`, once), then
// runs `lmserve bench model --json` and `tools/bench-llamacpp.mjs --json`
// alternately, round after round, with the same thread count, prompt and
// decode lengths, and prints one markdown row per run and the medians of the
// ratios. Each row names the ISA path each engine ran.
//
//   node tools/bench-vs-llamacpp.mjs --model DIR [--gguf FILE] [--rounds 3]
//        [--threads 2] [--prompt-tokens 256] [--decode-tokens 64]
//        [--lmserve build/tools/lmserve] [--dtype auto|bfloat16]
//
// --dtype bfloat16 runs lmserve's bf16 mode (matmul inputs rounded to bf16,
// as llama.cpp's bf16 path rounds them).
import {spawnSync} from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const o = {model: null, gguf: null, rounds: 3, threads: 2, "prompt-tokens": 256,
           "decode-tokens": 64, dtype: "auto", lmserve: path.join(here, "..", "build", "tools", "lmserve")};
for (let i = 2; i < process.argv.length; i++) {
  const m = /^--([a-z-]+)(?:=(.*))?$/.exec(process.argv[i]);
  if (!m || !(m[1] in o)) die(`unknown argument '${process.argv[i]}'`);
  const v = m[2] ?? process.argv[++i];
  if (v === undefined) die(`--${m[1]} needs a value`);
  if (typeof o[m[1]] === "number") {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1) die(`--${m[1]}: '${v}' is not a count`);
    o[m[1]] = n;
  } else {
    o[m[1]] = v;
  }
}
if (!o.model) die("--model DIR is required");
o.gguf ??= path.join(o.model, "model.gguf");

function die(msg) {
  console.error(`bench-vs-llamacpp: ${msg}`);
  process.exit(2);
}

function run(cmd, args) {
  const r = spawnSync(cmd, args, {encoding: "utf8", maxBuffer: 1 << 24});
  if (r.status !== 0) die(`${cmd} ${args.join(" ")} failed:\n${r.stderr}`);
  return r.stdout;
}

if (!fs.existsSync(o.gguf)) run(o.lmserve, ["export-gguf", "--model", o.model, "--out", o.gguf]);

const common = ["--prompt-tokens", String(o["prompt-tokens"]), "--decode-tokens",
                String(o["decode-tokens"])];
const median = (a) => [...a].sort((x, y) => x - y)[a.length >> 1];
const rows = [];
console.log(`| round | lmserve prefill tok/s | llama.cpp prefill tok/s | ratio | ` +
            `lmserve decode tok/s | llama.cpp decode tok/s | ratio | lmserve decode / bound |`);
console.log("| --- | --- | --- | --- | --- | --- | --- | --- |");
let paths = "";
for (let r = 1; r <= o.rounds; r++) {
  const a = JSON.parse(run(o.lmserve, ["bench", "model", "--model", o.model, "--threads",
                                       String(o.threads), "--dtype", o.dtype, "--json",
                                       ...common]).trim());
  const b = JSON.parse(run(process.execPath, [path.join(here, "bench-llamacpp.mjs"), "--model",
                                              o.gguf, "--threads", String(o.threads), "--json",
                                              ...common]).trim());
  paths = `lmserve ${a.backend} (processor ${a.isa}, matmul inputs ${a.matmul_inputs}), ` +
          `llama.cpp ${b.isa}, ${o.threads} threads each`;
  const row = {pre: a.prefill_tokens_per_s / b.prefill_tokens_per_s,
               dec: a.decode_tokens_per_s / b.decode_tokens_per_s, bound: a.fraction_of_bound};
  rows.push(row);
  console.log(`| ${r} | ${a.prefill_tokens_per_s.toFixed(1)} | ${b.prefill_tokens_per_s.toFixed(1)}` +
              ` | ${row.pre.toFixed(2)}x | ${a.decode_tokens_per_s.toFixed(2)} | ` +
              `${b.decode_tokens_per_s.toFixed(2)} | ${row.dec.toFixed(2)}x | ` +
              `${(100 * row.bound).toFixed(1)}% |`);
}
console.log(`\n${paths}; medians over ${o.rounds} rounds: prefill ` +
            `${median(rows.map((x) => x.pre)).toFixed(2)}x, decode ` +
            `${median(rows.map((x) => x.dec)).toFixed(2)}x llama.cpp; decode at ` +
            `${(100 * median(rows.map((x) => x.bound))).toFixed(1)}% of the bandwidth bound`);
