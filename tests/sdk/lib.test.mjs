// The validator itself: it must be able to fail.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { validate } from './lib.mjs';

test('validate finds what is wrong', () => {
  const schema = { type: 'object', properties: { mood: { type: 'string', enum: ['happy', 'sad'] }, done: { type: 'boolean' }, name: { type: 'string', maxLength: 3 } }, required: ['mood', 'done', 'name'], additionalProperties: false };
  assert.deepEqual(validate(schema, { mood: 'sad', done: true, name: 'Tom' }), []);
  assert.equal(validate(schema, { mood: 'mad', done: 1, name: 'Tommy', x: 0 }).length, 4);
  assert.equal(validate(schema, { mood: 'sad' }).length, 2);
  assert.equal(validate(schema, []).length, 1);
});
