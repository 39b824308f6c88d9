// Checks Kubernetes manifests against the Kubernetes API's schemas, offline:
//   node validate_k8s.mjs MANIFEST.yaml...
// Each document goes through two checks from the npm package kubernetes-models (generated from
// the API's OpenAPI definitions): its JSON-schema validator (types, required fields, formats
// such as int32 and IntOrString) and its TypeScript interfaces, compiled with tsc against the
// document as an object literal, which also refuses a field the API does not have (a misspelt
// `readinessProbe` or `httpGett`: the schemas allow unknown fields, and only the API server's
// strict field validation would catch them). Packages come from $POLYCHIP_NPM_DIR/node_modules
// (tests/setup/setup-test-deps.sh). Exit status 0 when every document passes.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const modules = path.join(process.env.POLYCHIP_NPM_DIR || '', 'node_modules');
const models = path.join(modules, 'kubernetes-models');
const { parseAllDocuments } = await import(
  pathToFileURL(path.join(modules, 'yaml', 'dist', 'index.js')).href);

// "apps/v1" + "Deployment" -> kubernetes-models/apps/v1/Deployment(.js|.d.ts); "v1" is the core
// group, at the package's top.
function modelFile(apiVersion, kind) {
  return path.join(models, ...String(apiVersion).split('/'), kind);
}

const failures = [];
const literals = [];
for (const file of process.argv.slice(2)) {
  const text = fs.readFileSync(file, 'utf8');
  parseAllDocuments(text).forEach((doc, i) => {
    const where = `${file} document ${i + 1}`;
    if (doc.errors.length) {
      failures.push(`${where}: YAML: ${doc.errors.map((e) => e.message).join('; ')}`);
      return;
    }
    const obj = doc.toJS();
    if (obj === null) return;
    const base = modelFile(obj.apiVersion, obj.kind);
    if (!fs.existsSync(base + '.js')) {
      failures.push(`${where}: no schema for apiVersion ${obj.apiVersion}, kind ${obj.kind}`);
      return;
    }
    literals.push({ where, obj, base, name: `${obj.kind} ${obj.metadata?.name ?? ''}` });
  });
}

// 1. The JSON-schema validators.
for (const l of literals) {
  const mod = await import(pathToFileURL(l.base + '.js').href);
  const Model = mod[l.obj.kind];
  try {
    new Model(l.obj).validate();
  } catch (e) {
    failures.push(`${l.where} (${l.name}): ${e.message}`);
  }
}

// 2. The interfaces: one `const` per document, typed by its kind's interface, compiled by tsc.
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'polychip-k8s-'));
try {
  let ts = '';
  literals.forEach((l, i) => {
    ts += `import type { I${l.obj.kind} as T${i} } from ${JSON.stringify(l.base + '.js')};\n`;
    ts += `// ${l.where} (${l.name})\nexport const doc${i}: T${i} = ${JSON.stringify(l.obj, null, 1)};\n`;
  });
  const source = path.join(dir, 'manifests.ts');
  fs.writeFileSync(source, ts);
  try {
    execFileSync(process.execPath, [
      path.join(modules, 'typescript', 'bin', 'tsc'), '--noEmit', '--strict',
      '--module', 'nodenext', '--moduleResolution', 'nodenext', '--target', 'es2022',
      '--skipLibCheck', source,
    ], { encoding: 'utf8', stdio: 'pipe' });
  } catch (e) {
    // tsc names the line of the generated file: say which document it is in.
    const lines = ts.split('\n');
    for (const m of String(e.stdout).matchAll(/manifests\.ts\((\d+),\d+\): (.*)/g)) {
      let doc = '';
      for (let n = Number(m[1]) - 1; n >= 0 && !doc; --n) {
        if (lines[n].startsWith('// ')) doc = lines[n].slice(3);
      }
      failures.push(`${doc}: ${m[2]} [line ${m[1]} of the generated ${source}]`);
    }
    if (!failures.length) failures.push(`tsc failed: ${e.stdout}${e.stderr}`);
  }
} finally {
  if (!failures.length) fs.rmSync(dir, { recursive: true, force: true });
}

if (failures.length) {
  console.log(failures.join('\n'));
  process.exit(1);
}
console.log(`${literals.length} documents valid: ${literals.map((l) => l.name).join(', ')}`);
