// Structured output through the SDK's parse helper: a JSON schema (from
// zod, as the SDK's docs show), 50 seeds sampled at temperature 1, every
// result parses and validates. Validity comes from the constrained decoder:
// stories260K knows nothing of JSON.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { z } from 'zod';
import { zodResponseFormat } from 'openai/helpers/zod';
import { client, model, validate } from './lib.mjs';

const Pet = z.object({
  kind: z.enum(['cat', 'dog', 'bird']),
  happy: z.boolean(),
  name: z.string().max(12),
});

test('chat.completions.parse with a JSON schema: 50 seeds, all valid', async () => {
  const openai = client();
  const format = zodResponseFormat(Pet, 'pet');
  const schema = format.json_schema.schema;
  const bad = [];
  for (let seed = 0; seed < 50; seed++) {
    const r = await openai.chat.completions.parse({
      model, messages: [{ role: 'user', content: 'Once upon a time there was a pet.' }],
      response_format: format, max_tokens: 160, temperature: 1, seed,
    });
    const msg = r.choices[0].message;
    const errs = validate(schema, JSON.parse(msg.content));
    if (errs.length) bad.push(`seed ${seed}: ${msg.content}: ${errs.join('; ')}`);
    // parse ran zod on it too; what it returned is the content's value.
    assert.deepEqual(msg.parsed, JSON.parse(msg.content), `seed ${seed}`);
    assert.equal(r.choices[0].finish_reason, 'stop', `seed ${seed}: ${msg.content}`);
  }
  assert.deepEqual(bad, []);
});
