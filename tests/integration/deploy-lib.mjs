// deploy-lib.mjs — what the deployment tests (compose.mjs, kubernetes.mjs)
// share: the flags each `lmserve ROLE --help` lists, tcp:// endpoints, free
// loopback ports, and polling a starting cluster over HTTP.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createServer } from 'node:net';

const helpCache = {};

/* The set of --flags that `BIN ROLE --help` prints. */
export function roleFlags(bin, role) {
  const key = `${bin}\0${role}`;
  if (!helpCache[key]) {
    const out = execFileSync(bin, [role, '--help'], { encoding: 'utf8' });
    helpCache[key] = new Set(out.match(/--[a-z][a-z0-9-]*/g));
  }
  return helpCache[key];
}

/* {FLAG: value} of an argv after its role ([role, --a, 1, --b, --c, 2]); a flag
 * without a value is true, and a repeated flag keeps its last value (all of
 * them in flagValues). */
export function parseFlags(argv) {
  const flags = {};
  for (let i = 1; i < argv.length; i++)
    if (argv[i].startsWith('--')) {
      const next = argv[i + 1];
      flags[argv[i]] = next !== undefined && !next.startsWith('--') ? next : true;
    }
  return flags;
}

export function flagValues(argv, flag) {
  const out = [];
  for (let i = 1; i < argv.length - 1; i++)
    if (argv[i] === flag) out.push(argv[i + 1]);
  return out;
}

export function endpoint(url) {
  const m = /^tcp:\/\/([^:/]+):(\d+)$/.exec(url ?? '');
  assert.ok(m, `a tcp://HOST:PORT endpoint, not ${url}`);
  return { host: m[1], port: Number(m[2]) };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort(host) {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, host, () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/* The HTTP status of GET url, 0 when nothing answers. */
export async function status(url) {
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(3000) });
    await r.arrayBuffer();
    return r.status;
  } catch {
    return 0;
  }
}

/* Polls f every 200 ms until it is true; fails past ms. Returns the time taken. */
export async function until(what, ms, f) {
  const t0 = Date.now();
  for (;;) {
    if (await f()) return Date.now() - t0;
    if (Date.now() - t0 > ms) assert.fail(`${what}: not within ${ms / 1000} s`);
    await sleep(200);
  }
}

/* POST a JSON body; {status, json} (json null when the body is not JSON), or
 * null when nothing answers. */
export async function postJson(url, body, ms = 60000) {
  try {
    const r = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(ms),
    });
    const text = await r.text();
    let json = null;
    try {
      json = JSON.parse(text);
    } catch {
      /* not JSON */
    }
    return { status: r.status, json };
  } catch {
    return null;
  }
}
