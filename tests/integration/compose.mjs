// compose.mjs — the compose deployments checked against the CLI, then run.
//
// 1. Structure, for deploy/docker-compose.yml and deploy/docker-compose.cuda.yml:
//    one scheduler, its worker group, a frontend; the endpoints agree (the
//    frontend's and the workers' --scheduler name the scheduler service and the
//    ports it binds); --world-size matches the number of worker services and
//    their ranks are 0..N-1; the frontend's --port is the published container
//    port and its health check asks that port's /health; every service has a
//    restart policy; every role reads the same --model; every flag is one that
//    `lmserve ROLE --help` lists; CUDA workers have --device cuda, a GPU
//    reservation each (distinct devices) and the host's IPC namespace.
// 2. The CPU file's topology run as processes, each service on its own loopback
//    address with the file's own commands (the host names and 0.0.0.0 replaced
//    by those addresses, the model by a test checkpoint, the HTTP port by a free
//    one), supervised the way the restart policy does it (a role that exits is
//    started again). Then each role in turn is killed with SIGKILL: the cluster
//    must answer /health 200 and serve a completion again.
//
// Environment: LMSERVE_BIN (the lmserve binary), LMSERVE_TEST_MODEL (a checkpoint
// folder), LMSERVE_DEPLOY_DIR (deploy/).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import YAML from 'yaml';
import {
  roleFlags, parseFlags, endpoint, sleep, freePort, status, until, postJson,
} from './deploy-lib.mjs';

const BIN = process.env.LMSERVE_BIN;
const MODEL = process.env.LMSERVE_TEST_MODEL;
const DEPLOY = process.env.LMSERVE_DEPLOY_DIR;
assert.ok(BIN && MODEL && DEPLOY, 'LMSERVE_BIN, LMSERVE_TEST_MODEL and LMSERVE_DEPLOY_DIR are set');

// ${VAR:-default} and ${VAR} as compose interpolates them, from an empty environment
const interp = (s) => String(s).replace(/\$\{(\w+)(?::?-([^}]*))?\}/g, (_, v, d) => d ?? '');

function load(name) {
  const doc = YAML.parse(readFileSync(`${DEPLOY}/${name}`, 'utf8'), { merge: true });
  const services = {};
  for (const [svc, def] of Object.entries(doc.services ?? {})) {
    const cmd = (def.command ?? []).map(interp);
    services[svc] = { def, cmd, role: cmd[0], flags: parseFlags(cmd) };
  }
  return services;
}

function checkStructure(name, gpu) {
  const s = load(name);
  const by = (role) => Object.entries(s).filter(([, v]) => v.role === role);
  const scheds = by('scheduler'), workers = by('worker'), fronts = by('frontend');
  assert.equal(scheds.length, 1, `${name}: one scheduler service`);
  assert.ok(workers.length >= 1, `${name}: worker services`);
  assert.ok(fronts.length >= 1, `${name}: a frontend service`);
  assert.equal(Object.keys(s).length, 1 + workers.length + fronts.length,
               `${name}: every service runs a role`);
  const [schedName, sched] = scheds[0];
  const fe = endpoint(sched.flags['--frontend-endpoint']);
  const we = endpoint(sched.flags['--worker-endpoint']);
  assert.equal(fe.host, '0.0.0.0', `${name}: the scheduler listens on every interface`);
  assert.notEqual(fe.port, we.port, `${name}: two scheduler ports`);
  const world = Number(sched.flags['--world-size']);
  assert.equal(world, workers.length, `${name}: --world-size is the number of worker services`);
  const ranks = workers.map(([, w]) => Number(w.flags['--rank'])).sort((a, b) => a - b);
  assert.deepEqual(ranks, [...Array(world).keys()], `${name}: ranks 0..N-1, once each`);
  const model = sched.flags['--model'];
  assert.ok(model, `${name}: the scheduler has --model`);
  for (const [svc, v] of Object.entries(s)) {
    assert.ok(['always', 'unless-stopped', 'on-failure'].includes(v.def.restart),
              `${name}: ${svc} has a restart policy`);
    assert.equal(v.flags['--model'], model, `${name}: ${svc} reads the same --model`);
    const known = roleFlags(BIN, v.role);
    for (const f of Object.keys(v.flags))
      assert.ok(known.has(f), `${name}: ${svc}: \`lmserve ${v.role}\` has no ${f}`);
  }
  const devices = new Set();
  for (const [svc, w] of workers) {
    const ep = endpoint(w.flags['--scheduler']);
    assert.equal(ep.host, schedName, `${name}: ${svc} connects to the scheduler service`);
    assert.equal(ep.port, we.port, `${name}: ${svc} uses the scheduler's worker port`);
    assert.equal(Number(w.flags['--world-size']), world, `${name}: ${svc}'s --world-size`);
    assert.ok((w.def.depends_on ?? []).includes(schedName), `${name}: ${svc} depends on the scheduler`);
    if (gpu) {
      assert.equal(w.flags['--device'], 'cuda', `${name}: ${svc} runs --device cuda`);
      const res = w.def.deploy?.resources?.reservations?.devices ?? [];
      assert.equal(res.length, 1, `${name}: ${svc} reserves a GPU`);
      assert.equal(res[0].driver, 'nvidia');
      assert.ok(res[0].capabilities.includes('gpu'));
      for (const d of res[0].device_ids ?? []) {
        assert.ok(!devices.has(d), `${name}: GPU ${d} reserved twice`);
        devices.add(d);
      }
      if (world > 1) assert.equal(w.def.ipc, 'host', `${name}: ${svc} shares IPC for NCCL`);
    }
  }
  for (const [svc, f] of fronts) {
    const ep = endpoint(f.flags['--scheduler']);
    assert.equal(ep.host, schedName, `${name}: ${svc} connects to the scheduler service`);
    assert.equal(ep.port, fe.port, `${name}: ${svc} uses the scheduler's frontend port`);
    assert.equal(f.flags['--host'], '0.0.0.0', `${name}: ${svc} listens on every interface`);
    const port = Number(f.flags['--port']);
    const published = (f.def.ports ?? []).map((p) => Number(String(p).split(':').pop()));
    assert.ok(published.includes(port), `${name}: ${svc} publishes its --port ${port}`);
    const hc = (f.def.healthcheck?.test ?? []).join(' ');
    assert.ok(hc.includes(`:${port}/health`), `${name}: ${svc}'s health check asks /health`);
  }
  return s;
}

