#!/usr/bin/env node
// tools/bench-first-constrained.mjs — what a server's first structured output costs
// the requests already running. Each round starts a fresh `lmserve serve` (so the
// workers have no structured-output state yet), streams a plain completion, and
// once it is under way sends one JSON-mode request. It prints, per round, the plain
// stream's median gap between tokens before the JSON request, its longest gap from
// that request's arrival to the JSON request's first token, and that time to first
// token. With --lmserve-b a second binary runs the same rounds in turn, for a side
// by side comparison in one run.
//
//   node tools/bench-first-constrained.mjs --model DIR [--rounds 3] [--port 18400]
//        [--lmserve build/tools/lmserve] [--lmserve-b OTHER] [--tokens 160]
import {spawn} from "node:child_process";
import {setTimeout as sleep} from "node:timers/promises";

function args() {
  const o = {rounds: 3, port: 18400, lmserve: "build/tools/lmserve", tokens: 160, after: 40};
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    const k = a[i].replace(/^--/, "").replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(k in o) && !["model", "lmserveB"].includes(k)) throw new Error(`unknown flag ${a[i]}`);
    const v = a[++i];
    if (v === undefined) throw new Error(`${a[i - 1]} needs a value`);
    o[k] = typeof o[k] === "number" ? Number(v) : v;
  }
  if (!o.model) throw new Error("--model DIR is required");
  return o;
}

async function waitHealth(url, proc) {
  for (let i = 0; i < 1200; i++) {
    if (proc.exitCode !== null) throw new Error("serve exited");
    try {
      if ((await fetch(`${url}/health`)).ok) return;
    } catch {}
    await sleep(100);
  }
  throw new Error("serve did not become healthy");
}

// Streams a completion; calls onChunk(now) for each chunk with text.
async function stream(url, body, onChunk) {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: {"content-type": "application/json"},
    body: JSON.stringify({...body, stream: true}),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const dec = new TextDecoder();
  let buf = "";
  for await (const part of r.body) {
    buf += dec.decode(part, {stream: true});
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line.startsWith("data:") || line === "data: [DONE]") continue;
      const j = JSON.parse(line.slice(5));
      if (j.error) throw new Error(JSON.stringify(j.error));
      if (j.choices?.[0]?.text) onChunk(performance.now());
    }
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function round(o, bin, port) {
  const url = `http://127.0.0.1:${port}`;
  const proc = spawn(bin, ["serve", "--model", o.model, "--port", String(port)], {
    stdio: ["ignore", "ignore", "ignore"],
  });
  try {
    await waitHealth(url, proc);
    const times = [];
    let sentAt = 0, firstAt = 0, started;
    const go = new Promise((res) => (started = res));
    const plain = stream(url, {prompt: "The history of the printing press", max_tokens: o.tokens,
                              ignore_eos: true, temperature: 0}, (t) => {
      times.push(t);
      if (times.length === o.after) started();
    });
    await go;
    sentAt = performance.now();
    await stream(url, {prompt: "A JSON object describing a cat:", max_tokens: 8, temperature: 0,
                       response_format: {type: "json_object"}}, (t) => {
      if (!firstAt) firstAt = t;
    });
    await plain;
    const gaps = times.slice(1).map((t, i) => t - times[i]);
    const before = gaps.slice(0, o.after - 1);
    let worst = 0;
    for (let i = 1; i < times.length; i++)
      if (times[i] > sentAt && times[i - 1] < firstAt) worst = Math.max(worst, times[i] - times[i - 1]);
    return {median: median(before), worst, ttft: firstAt - sentAt};
  } finally {
    proc.kill("SIGTERM");
    await new Promise((res) => (proc.exitCode !== null ? res() : proc.on("exit", res)));
  }
}

const o = args();
const bins = [o.lmserve, ...(o.lmserveB ? [o.lmserveB] : [])];
console.log(`model ${o.model}; plain stream of ${o.tokens} tokens, JSON request after ${o.after}`);
console.log("binary | round | plain gap median ms | plain gap longest ms | JSON request TTFT ms");
for (let r = 0; r < o.rounds; r++)
  for (const [i, bin] of bins.entries()) {
    const x = await round(o, bin, o.port + i);
    console.log(`${bin} | ${r + 1} | ${x.median.toFixed(1)} | ${x.worst.toFixed(1)} | ${x.ttft.toFixed(0)}`);
  }
