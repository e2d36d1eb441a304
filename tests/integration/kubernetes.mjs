// kubernetes.mjs — deploy/kubernetes checked offline, then its tensor-parallel
// group run as processes.
//
// 1. Rendering: each folder with a kustomization.yaml is rendered as
//    `kubectl apply -k` would, by the subset of kustomize these folders use
//    (resources: files and folders; patches: RFC 6902 JSON patches with a
//    target), written here; anything else in a kustomization fails the test,
//    so the folders stay within what is checked. Every YAML file in the tree
//    is a kustomization, one's resource or patch, or a manifest applied alone.
// 2. Schemas: every object, rendered or alone, validates (k8s-schema.mjs:
//    the Kubernetes API through kubernetes-models, unknown fields, and the
//    LeaderWorkerSet / PodMonitor / ServiceMonitor schemas written from their
//    published APIs).
// 3. The CLI and the wiring: every container runs an lmserve role whose flags
//    (after Kubernetes' $(VAR) expansion, with LeaderWorkerSet's variables)
//    are all in `lmserve ROLE --help`; probes, ports, drain and grace period,
//    resources, the model volume, GPUs; the Services and budgets select the
//    pods; NetworkPolicies admit only lmserve's own pods to every ZeroMQ
//    port on the pod network; the LeaderWorkerSet's ranks, world size and
//    endpoints; the data-parallel frontends name every replica; the
//    monitors find every pod that serves /metrics.
// 4. The LeaderWorkerSet group of tensor-parallel/ started as local processes
//    with the manifest's arguments and the environment LeaderWorkerSet gives
//    (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX), each pod on its
//    own loopback address; --model, the HTTP port and --device cuda (here
//    cpu, with a small KV pool and one thread per rank) are the only changes.
//    One greedy completion across the two CPU ranks must equal `lmserve
//    generate`'s on the same model.
//
// Environment: LMSERVE_BIN, LMSERVE_TEST_MODEL, LMSERVE_DEPLOY_DIR (deploy/).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, statSync, existsSync } from 'node:fs';
import { join, relative, dirname } from 'node:path';
import { spawn, execFileSync } from 'node:child_process';
import YAML from 'yaml';
import { validate } from './k8s-schema.mjs';
import {
  roleFlags, parseFlags, flagValues, endpoint, sleep, freePort, status, until, postJson,
} from './deploy-lib.mjs';

const BIN = process.env.LMSERVE_BIN;
const MODEL = process.env.LMSERVE_TEST_MODEL;
const DEPLOY = process.env.LMSERVE_DEPLOY_DIR;
assert.ok(BIN && MODEL && DEPLOY, 'LMSERVE_BIN, LMSERVE_TEST_MODEL and LMSERVE_DEPLOY_DIR are set');
const K8S = process.env.LMSERVE_K8S_DIR ?? join(DEPLOY, 'kubernetes');
const ROLES = ['serve', 'scheduler', 'worker', 'frontend'];
const LWS = 'leaderworkerset.sigs.k8s.io';

// ---- rendering ------------------------------------------------------------------

function readDocs(file) {
  const docs = YAML.parseAllDocuments(readFileSync(file, 'utf8'));
  for (const d of docs)
    assert.equal(d.errors.length, 0, `${file}: ${d.errors.map((e) => e.message).join('; ')}`);
  return docs.map((d) => d.toJS()).filter((o) => o !== null);
}

function onlyKeys(obj, keys, what) {
  for (const k of Object.keys(obj ?? {}))
    assert.ok(keys.includes(k), `${what}: "${k}" is not in the kustomize subset this test renders`);
}

/* RFC 6901 pointer → [parent, key] in doc */
function pointer(doc, path) {
  assert.ok(path.startsWith('/'), `a JSON pointer, not ${path}`);
  const keys = path.slice(1).split('/').map((k) => k.replace(/~1/g, '/').replace(/~0/g, '~'));
  let parent = doc;
  for (const k of keys.slice(0, -1)) {
    parent = parent?.[Array.isArray(parent) ? Number(k) : k];
    assert.ok(parent && typeof parent === 'object', `${path}: no such location`);
  }
  return [parent, keys[keys.length - 1]];
}