test('docker-compose.yml agrees with the CLI', () => checkStructure('docker-compose.yml', false));
test('docker-compose.cuda.yml agrees with the CLI', () =>
  checkStructure('docker-compose.cuda.yml', true));

// ---- the CPU topology, run ----------------------------------------------------

test('the compose topology heals after any role is killed', { timeout: 600000 }, async () => {
  const s = load('docker-compose.yml');
  const names = Object.keys(s);
  const ip = Object.fromEntries(names.map((n, i) => [n, `127.0.0.${40 + i}`]));
  const fe = Object.entries(s).find(([, v]) => v.role === 'frontend');
  const httpPort = await freePort(ip[fe[0]]);
  const argvOf = (name) => {
    const v = s[name];
    const out = [];
    for (let i = 0; i < v.cmd.length; i++) {
      let a = v.cmd[i];
      const prev = v.cmd[i - 1];
      if (prev === '--model') a = MODEL;
      else if (prev === '--port' && v.role === 'frontend') a = String(httpPort);
      else if (prev === '--kv-cache-memory') a = '64M';
      else if (a === '0.0.0.0') a = ip[name];
      else if (a.startsWith('tcp://')) {
        const ep = endpoint(a);
        a = `tcp://${ep.host === '0.0.0.0' ? ip[name] : ip[ep.host]}:${ep.port}`;
      }
      out.push(a);
    }
    if (v.role === 'worker') out.push('--threads', '1');
    return out;
  };
  const procs = {}, restarts = Object.fromEntries(names.map((n) => [n, 0]));
  let stopping = false;
  const start = (name) => {
    const p = spawn(BIN, argvOf(name), { stdio: ['ignore', 'ignore', 'pipe'] });
    p.stderr.on('data', (d) => process.stderr.write(`[${name}] ${d}`));
    p.on('exit', () => {
      if (stopping) return;
      restarts[name]++;
      setTimeout(() => { if (!stopping) procs[name] = start(name); }, 500); // restart policy
    });
    procs[name] = p;
    return p;
  };
  const base = `http://${ip[fe[0]]}:${httpPort}`;
  const complete = async () => {
    const r = await postJson(`${base}/v1/completions`,
                             { prompt: [2, 818, 5279, 563], max_tokens: 4, temperature: 0 });
    /* null also when the frontend itself is down */
    return r?.status === 200 && r.json?.usage?.completion_tokens === 4 ? r.json.choices[0].text
                                                                      : null;
  };
  try {
    for (const n of names) start(n);
    await until('the cluster ready', 180000, async () => (await status(`${base}/health`)) === 200);
    const first = await complete();
    assert.ok(first !== null, 'a completion through the cluster');
    for (const role of ['worker', 'scheduler', 'frontend']) {
      const name = names.find((n) => s[n].role === role);
      const before = restarts[name];
      procs[name].kill('SIGKILL');
      await until(`${role} restarted`, 10000, async () => restarts[name] > before);
      /* serving again: /health 200 and the same greedy completion (a request may
       * fail while the cluster heals; the client retries, as one would) */
      let got = null;
      const ms = await until(`serving again after the ${role} was killed`, 180000, async () =>
        (await status(`${base}/health`)) === 200 && (got = await complete()) !== null);
      process.stderr.write(`# ${role} killed: serving again after ${ms} ms\n`);
      assert.equal(got, first, `the same greedy completion after the ${role} restart`);
    }
  } finally {
    stopping = true;
    for (const p of Object.values(procs)) p.kill('SIGTERM');
    await sleep(2000);
    for (const p of Object.values(procs)) if (p.exitCode === null) p.kill('SIGKILL');
  }
});
