// A required tool call: returned as tool_calls whose arguments parse and
// match the function's parameters schema, and the streamed deltas
// reassemble to the same call.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, model, validate } from './lib.mjs';

const parameters = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 12 }, unit: { type: 'string', enum: ['c', 'f'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters, strict: true } }];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

test('tool_choice required: a call whose arguments match the schema, streamed the same', async () => {
  const openai = client();
  const r = await openai.chat.completions.create({ model, messages, tools, tool_choice: 'required', max_tokens: 160, temperature: 0 });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  const calls = choice.message.tool_calls;
  assert.ok(Array.isArray(calls) && calls.length >= 1, `tool_calls ${JSON.stringify(choice.message)}`);
  const call = calls[0];
  assert.equal(call.type, 'function');
  assert.ok(typeof call.id === 'string' && call.id.length > 0, `id ${call.id}`);
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.deepEqual(validate(parameters, args), [], call.function.arguments);

  // The parse helper reads a strict tool's arguments itself.
  const parsed = await openai.chat.completions.parse({ model, messages, tools, tool_choice: 'required', max_tokens: 160, temperature: 0 });
  assert.deepEqual(parsed.choices[0].message.tool_calls[0].function.parsed_arguments, args);

  // Streamed: deltas by index, the id and name once, the arguments in pieces.
  const stream = await openai.chat.completions.create({ model, messages, tools, tool_choice: 'required', max_tokens: 160, temperature: 0, stream: true });
  const got = [];
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.finish_reason) finish = c.finish_reason;
    for (const d of c.delta?.tool_calls ?? []) {
      const cur = (got[d.index] ??= { id: '', type: '', name: '', arguments: '' });
      if (d.id) cur.id = d.id;
      if (d.type) cur.type = d.type;
      cur.name += d.function?.name ?? '';
      cur.arguments += d.function?.arguments ?? '';
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(got.length, calls.length);
  assert.ok(got[0].id.length > 0, 'streamed call has no id');
  assert.equal(got[0].type, 'function');
  assert.equal(got[0].name, call.function.name);
  assert.equal(got[0].arguments, call.function.arguments);
  assert.deepEqual(JSON.parse(got[0].arguments), args);
});
