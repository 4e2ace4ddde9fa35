// Shared setup for the SDK tests: the official openai package pointed at the
// Baton router that tests/sdk_test.go started (OPENAI_BASE_URL), and small
// validators for the schemas the tests ask for.
import OpenAI from 'openai';

export const model = process.env.BATON_MODEL || 'stories260K';

export function client(baseURL = process.env.OPENAI_BASE_URL) {
  if (!baseURL) {
    throw new Error('OPENAI_BASE_URL is not set: run these tests through tests/sdk_test.go (go test -tags e2e -run TestOpenAISDK ./tests/)');
  }
  // No retries: a failure must show as it happened.
  return new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || 'sk-baton-sdk-test', maxRetries: 0, timeout: 60_000 });
}

// validate checks value against a JSON Schema of the small subset these
// tests use (object with properties/required/additionalProperties, string
// with enum and maxLength, boolean, integer) and returns the problems found.
export function validate(schema, value, path = '$') {
  const errs = [];
  const type = Array.isArray(value) ? 'array' : value === null ? 'null' : typeof value;
  if (schema.enum && !schema.enum.some((e) => e === value)) errs.push(`${path}: ${JSON.stringify(value)} not in ${JSON.stringify(schema.enum)}`);
  switch (schema.type) {
    case 'object': {
      if (type !== 'object') return [`${path}: ${type}, want object`];
      for (const k of schema.required || []) if (!(k in value)) errs.push(`${path}: missing required ${k}`);
      for (const [k, v] of Object.entries(value)) {
        const sub = schema.properties?.[k];
        if (!sub) {
          if (schema.additionalProperties === false) errs.push(`${path}: unexpected property ${k}`);
          continue;
        }
        errs.push(...validate(sub, v, `${path}.${k}`));
      }
      break;
    }
    case 'string':
      if (type !== 'string') return [`${path}: ${type}, want string`];
      if (schema.maxLength !== undefined && [...value].length > schema.maxLength) errs.push(`${path}: ${[...value].length} characters, maxLength ${schema.maxLength}`);
      break;
    case 'boolean':
      if (type !== 'boolean') errs.push(`${path}: ${type}, want boolean`);
      break;
    case 'integer':
      if (!Number.isInteger(value)) errs.push(`${path}: ${JSON.stringify(value)}, want integer`);
      break;
    default:
      errs.push(`${path}: schema type ${schema.type} is not supported by this validator`);
  }
  return errs;
}
