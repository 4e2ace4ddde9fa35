// n > 1 through the SDK: several choices of one prompt, whole and streamed
// (the chunks' choices interleaved by index, as OpenAI streams them), with
// usage counting the prompt once; a seeded request gives the same choices
// every time.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, model } from './lib.mjs';

const prompt = 'Once upon a time, there was a little';

test('completions n = 2: two choices, by index, streamed alike', async () => {
  const openai = client();
  const ask = { model, prompt, max_tokens: 8, temperature: 1, seed: 11, n: 2, ignore_eos: true };
  const r = await openai.completions.create(ask);
  assert.equal(r.choices.length, 2);
  r.choices.forEach((c, i) => {
    assert.equal(c.index, i);
    assert.ok(c.text.length > 0, `choice ${i}: empty text`);
    assert.equal(c.finish_reason, 'length');
  });
  const one = await openai.completions.create({ ...ask, n: 1 });
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens, 'the prompt is counted once');
  assert.equal(r.usage.completion_tokens, 16);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 16);
  assert.equal(one.choices[0].text, r.choices[0].text, 'choice 0 is the request with n = 1');
  const again = await openai.completions.create(ask);
  assert.deepEqual(again.choices.map((c) => c.text), r.choices.map((c) => c.text), 'seeded: the same choices again');

  const stream = await openai.completions.create({ ...ask, stream: true, stream_options: { include_usage: true } });
  const texts = ['', ''];
  const order = [];
  let usage;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      texts[c.index] += c.text;
      if (c.text) order.push(c.index);
    }
  }
  assert.deepEqual(texts, r.choices.map((c) => c.text));
  assert.ok(order.includes(0) && order.includes(1), `order ${order}`);
  assert.ok(order.indexOf(1) < order.lastIndexOf(0), `choices interleaved: ${order}`);
  assert.equal(usage.completion_tokens, 16);
});

test('chat n = 3: three messages; the streamed deltas join to them', async () => {
  const openai = client();
  const ask = { model, messages: [{ role: 'user', content: prompt }], max_tokens: 8, temperature: 1, seed: 5, n: 3 };
  const r = await openai.chat.completions.create(ask);
  assert.equal(r.choices.length, 3);
  r.choices.forEach((c, i) => {
    assert.equal(c.index, i);
    assert.equal(c.message.role, 'assistant');
  });
  const stream = await openai.chat.completions.create({ ...ask, stream: true });
  const contents = ['', '', ''];
  const finishes = [0, 0, 0];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      contents[c.index] += c.delta?.content ?? '';
      if (c.finish_reason) finishes[c.index]++;
    }
  }
  assert.deepEqual(contents, r.choices.map((c) => c.message.content));
  assert.deepEqual(finishes, [1, 1, 1]);
});

test('n out of range: 400 naming n', async () => {
  const openai = client();
  for (const n of [0, 17]) {
    await assert.rejects(openai.completions.create({ model, prompt, max_tokens: 4, n }), (e) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, 'n');
      return true;
    });
  }
});