/* RFC 6902 add, replace and remove */
function jsonPatch(doc, ops, what) {
  assert.ok(Array.isArray(ops), `${what}: a list of JSON patch operations`);
  for (const op of ops) {
    onlyKeys(op, ['op', 'path', 'value'], what);
    const [parent, key] = pointer(doc, op.path);
    const arr = Array.isArray(parent);
    const i = key === '-' ? parent.length : Number(key);
    if (op.op === 'add') {
      if (arr) {
        assert.ok(i >= 0 && i <= parent.length, `${what}: ${op.path} out of range`);
        parent.splice(i, 0, structuredClone(op.value));
      } else {
        parent[key] = structuredClone(op.value);
      }
    } else if (op.op === 'replace' || op.op === 'remove') {
      assert.ok(arr ? i >= 0 && i < parent.length : key in parent, `${what}: ${op.path} does not exist`);
      if (op.op === 'remove') arr ? parent.splice(i, 1) : delete parent[key];
      else parent[arr ? i : key] = structuredClone(op.value);
    } else {
      assert.fail(`${what}: op ${op.op} is not one this test applies`);
    }
  }
}

const groupVersion = (apiVersion) => {
  const [g, v] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  return { group: g, version: v };
};

/* The objects `kubectl apply -k dir` would send, and the files it read. */
function render(dir, used = new Set()) {
  const kfile = join(dir, 'kustomization.yaml');
  used.add(kfile);
  const [k] = readDocs(kfile);
  onlyKeys(k, ['apiVersion', 'kind', 'resources', 'patches'], kfile);
  assert.equal(k.apiVersion, 'kustomize.config.k8s.io/v1beta1', `${kfile}: apiVersion`);
  assert.equal(k.kind, 'Kustomization', `${kfile}: kind`);
  const objects = [];
  for (const r of k.resources ?? []) {
    const p = join(dir, r);
    assert.ok(existsSync(p), `${kfile}: resource ${r} does not exist`);
    if (statSync(p).isDirectory()) objects.push(...render(p, used).objects);
    else {
      used.add(p);
      objects.push(...readDocs(p));
    }
  }
  for (const patch of k.patches ?? []) {
    onlyKeys(patch, ['path', 'target'], kfile);
    onlyKeys(patch.target, ['group', 'version', 'kind', 'name'], kfile);
    const p = join(dir, patch.path);
    used.add(p);
    const t = patch.target;
    const hits = objects.filter((o) => {
      const gv = groupVersion(o.apiVersion);
      return (t.group === undefined || t.group === gv.group) &&
             (t.version === undefined || t.version === gv.version) &&
             (t.kind === undefined || t.kind === o.kind) &&
             (t.name === undefined || t.name === o.metadata?.name);
    });
    assert.ok(hits.length > 0, `${kfile}: patch ${patch.path} matches no resource`);
    for (const o of hits) jsonPatch(o, readDocs(p)[0], p);
  }
  const ids = objects.map((o) => `${o.kind}/${o.metadata?.name}`);
  assert.equal(new Set(ids).size, ids.length, `${kfile}: an object twice: ${ids}`);
  return { objects, used };
}

function yamlFiles(dir) {
  const out = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...yamlFiles(p));
    else if (/\.ya?ml$/.test(e.name)) out.push(p);
  }
  return out.sort();
}

/* Every folder rendered once, here: a folder that does not render fails the
 * first test with the reason, and every other test with it. */
const kustomizations = yamlFiles(K8S).filter((f) => f.endsWith('/kustomization.yaml')).map(dirname);
const used = new Set();
let renders = {}, renderError = null;
try {
  renders = Object.fromEntries(kustomizations.map((d) => [relative(K8S, d), render(d, used).objects]));
} catch (e) {
  renderError = e;
}
const standalone = yamlFiles(K8S).filter((f) => !used.has(f));

// ---- pods and their containers ----------------------------------------------------

/* $(NAME) as the kubelet expands it in args ($$ is a literal $; an unknown
 * name stays as written) */
const expand = (s, env) =>
  String(s).replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, v) =>
    m === '$$' ? '$' : v in env ? env[v] : m);

/* Every pod an object makes, as {what, labels, spec, lws (LeaderWorkerSet
 * environment or null)}: a Deployment's or StatefulSet's one template; a
 * LeaderWorkerSet's leader (index 0) and each worker index 1..size-1. */
