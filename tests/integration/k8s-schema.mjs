// k8s-schema.mjs — validation of Kubernetes objects for the manifests' test
// (kubernetes.mjs), offline:
//
//   - built-in kinds by kubernetes-models' validators, compiled from the
//     Kubernetes OpenAPI schema (types, required fields, enums, formats);
//   - unknown fields, which that schema lets through but `kubectl apply`
//     rejects (server-side field validation is strict by default), by
//     walking each object along the field lists that kubernetes-models
//     declares for every API type (its .d.ts interfaces);
//   - LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) and the Prometheus
//     Operator's PodMonitor and ServiceMonitor (monitoring.coreos.com/v1) by
//     JSON Schemas written here from their published Go API types, with every
//     embedded pod template, object meta and label selector checked as the
//     built-in kinds are.
//
// validate(obj) returns a list of "path: problem" strings, empty when valid.
import { readFileSync, existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import Ajv from 'ajv';

/* where node finds the packages from here: the source tree's node_modules */
const nodeModules = fileURLToPath(new URL('../../node_modules/', import.meta.url));
const modelsDir = join(nodeModules, 'kubernetes-models');
const apimachineryDir = join(nodeModules, '@kubernetes-models', 'apimachinery');

/* kubernetes-models module (relative to the package) of each kind we use */
const BUILTIN = {
  'apps/v1 Deployment': 'apps/v1/Deployment',
  'apps/v1 StatefulSet': 'apps/v1/StatefulSet',
  'v1 Service': 'v1/Service',
  'v1 PersistentVolumeClaim': 'v1/PersistentVolumeClaim',
  'policy/v1 PodDisruptionBudget': 'policy/v1/PodDisruptionBudget',
  'networking.k8s.io/v1 NetworkPolicy': 'networking.k8s.io/v1/NetworkPolicy',
};
const POD_TEMPLATE = 'v1/PodTemplateSpec';

const modelCache = {};
async function model(mod) {
  if (!modelCache[mod]) {
    const m = await import(`kubernetes-models/${mod}`);
    modelCache[mod] = m[mod.split('/').pop()];
  }
  return modelCache[mod];
}

/* ---- unknown fields, from the .d.ts interfaces ------------------------------ */

const ifaceCache = {};

/* {fields: {name: referenced .d.ts file or null}} of the interface declared in
 * file, or null when the file declares none (a scalar such as IntOrString). */
function iface(file) {
  if (file in ifaceCache) return ifaceCache[file];
  const text = readFileSync(file, 'utf8');
  const imports = {};
  for (const m of text.matchAll(/^import \{ (\w+) \} from "([^"]+)";$/gm)) {
    let p = m[2];
    if (p.startsWith('.')) p = join(dirname(file), p.replace(/\.js$/, ''));
    else if (p.startsWith('@kubernetes-models/apimachinery/'))
      p = join(apimachineryDir, p.slice('@kubernetes-models/apimachinery/'.length));
    else continue;
    imports[m[1]] = `${p}.d.ts`;
  }
  const body = /^export interface \w+(?: extends TypeMeta)? \{\n([\s\S]*?)\n\}/m.exec(text);
  if (!body) return (ifaceCache[file] = null);
  const fields = {};
  for (const m of body[1].matchAll(/^ {4}"([^"]+)"\??: (.*)$/gm)) {
    const ref = /^(?:Array<)?(\w+)>?;$/.exec(m[2]);
    fields[m[1]] = ref && imports[ref[1]] ? imports[ref[1]] : null;
  }
  return (ifaceCache[file] = { fields });
}

function unknownFields(value, file, path, out) {
  const t = iface(file);
  if (!t || value === null || typeof value !== 'object') return;
  if (Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, file, `${path}/${i}`, out));
    return;
  }
  for (const [k, v] of Object.entries(value)) {
    if (!(k in t.fields)) out.push(`${path}/${k}: unknown field`);
    else if (t.fields[k] && existsSync(t.fields[k])) unknownFields(v, t.fields[k], `${path}/${k}`, out);
  }
}

async function checkBuiltin(mod, value, path, out) {
  const Model = await model(mod);
  try {
    new Model(value).validate();
  } catch (e) {
    out.push(path ? `${path}: ${e.message}` : e.message);
  }
  unknownFields(value, join(modelsDir, `${mod}.d.ts`), path, out);
}

/* ---- the custom resources' schemas --------------------------------------------- */

/* Subtrees that are built-in API types: checked by checkBuiltin afterwards. */
const builtin = (mod) => ({ type: 'object', 'x-builtin': mod });
const objectMeta = {
  type: 'object',
  required: ['name'],
  'x-builtin-meta': true,
};
const labelSelector = { type: 'object', 'x-builtin-selector': true };
const int32 = (minimum = -2147483648, maximum = 2147483647) => ({ type: 'integer', minimum, maximum });
const intOrString = { anyOf: [{ type: 'integer' }, { type: 'string', pattern: '^[0-9]+%?$' }] };
const strict = (properties, required = []) => ({
  type: 'object',
  additionalProperties: false,
  properties,
  required,
});
const typeMeta = (apiVersion, kind) => ({ apiVersion: { const: apiVersion }, kind: { const: kind } });

/* kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go */
const leaderWorkerSet = strict(
  {
    ...typeMeta('leaderworkerset.x-k8s.io/v1', 'LeaderWorkerSet'),
    metadata: objectMeta,
    spec: strict(
      {
        replicas: int32(0, 1000000),
        leaderWorkerTemplate: strict(
          {
            leaderTemplate: builtin(POD_TEMPLATE),
            workerTemplate: builtin(POD_TEMPLATE),
            size: int32(1), // the leader alone is 1
            restartPolicy: {
              enum: ['Default', 'RecreateGroupOnPodRestart', 'RecreateGroupAfterStart', 'None'],
            },
            subGroupPolicy: strict({
              subGroupPolicyType: { enum: ['LeaderWorker', 'LeaderExcluded'] },
              subGroupSize: int32(1),
            }),
            volumeClaimTemplates: { type: 'array', items: builtin('v1/PersistentVolumeClaim') },
            persistentVolumeClaimRetentionPolicy: strict({
              whenDeleted: { enum: ['Retain', 'Delete'] },
              whenScaled: { enum: ['Retain', 'Delete'] },
            }),
          },
          ['workerTemplate'],
        ),
        rolloutStrategy: strict(
          {
            type: { enum: ['RollingUpdate'] },
            rollingUpdateConfiguration: strict({
              partition: int32(0),
              maxUnavailable: intOrString,
              maxSurge: intOrString,
            }),
          },
          ['type'],
        ),
        startupPolicy: { enum: ['LeaderCreated', 'LeaderReady'] },
        networkConfig: strict(
          { subdomainPolicy: { enum: ['Shared', 'UniquePerReplica'] } },
          ['subdomainPolicy'],
        ),
      },
      ['leaderWorkerTemplate'],
    ),
  },
  ['apiVersion', 'kind', 'metadata', 'spec'],
);

/* prometheus-operator pkg/apis/monitoring/v1: Duration, RelabelConfig, the
 * endpoint fields (HTTP client settings are accepted by name, not described) */
const duration = {
  type: 'string',
  pattern: '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$',
};
const relabel = strict({
  sourceLabels: { type: 'array', items: { type: 'string' } },
  separator: { type: 'string' },
  targetLabel: { type: 'string' },
  regex: { type: 'string' },
  modulus: { type: 'integer', minimum: 0 },
  replacement: { type: 'string' },
  action: {
    enum: ['replace', 'Replace', 'keep', 'Keep', 'drop', 'Drop', 'hashmod', 'HashMod', 'labelmap',
           'LabelMap', 'labeldrop', 'LabelDrop', 'labelkeep', 'LabelKeep', 'lowercase', 'Lowercase',
           'uppercase', 'Uppercase', 'keepequal', 'KeepEqual', 'dropequal', 'DropEqual'],
  },
});
const httpClient = Object.fromEntries(
  ['authorization', 'basicAuth', 'oauth2', 'bearerTokenSecret', 'tlsConfig', 'proxyConnectHeader']
    .map((k) => [k, { type: 'object' }]).concat(
      ['followRedirects', 'enableHttp2', 'proxyFromEnvironment'].map((k) => [k, { type: 'boolean' }]),
      ['proxyUrl', 'noProxy'].map((k) => [k, { type: 'string' }])));
const scrapeEndpoint = {
  path: { type: 'string' },
  scheme: { enum: ['http', 'https', 'HTTP', 'HTTPS'] },
  params: { type: 'object', additionalProperties: { type: 'array', items: { type: 'string' } } },
  interval: duration,
  scrapeTimeout: duration,
  honorLabels: { type: 'boolean' },
  honorTimestamps: { type: 'boolean' },
  trackTimestampsStaleness: { type: 'boolean' },
  metricRelabelings: { type: 'array', items: relabel },
  relabelings: { type: 'array', items: relabel },
  filterRunning: { type: 'boolean' },
  targetPort: intOrString,
  ...httpClient,
};
const limits = Object.fromEntries(
  ['sampleLimit', 'targetLimit', 'labelLimit', 'labelNameLengthLimit', 'labelValueLengthLimit',
   'keepDroppedTargets'].map((k) => [k, { type: 'integer', minimum: 0 }]));
