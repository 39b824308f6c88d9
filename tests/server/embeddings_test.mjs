// client.embeddings.create of the official `openai` npm client against `polychip serve`: it asks
// for base64 and decodes the vectors itself. Prints them as JSON for embeddings_test.cc.
// Usage: node embeddings_test.mjs BASE_URL INPUTS_JSON
import { createRequire } from 'node:module';
import path from 'node:path';

const [baseUrl, inputs] = process.argv.slice(2);
const require = createRequire(path.join(process.env.POLYCHIP_NPM_DIR, 'package.json'));
let OpenAI = require('openai');
OpenAI = OpenAI.default ?? OpenAI.OpenAI ?? OpenAI;
const client = new OpenAI({ baseURL: `${baseUrl}/v1`, apiKey: 'none', maxRetries: 0 });
const r = await client.embeddings.create({ model: 'tiny', input: JSON.parse(inputs) });
if (r.object !== 'list' || !r.usage || r.usage.prompt_tokens <= 0) throw new Error(JSON.stringify(r.usage));
console.log(JSON.stringify(r.data.map((d, i) => {
  if (d.index !== i) throw new Error(`index ${d.index} at ${i}`);
  return Array.from(d.embedding);
})));