function pods(obj) {
  if (obj.kind === 'Deployment' || obj.kind === 'StatefulSet') {
    const t = obj.spec.template;
    return [{ what: `${obj.kind}/${obj.metadata.name}`, labels: t.metadata.labels, spec: t.spec,
              lws: null }];
  }
  if (obj.kind !== 'LeaderWorkerSet') return [];
  const lwt = obj.spec.leaderWorkerTemplate;
  const size = lwt.size ?? 1, name = obj.metadata.name;
  const out = [];
  for (let i = 0; i < size; i++) {
    const t = i === 0 && lwt.leaderTemplate ? lwt.leaderTemplate : lwt.workerTemplate;
    out.push({
      what: `LeaderWorkerSet/${name} ${i === 0 ? 'leader' : `worker ${i}`}`,
      labels: { ...t.metadata?.labels, [`${LWS}/name`]: name, [`${LWS}/worker-index`]: String(i) },
      spec: t.spec,
      lws: {
        LWS_LEADER_ADDRESS: `${name}-0.${name}.default`,
        LWS_GROUP_SIZE: String(size),
        LWS_WORKER_INDEX: String(i),
      },
    });
  }
  return out;
}

const containersOf = (spec) => [...(spec.initContainers ?? []), ...spec.containers];

/* A container's lmserve command: {c, role, argv (expanded), flags, env}. */
function command(pod, c) {
  const env = { ...pod.lws };
  for (const e of c.env ?? []) if (e.value !== undefined) env[e.name] = expand(e.value, env);
  const argv = (c.args ?? []).map((a) => expand(a, env));
  return { c, role: argv[0], argv, flags: parseFlags(argv), env };
}

function commands(pod) {
  return containersOf(pod.spec).map((c) => command(pod, c));
}

const selects = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v) &&
  Object.keys(selector ?? {}).length > 0;

const seconds = (x) => Number(x);

function preStopSleep(c) {
  const cmd = c.lifecycle?.preStop?.exec?.command ?? [];
  return cmd[0] === 'sleep' ? Number(cmd[1]) : 0;
}

/* What every pod of a render must be. */
function checkPod(where, pod) {
  const w = `${where}: ${pod.what}`;
  assert.equal(pod.labels?.['app.kubernetes.io/name'], 'lmserve', `${w}: labelled lmserve`);
  const vols = Object.fromEntries((pod.spec.volumes ?? []).map((v) => [v.name, v]));
  const cmds = commands(pod);
  const grace = pod.spec.terminationGracePeriodSeconds;
  assert.ok(Number.isInteger(grace), `${w}: terminationGracePeriodSeconds set`);
  const sidecars = (pod.spec.initContainers ?? []).map((c) => c.name);
  for (const { c, role, argv, flags } of cmds) {
    const cw = `${w}: container ${c.name}`;
    assert.ok(/^lmserve:/.test(c.image), `${cw}: the lmserve image`);
    assert.equal(c.command, undefined, `${cw}: the image's entrypoint (lmserve) runs`);
    assert.ok(ROLES.includes(role), `${cw}: runs an lmserve role, not ${role}`);
    if (sidecars.includes(c.name))
      assert.equal(c.restartPolicy, 'Always', `${cw}: an init container that keeps running (sidecar)`);
    for (const a of argv) assert.ok(!a.includes('$('), `${cw}: ${a} is not expanded`);
    const known = roleFlags(BIN, role);
    for (const f of Object.keys(flags)) assert.ok(known.has(f), `${cw}: \`lmserve ${role}\` has no ${f}`);
    // the model from the read-only volume of the models claim
    const model = flags['--model'];
    assert.ok(typeof model === 'string', `${cw}: --model`);
    const mount = (c.volumeMounts ?? []).find((m) => model.startsWith(`${m.mountPath}/`));
    assert.ok(mount, `${cw}: --model ${model} is on a mounted volume`);
    assert.ok(mount.readOnly, `${cw}: the model volume is mounted read-only`);
    assert.equal(vols[mount.name]?.persistentVolumeClaim?.claimName, 'lmserve-models',
                 `${cw}: the model volume is the lmserve-models claim`);
    // resources: requests and limits, memory never overcommitted
    const res = c.resources ?? {};
    assert.ok(res.requests?.cpu && res.requests?.memory, `${cw}: CPU and memory requests`);
    assert.ok(res.limits?.memory, `${cw}: a memory limit`);
    assert.equal(res.limits.memory, res.requests.memory, `${cw}: memory limit = request`);
    // devices
    const device = flags['--device'];
    if (role === 'worker' || role === 'serve') {
      assert.ok(device === 'cpu' || device === 'cuda', `${cw}: --device cpu or cuda, not auto`);
      if (device === 'cuda') {
        assert.equal(String(res.limits['nvidia.com/gpu']), '1', `${cw}: one GPU`);
        assert.ok((pod.spec.tolerations ?? []).some((t) => t.key === 'nvidia.com/gpu'),
                  `${cw}: tolerates the GPU nodes' taint`);
      } else {
        assert.equal(res.limits['nvidia.com/gpu'], undefined, `${cw}: no GPU on CPU`);
        assert.equal(flags['--threads'], String(res.limits.cpu), `${cw}: --threads is the CPU limit`);
      }
    } else {
      assert.equal(res.limits['nvidia.com/gpu'], undefined, `${cw}: no GPU for a ${role}`);
    }
    // HTTP: the port, the probes, the drain
    if (role === 'serve' || role === 'frontend') {
      assert.equal(flags['--host'], '0.0.0.0', `${cw}: listens on the pod's addresses`);
      const http = (c.ports ?? []).find((p) => p.name === 'http');
      assert.ok(http, `${cw}: a port named http`);
      assert.equal(String(http.containerPort), flags['--port'], `${cw}: port http is --port`);
      const onHealth = (p) => p?.httpGet?.path === '/health' && p.httpGet.port === 'http';
      assert.ok(onHealth(c.readinessProbe), `${cw}: readiness on /health`);
      assert.ok(onHealth(c.startupProbe), `${cw}: a startup probe on /health (the model load)`);
      assert.ok(c.livenessProbe, `${cw}: a liveness probe`);
      const startup = c.startupProbe.periodSeconds * c.startupProbe.failureThreshold;
      if (role === 'serve')
        assert.ok(startup >= seconds(flags['--ready-timeout']),
                  `${cw}: the startup probe waits --ready-timeout (${startup} s)`);
      else assert.ok(startup >= 600, `${cw}: the startup probe waits 10 minutes (${startup} s)`);
      const drain = seconds(flags['--drain-timeout']);
      assert.ok(drain > 0, `${cw}: --drain-timeout set`);
      const sleepS = preStopSleep(c);
      assert.ok(sleepS > 0, `${cw}: preStop waits for the endpoints to drop the pod`);
      /* serve: the frontend's drain + 2 s, then the scheduler and the worker
       * 5 s each; sidecars likewise stop after the frontend */
      const after = role === 'serve' ? 12 : sidecars.length * 5;
      assert.ok(grace >= sleepS + drain + after,
                `${cw}: terminationGracePeriodSeconds ${grace} covers preStop ${sleepS} + drain ${drain} + ${after}`);
    }
  }
  return cmds;
}

