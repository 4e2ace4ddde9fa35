// An unknown top-level field is refused, as OpenAI refuses it, and the SDK
// raises BadRequestError naming the field.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { client, model } from './lib.mjs';

test('an unknown field is a BadRequestError', async () => {
  const openai = client();
  await assert.rejects(
    openai.completions.create({ model, prompt: 'Once upon a time', max_token: 5 }),
    (err) => {
      assert.ok(err instanceof OpenAI.BadRequestError, `${err?.constructor?.name}: ${err?.message}`);
      assert.equal(err.status, 400);
      assert.equal(err.param, 'max_token');
      assert.match(err.message, /Unrecognized request argument supplied: max_token/);
      return true;
    },
  );
  await assert.rejects(
    openai.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], guided_json: { type: 'object' } }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === 'guided_json',
  );
});
