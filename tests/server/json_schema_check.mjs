// A validator for the JSON Schema subset the server tests use ($ref, anyOf, enum, type, bounds,
// required, properties, additionalProperties): a test must not trust the server's own engine.
export function validate(schema, v, root = schema, at = '$') {
  if (schema.$ref) {
    const target = schema.$ref.split('/').slice(1).reduce((n, k) => n[k], root);
    return validate(target, v, root, at);
  }
  if (schema.anyOf) {
    const errors = schema.anyOf.map((s) => { try { validate(s, v, root, at); return null; } catch (e) { return e; } });
    if (errors.every((e) => e)) throw new Error(`${at}: matches no anyOf branch`);
    return;
  }
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) {
    throw new Error(`${at}: ${JSON.stringify(v)} not in enum`);
  }
  const type = Array.isArray(v) ? 'array' : v === null ? 'null' : typeof v;
  const want = schema.type;
  if (want === 'integer') {
    if (!Number.isInteger(v)) throw new Error(`${at}: not an integer`);
  } else if (want && want !== type) {
    throw new Error(`${at}: ${type}, expected ${want}`);
  }
  if (schema.minimum !== undefined && v < schema.minimum) throw new Error(`${at}: below minimum`);
  if (schema.maximum !== undefined && v > schema.maximum) throw new Error(`${at}: above maximum`);
  if (type === 'string') {
    const n = [...v].length;
    if (schema.minLength !== undefined && n < schema.minLength) throw new Error(`${at}: too short`);
    if (schema.maxLength !== undefined && n > schema.maxLength) throw new Error(`${at}: too long`);
  }
  if (type === 'array') {
    if (schema.minItems !== undefined && v.length < schema.minItems) throw new Error(`${at}: too few items`);
    if (schema.maxItems !== undefined && v.length > schema.maxItems) throw new Error(`${at}: too many items`);
    v.forEach((x, i) => schema.items && validate(schema.items, x, root, `${at}[${i}]`));
  }
  if (type === 'object') {
    for (const r of schema.required ?? []) if (!(r in v)) throw new Error(`${at}: missing ${r}`);
    for (const [k, x] of Object.entries(v)) {
      const sub = schema.properties?.[k];
      if (!sub && schema.additionalProperties === false) throw new Error(`${at}: extra key ${k}`);
      if (sub) validate(sub, x, root, `${at}.${k}`);
    }
  }
}