/* A scheduler endpoint on the pod network (ZeroMQ, no authentication) is
 * reachable only from the lmserve pods that connect to it: every pod that
 * binds one is selected by a NetworkPolicy for ingress, and each of its rules
 * that admits the port admits only pods (podSelector), among them every pod
 * that connects there. */
function checkZmqPorts(name, objects, podsOf) {
  const policies = objects.filter((o) => o.kind === 'NetworkPolicy');
  const isLocal = (h) => h === '127.0.0.1' || h === 'localhost';
  for (const p of podsOf) {
    for (const x of commands(p).filter((y) => y.role === 'scheduler')) {
      for (const [flag, peerRole] of [['--frontend-endpoint', 'frontend'], ['--worker-endpoint', 'worker']]) {
        const ep = endpoint(x.flags[flag]);
        if (isLocal(ep.host)) continue;
        const w = `${name}: ${p.what}: ${flag} ${x.flags[flag]}`;
        const portName = (x.c.ports ?? []).find((cp) => cp.containerPort === ep.port)?.name;
        const mine = policies.filter((np) => selects(np.spec.podSelector.matchLabels, p.labels) &&
                                             (np.spec.policyTypes ?? []).includes('Ingress'));
        assert.ok(mine.length > 0, `${w}: a NetworkPolicy guards the pod`);
        const peers = podsOf.filter((q) => commands(q).some(
          (y) => y.role === peerRole && !isLocal(endpoint(y.flags['--scheduler']).host)));
        for (const rule of mine.flatMap((np) => np.spec.ingress ?? [])) {
          const admits = !rule.ports ||
            rule.ports.some((rp) => rp.port === ep.port || (portName && rp.port === portName));
          if (!admits) continue;
          assert.ok((rule.from ?? []).length > 0 && rule.from.every((f) => f.podSelector),
                    `${w}: only pods may reach it`);
          for (const q of peers)
            assert.ok(rule.from.some((f) => selects(f.podSelector.matchLabels, q.labels)),
                      `${w}: ${q.what} may reach it`);
        }
      }
    }
  }
}