const monitorSpec = {
  jobLabel: { type: 'string' },
  podTargetLabels: { type: 'array', items: { type: 'string' } },
  selector: labelSelector,
  selectorMechanism: { enum: ['RelabelConfig', 'RoleSelector'] },
  namespaceSelector: strict({
    any: { type: 'boolean' },
    matchNames: { type: 'array', items: { type: 'string' } },
  }),
  scrapeProtocols: { type: 'array', items: { type: 'string' } },
  fallbackScrapeProtocol: { type: 'string' },
  attachMetadata: strict({ node: { type: 'boolean' } }),
  scrapeClass: { type: 'string' },
  bodySizeLimit: { type: 'string' },
  ...limits,
};
const podMonitor = strict(
  {
    ...typeMeta('monitoring.coreos.com/v1', 'PodMonitor'),
    metadata: objectMeta,
    spec: strict(
      {
        ...monitorSpec,
        podMetricsEndpoints: {
          type: 'array',
          items: strict({ port: { type: 'string' }, portNumber: int32(1, 65535), ...scrapeEndpoint }),
        },
      },
      ['selector'],
    ),
  },
  ['apiVersion', 'kind', 'metadata', 'spec'],
);
const serviceMonitor = strict(
  {
    ...typeMeta('monitoring.coreos.com/v1', 'ServiceMonitor'),
    metadata: objectMeta,
    spec: strict(
      {
        ...monitorSpec,
        targetLabels: { type: 'array', items: { type: 'string' } },
        serviceDiscoveryRole: { enum: ['Endpoints', 'EndpointSlice'] },
        endpoints: {
          type: 'array',
          items: strict({ port: { type: 'string' }, bearerTokenFile: { type: 'string' },
                          ...scrapeEndpoint }),
        },
      },
      ['selector', 'endpoints'],
    ),
  },
  ['apiVersion', 'kind', 'metadata', 'spec'],
);

const ajv = new Ajv({ allErrors: true, strict: false });
const CUSTOM = {
  'leaderworkerset.x-k8s.io/v1 LeaderWorkerSet': ajv.compile(leaderWorkerSet),
  'monitoring.coreos.com/v1 PodMonitor': ajv.compile(podMonitor),
  'monitoring.coreos.com/v1 ServiceMonitor': ajv.compile(serviceMonitor),
};
const CUSTOM_SCHEMA = {
  'leaderworkerset.x-k8s.io/v1 LeaderWorkerSet': leaderWorkerSet,
  'monitoring.coreos.com/v1 PodMonitor': podMonitor,
  'monitoring.coreos.com/v1 ServiceMonitor': serviceMonitor,
};

/* The built-in subtrees of value under schema (x-builtin marks), as [module or
 * meta/selector, value, path]. */
function builtinParts(schema, value, path, out) {
  if (value === undefined || value === null || !schema) return;
  if (schema['x-builtin']) out.push([schema['x-builtin'], value, path]);
  else if (schema['x-builtin-meta']) out.push(['meta', value, path]);
  else if (schema['x-builtin-selector']) out.push(['selector', value, path]);
  else if (schema.properties && typeof value === 'object')
    for (const [k, s] of Object.entries(schema.properties)) builtinParts(s, value[k], `${path}/${k}`, out);
  else if (schema.items && Array.isArray(value))
    value.forEach((v, i) => builtinParts(schema.items, v, `${path}/${i}`, out));
}

const APIMACHINERY = {
  meta: 'apis/meta/v1/ObjectMeta',
  selector: 'apis/meta/v1/LabelSelector',
};

export async function validate(obj) {
  const out = [];
  if (!obj || typeof obj !== 'object' || Array.isArray(obj)) return ['the document is not an object'];
  const key = `${obj.apiVersion} ${obj.kind}`;
  if (BUILTIN[key]) {
    await checkBuiltin(BUILTIN[key], obj, '', out);
  } else if (CUSTOM[key]) {
    const v = CUSTOM[key];
    if (!v(obj))
      for (const e of v.errors)
        out.push(e.keyword === 'additionalProperties'
                   ? `${e.instancePath}/${e.params.additionalProperty}: unknown field`
                   : `${e.instancePath}: ${e.message}`);
    const parts = [];
    builtinParts(CUSTOM_SCHEMA[key], obj, '', parts);
    for (const [mod, value, path] of parts) {
      if (mod === 'meta' || mod === 'selector') {
        const m = await import(`@kubernetes-models/apimachinery/${APIMACHINERY[mod]}`);
        const Model = m[APIMACHINERY[mod].split('/').pop()];
        try {
          new Model(value).validate();
        } catch (e) {
          out.push(`${path}: ${e.message}`);
        }
        unknownFields(value, join(apimachineryDir, `${APIMACHINERY[mod]}.d.ts`), path, out);
      } else {
        await checkBuiltin(mod, value, path, out);
      }
    }
  } else {
    out.push(`${key}: not a kind these manifests use (add its schema to k8s-schema.mjs)`);
  }
  if (!obj.metadata?.name) out.push('/metadata/name: missing');
  else if (!/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(obj.metadata.name) || obj.metadata.name.length > 63)
    out.push(`/metadata/name: ${obj.metadata.name} is not a DNS-1123 label`);
  return out;
}
