// Logprobs through the SDK: the tokens concatenate to the text, and echo
// with max_tokens 0 (the loglikelihood request eval harnesses send) gives
// one logprob per prompt token.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, model } from './lib.mjs';

const prompt = 'Once upon a time, there was a little';

test('chat logprobs: the bytes and the tokens join to the content', async () => {
  const openai = client();
  const r = await openai.chat.completions.create({
    model, messages: [{ role: 'user', content: prompt }], max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  const { message, logprobs } = r.choices[0];
  assert.ok(message.content.length > 0, 'empty content');
  assert.equal(logprobs.content.length, r.usage.completion_tokens);
  const bytes = Buffer.from(logprobs.content.flatMap((t) => t.bytes));
  assert.equal(bytes.toString('utf8'), message.content);
  assert.deepEqual(bytes, Buffer.from(message.content, 'utf8'));
  assert.equal(logprobs.content.map((t) => t.token).join(''), message.content);
  for (const t of logprobs.content) {
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(t.logprob <= 0 && Number.isFinite(t.logprob), `logprob ${t.logprob}`);
    // Greedy: the chosen token is the most likely.
    assert.equal(t.top_logprobs[0].token, t.token);
    assert.equal(t.top_logprobs[0].logprob, t.logprob);
  }

  // Streamed: the chunks' logprobs join to the streamed content.
  const stream = await openai.chat.completions.create({
    model, messages: [{ role: 'user', content: prompt }], max_tokens: 24, temperature: 0, logprobs: true, stream: true,
  });
  let content = '';
  const parts = [];
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta?.content ?? '';
    parts.push(...(c.logprobs?.content ?? []));
  }
  assert.equal(content, message.content);
  assert.equal(Buffer.from(parts.flatMap((t) => t.bytes)).toString('utf8'), content);
});

test('completions logprobs: tokens join to the text, offsets count from the prompt', async () => {
  const openai = client();
  const r = await openai.completions.create({ model, prompt, max_tokens: 24, temperature: 0, logprobs: 2 });
  const { text, logprobs } = r.choices[0];
  assert.ok(text.length > 0, 'empty text');
  assert.equal(logprobs.tokens.join(''), text);
  assert.equal(logprobs.tokens.length, r.usage.completion_tokens);
  let at = [...prompt].length;
  logprobs.tokens.forEach((tok, i) => {
    assert.equal(logprobs.text_offset[i], at, `text_offset[${i}] of ${JSON.stringify(tok)}`);
    at += [...tok].length;
    const top = logprobs.top_logprobs[i];
    assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 2, `top_logprobs[${i}] ${JSON.stringify(top)}`);
    assert.equal(top[tok], logprobs.token_logprobs[i], `the greedy token ${JSON.stringify(tok)} is among its top_logprobs`);
  });
});

test('echo with max_tokens 0: one logprob per prompt token, the prompt as the text', async () => {
  const openai = client();
  const r = await openai.completions.create({ model, prompt, max_tokens: 0, echo: true, logprobs: 1, temperature: 0 });
  const { text, logprobs, finish_reason } = r.choices[0];
  assert.equal(text, prompt);
  assert.equal(finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 0);
  assert.equal(logprobs.tokens.length, r.usage.prompt_tokens);
  assert.equal(logprobs.token_logprobs.length, r.usage.prompt_tokens);
  assert.equal(logprobs.token_logprobs[0], null, 'the first token has no logprob');
  assert.equal(logprobs.top_logprobs[0], null);
  for (let i = 1; i < logprobs.tokens.length; i++) {
    const lp = logprobs.token_logprobs[i];
    assert.ok(typeof lp === 'number' && lp <= 0 && Number.isFinite(lp), `token_logprobs[${i}] = ${lp}`);
  }
  assert.equal(logprobs.text_offset[0], 0);

  // And with a completion after the prompt: the text starts with it.
  const more = await openai.completions.create({ model, prompt, max_tokens: 5, echo: true, logprobs: 1, temperature: 0 });
  const c = more.choices[0];
  assert.ok(c.text.startsWith(prompt) && c.text.length > prompt.length, c.text);
  assert.equal(c.logprobs.tokens.length, more.usage.prompt_tokens + more.usage.completion_tokens);
});