function checkRender(name, objects) {
  const podsOf = objects.flatMap(pods);
  const models = new Set(podsOf.flatMap((p) => checkPod(name, p)).map((x) => x.flags['--model']));
  assert.equal(models.size, 1, `${name}: every role reads the same --model (${[...models]})`);
  for (const s of objects.filter((o) => o.kind === 'Service')) {
    const sel = podsOf.filter((p) => selects(s.spec.selector, p.labels));
    assert.ok(sel.length > 0, `${name}: Service ${s.metadata.name} selects pods`);
    for (const port of s.spec.ports) {
      const named = (p) => containersOf(p.spec).some(
        (c) => (c.ports ?? []).some((cp) => cp.name === port.targetPort));
      assert.ok(sel.every(named), `${name}: Service ${s.metadata.name}'s targetPort ${port.targetPort} ` +
                                  'is a named port of every pod it selects');
    }
  }
  const pdbs = objects.filter((o) => o.kind === 'PodDisruptionBudget');
  for (const p of podsOf)
    assert.ok(pdbs.some((b) => selects(b.spec.selector.matchLabels, p.labels)),
              `${name}: ${p.what} has a PodDisruptionBudget`);
  for (const b of pdbs)
    assert.ok(b.spec.maxUnavailable !== undefined || b.spec.minAvailable !== undefined,
              `${name}: PodDisruptionBudget ${b.metadata.name} bounds disruptions`);
  checkZmqPorts(name, objects, podsOf);
  return podsOf;
}

// ---- the tests: rendering and schemas ------------------------------------------------

test('every YAML file is rendered or applied alone, and every object validates', async () => {
  if (renderError) throw renderError;
  assert.ok(kustomizations.length >= 4, 'the kustomization folders');
  for (const f of standalone) {
    const docs = readDocs(f);
    assert.ok(docs.length > 0 && docs.every((d) => d.apiVersion && d.kind),
              `${relative(K8S, f)}: not used by any kustomization, so a manifest of its own`);
    for (const o of docs) {
      const errs = await validate(o);
      assert.deepEqual(errs, [], `${relative(K8S, f)}: ${o.kind}/${o.metadata?.name}`);
    }
  }
  for (const [name, objects] of Object.entries(renders)) {
    assert.ok(objects.length > 0, `${name}: renders objects`);
    for (const o of objects) {
      const errs = await validate(o);
      assert.deepEqual(errs, [], `${name}: ${o.kind}/${o.metadata?.name}`);
    }
  }
});

test('a broken object fails validation', async () => {
  assert.equal(renderError, null, 'every folder renders');
  /* the validators themselves, on copies of the rendered objects broken the
   * ways a manifest edit goes wrong: each must be reported where it is */
  const find = (render, kind) => structuredClone(renders[render].find((o) => o.kind === kind));
  const cases = [
    ['base', 'Deployment', (o) => { o.spec.template.spec.containers[0].livenesProbe = {}; },
     '/spec/template/spec/containers/0/livenesProbe: unknown field'],
    ['base', 'Deployment', (o) => { o.spec.template.spec.containers[0].ports[0].containerPort = '8000'; },
     'containerPort must be integer'],
    ['base', 'Service', (o) => { delete o.spec.ports[0].port; }, 'spec/ports/0 must have required property port'],
    ['tensor-parallel', 'LeaderWorkerSet', (o) => { o.spec.leaderWorkerTemplate.restartPolicy = 'Always'; },
     '/spec/leaderWorkerTemplate/restartPolicy: must be equal to one of the allowed values'],
    ['tensor-parallel', 'LeaderWorkerSet', (o) => { o.spec.leaderWorkerTemplate.sise = 2; },
     '/spec/leaderWorkerTemplate/sise: unknown field'],
    ['tensor-parallel', 'LeaderWorkerSet',
     (o) => { o.spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].arg = []; },
     '/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/arg: unknown field'],
    ['monitoring', 'PodMonitor', (o) => { o.spec.podMetricsEndpoints[0].interval = '15 s'; },
     '/spec/podMetricsEndpoints/0/interval: must match pattern'],
  ];
  for (const [render, kind, breakIt, want] of cases) {
    const o = find(render, kind);
    breakIt(o);
    const errs = await validate(o);
    assert.ok(errs.some((e) => e.includes(want)), `${render} ${kind}: "${want}" in ${JSON.stringify(errs)}`);
  }
});

test('the README gives the command of every folder and file', () => {
  const readme = readFileSync(join(K8S, 'README.md'), 'utf8');
  for (const d of Object.keys(renders))
    assert.ok(readme.includes(`kubectl apply -k deploy/kubernetes/${d}`), `README: ${d}`);
  for (const f of standalone)
    assert.ok(readme.includes(`kubectl apply -f deploy/kubernetes/${relative(K8S, f)}`),
              `README: ${relative(K8S, f)}`);
  assert.ok(readFileSync(join(DEPLOY, 'README.md'), 'utf8').includes('kubernetes/README.md'),
            'deploy/README.md links deploy/kubernetes/README.md');
});

// ---- the tests: each case ------------------------------------------------------------

function singleReplica(name, device) {
  assert.equal(renderError, null, 'every folder renders');
  const objects = renders[name];
  assert.ok(objects, `${name}/ exists`);
  const podsOf = checkRender(name, objects);
  assert.equal(podsOf.length, 1, `${name}: one pod template`);
  const [cmd] = commands(podsOf[0]);
  assert.equal(cmd.role, 'serve', `${name}: each pod is a whole replica (lmserve serve)`);
  assert.equal(cmd.flags['--device'], device, `${name}: --device ${device}`);
  const dep = objects.find((o) => o.kind === 'Deployment');
  assert.ok(dep.spec.replicas >= 1, `${name}: replicas`);
}

test('base/: a replica per pod on CPU', () => singleReplica('base', 'cpu'));
test('gpu/: a replica per pod on one GPU', () => singleReplica('gpu', 'cuda'));

test('tensor-parallel/: a LeaderWorkerSet group is one replica, a rank per pod', () => {
  assert.equal(renderError, null, 'every folder renders');
  const objects = renders['tensor-parallel'];
  const podsOf = checkRender('tensor-parallel', objects);
  const lws = objects.find((o) => o.kind === 'LeaderWorkerSet');
  assert.ok(lws, 'a LeaderWorkerSet');
  const lwt = lws.spec.leaderWorkerTemplate;
  assert.equal(lwt.restartPolicy, 'RecreateGroupOnPodRestart', 'a failed pod recreates its group');
  assert.equal(lws.spec.startupPolicy, 'LeaderCreated',
               'workers start with the leader (the leader is ready only once every rank is)');
  const size = lwt.size;
  assert.ok(size >= 2, 'size: two ranks or more');
  assert.ok(lwt.leaderTemplate, 'a leader template');
  const [leader, ...workers] = podsOf;
  const lc = commands(leader);
  const by = (cmds, role) => cmds.filter((x) => x.role === role);
  assert.equal(by(lc, 'scheduler').length, 1, 'the leader runs the scheduler');
  assert.equal(by(lc, 'frontend').length, 1, 'the leader runs the frontend');
  assert.equal(by(lc, 'worker').length, 1, 'the leader runs one rank');
  const [sched] = by(lc, 'scheduler');
  const [fe] = by(lc, 'frontend');
  assert.equal(sched.flags['--world-size'], String(size), 'the scheduler waits for size ranks');
  const fep = endpoint(sched.flags['--frontend-endpoint']);
  const wep = endpoint(sched.flags['--worker-endpoint']);
  assert.equal(wep.host, '0.0.0.0', "the scheduler's worker endpoint listens on the pod network");
  assert.deepEqual(endpoint(fe.flags['--scheduler']), { host: '127.0.0.1', port: fep.port },
                   "the frontend reaches the scheduler's frontend endpoint in the pod");
  // every rank: its index, the group's size, the leader's scheduler, NCCL on the pod network
  const ranks = [];
  const rawArgs = (x) => x.c.args.join(' ');
  for (const [pod, cmds] of [[leader, lc], ...workers.map((p) => [p, commands(p)])]) {
    const ws = by(cmds, 'worker');
    assert.equal(ws.length, 1, `${pod.what}: one rank`);
    const [w] = ws;
    assert.ok(rawArgs(w).includes('--rank $(LWS_WORKER_INDEX)'), `${pod.what}: --rank from the worker index`);
    assert.ok(rawArgs(w).includes('--world-size $(LWS_GROUP_SIZE)'),
              `${pod.what}: --world-size from the group size`);
    assert.equal(w.flags['--device'], 'cuda', `${pod.what}: the rank on its GPU`);
    assert.equal(w.flags['--local-rank'], '0', `${pod.what}: the pod's one GPU`);
    assert.equal(w.env.NCCL_SOCKET_IFNAME, 'eth0', `${pod.what}: NCCL over the pod network`);
    const ep = endpoint(w.flags['--scheduler']);
    assert.equal(ep.port, wep.port, `${pod.what}: the scheduler's worker port`);
    if (pod === leader) assert.equal(ep.host, '127.0.0.1', 'rank 0 reaches the scheduler in its pod');
    else assert.ok(w.c.args.includes(`tcp://$(LWS_LEADER_ADDRESS):${wep.port}`),
                   `${pod.what}: the scheduler on the leader's address`);
    assert.ok(containersOf(pod.spec).some((c) => (c.volumeMounts ?? []).some(
      (m) => m.mountPath === '/dev/shm')), `${pod.what}: a /dev/shm for NCCL`);
    ranks.push(Number(w.flags['--rank']));
  }
  assert.deepEqual(ranks, [...Array(size).keys()], 'ranks 0..size-1, once each');
  // the API Service: the leaders' frontends, not LeaderWorkerSet's own headless Service
  const svc = objects.find((o) => o.kind === 'Service');
  assert.notEqual(svc.metadata.name, lws.metadata.name,
                  "the Service's name is not the LeaderWorkerSet's (its headless Service has that)");
  assert.equal(svc.spec.selector[`${LWS}/worker-index`], '0', 'the Service selects the leaders');
});

test('data-parallel/: frontends route over every replica', () => {
  assert.equal(renderError, null, 'every folder renders');
  const objects = renders['data-parallel'];
  const podsOf = checkRender('data-parallel', objects);
  const sts = objects.find((o) => o.kind === 'StatefulSet');
  const headless = objects.find((o) => o.kind === 'Service' && o.metadata.name === sts.spec.serviceName);
  assert.ok(headless, "the StatefulSet's Service exists");
  assert.equal(headless.spec.clusterIP, 'None', 'a headless Service (a DNS name per replica)');
  assert.equal(headless.spec.publishNotReadyAddresses, true, 'names resolve before replicas are ready');
  const engine = podsOf.find((p) => p.what === `StatefulSet/${sts.metadata.name}`);
  const ec = commands(engine);
  const sched = ec.find((x) => x.role === 'scheduler');
  const worker = ec.find((x) => x.role === 'worker');
  assert.ok(sched && worker, 'each replica pod runs a scheduler and its worker');
  const fep = endpoint(sched.flags['--frontend-endpoint']);
  const wep = endpoint(sched.flags['--worker-endpoint']);
  assert.equal(fep.host, '0.0.0.0', 'the frontend endpoint listens on the pod network');
  assert.equal(sched.flags['--world-size'], worker.flags['--world-size'], 'the world size agrees');
  assert.deepEqual(endpoint(worker.flags['--scheduler']), { host: '127.0.0.1', port: wep.port },
                   'the worker reaches its scheduler in the pod');
  assert.ok(headless.spec.ports.some((p) => p.port === fep.port), 'the headless Service has the port');
  const fronts = podsOf.filter((p) => commands(p).some((x) => x.role === 'frontend'));
  assert.ok(fronts.length === 1, 'a frontend Deployment');
  const fe = commands(fronts[0]).find((x) => x.role === 'frontend');
  const want = [...Array(sts.spec.replicas).keys()].map(
    (i) => `tcp://${sts.metadata.name}-${i}.${headless.metadata.name}:${fep.port}`);
  assert.deepEqual(flagValues(fe.argv, '--scheduler'), want, 'one --scheduler per replica, in order');
  const dep = objects.find((o) => o.kind === 'Deployment');
  assert.ok(dep.spec.replicas >= 2, 'several frontends share the replicas');
});

test('monitoring: every pod and Service that serves /metrics is scraped', () => {
  assert.equal(renderError, null, 'every folder renders');
  const monitors = [...Object.values(renders).flat(), ...standalone.flatMap(readDocs)]
    .filter((o) => o.apiVersion === 'monitoring.coreos.com/v1');
  const pm = monitors.find((o) => o.kind === 'PodMonitor');
  const sm = monitors.find((o) => o.kind === 'ServiceMonitor');
  assert.ok(pm && sm, 'a PodMonitor and a ServiceMonitor');
  for (const [m, eps] of [[pm, pm.spec.podMetricsEndpoints], [sm, sm.spec.endpoints]]) {
    assert.equal(eps.length, 1, `${m.kind}: one endpoint`);
    assert.equal(eps[0].port, 'http', `${m.kind}: the http port`);
    assert.equal(eps[0].path, '/metrics', `${m.kind}: /metrics`);
  }
  for (const [name, objects] of Object.entries(renders)) {
    for (const p of objects.flatMap(pods)) {
      const http = commands(p).some((x) => x.role === 'serve' || x.role === 'frontend');
      if (http) assert.ok(selects(pm.spec.selector.matchLabels, p.labels), `${name}: ${p.what} scraped`);
    }
    for (const s of objects.filter((o) => o.kind === 'Service'))
      if (s.spec.ports.some((x) => x.name === 'http'))
        assert.ok(selects(sm.spec.selector.matchLabels, s.metadata.labels),
                  `${name}: Service ${s.metadata.name} scraped`);
  }
});

// ---- the LeaderWorkerSet group, run --------------------------------------------------

test('the tensor-parallel group serves greedy output as `lmserve generate` does',
     { timeout: 600000 }, async () => {
  assert.equal(renderError, null, 'every folder renders');
  const lws = renders['tensor-parallel'].find((o) => o.kind === 'LeaderWorkerSet');
  const podsOf = pods(lws);
  const ip = podsOf.map((_, i) => `127.0.0.${60 + i}`);
  const httpPort = await freePort(ip[0]);
  const ids = JSON.parse(execFileSync(BIN, ['generate', '--model', MODEL, '--prompt-ids',
                                            '2,818,5279,563', '--max-tokens', '6'],
                                      { encoding: 'utf8' }).match(/\[[^\]]*\]/)[0]);
  const procs = [];
  let failed = null;
  const start = (pod, i) => {
    /* LeaderWorkerSet's variables, with the leader's address a loopback one */
    const lwsEnv = { ...pod.lws, LWS_LEADER_ADDRESS: ip[0] };
    for (const c of containersOf(pod.spec)) {
      const { role, argv, env } = command({ ...pod, lws: lwsEnv }, c);
      const out = [];
      for (let k = 0; k < argv.length; k++) {
        const prev = argv[k - 1];
        let a = argv[k];
        if (prev === '--model') a = MODEL;
        else if (prev === '--device') a = 'cpu';
        else if (prev === '--port') a = String(httpPort);
        else if (a === '0.0.0.0' || a === '127.0.0.1') a = ip[i];
        else if (a.startsWith('tcp://')) {
          const ep = endpoint(a);
          if (ep.host === '0.0.0.0' || ep.host === '127.0.0.1') a = `tcp://${ip[i]}:${ep.port}`;
        }
        out.push(a);
      }
      if (role === 'worker') out.push('--kv-cache-memory', '64M', '--threads', '1');
      const tag = `${pod.what} ${c.name}`;
      const p = spawn(BIN, out, { env: { ...process.env, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
      p.stderr.on('data', (d) => process.stderr.write(`[${tag}] ${d}`));
      p.on('exit', (code, sig) => { failed ??= `${tag} exited (${code ?? sig})`; });
      procs.push(p);
    }
  };
  const base = `http://${ip[0]}:${httpPort}`;
  try {
    podsOf.forEach(start);
    await until('the group ready', 240000, async () => {
      assert.equal(failed, null);
      return (await status(`${base}/health`)) === 200;
    });
    const detok = await postJson(`${base}/detokenize`, { tokens: ids });
    assert.equal(detok?.status, 200, '/detokenize');
    const r = await postJson(`${base}/v1/completions`,
                             { prompt: [2, 818, 5279, 563], max_tokens: 6, temperature: 0 });
    assert.equal(r?.status, 200, 'a completion through the group');
    assert.equal(r.json.usage.completion_tokens, 6);
    assert.equal(r.json.choices[0].text, detok.json.prompt, 'the same greedy text as generate');
    assert.equal(failed, null);
    /* SIGTERM, as the kubelet sends it: every role stops by itself, cleanly */
    failed = 'stopping';
    const exits = procs.map((p) => new Promise((res) => {
      if (p.exitCode !== null || p.signalCode !== null) res([p.exitCode, p.signalCode]);
      else p.on('exit', (code, sig) => res([code, sig]));
    }));
    for (const p of procs) p.kill('SIGTERM');
    let timer;
    const codes = await Promise.race([
      Promise.all(exits), new Promise((res) => { timer = setTimeout(() => res(null), 30000); })]);
    clearTimeout(timer);
    assert.ok(codes, 'every role stopped within 30 s of SIGTERM');
    for (const [code, sig] of codes) assert.deepEqual([code, sig], [0, null], 'a clean exit');
  } finally {
    failed = 'stopping';
    for (const p of procs) p.kill('SIGTERM');
    await sleep(2000);
    for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  }
});
