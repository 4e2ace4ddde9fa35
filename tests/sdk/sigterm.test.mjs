// A stream cut by SIGTERM of the router surfaces in the SDK as an error,
// not as a normal end. The stream must outlive the router's drain
// (--shutdown-timeout, short on the router tests/sdk_test.go starts for
// this): the decode worker is frozen (its --debug-hooks freeze) once the
// stream has begun, then the router gets SIGTERM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { client, model } from './lib.mjs';

const decodeAdmin = process.env.BATON_DECODE_ADMIN;
const pid = Number(process.env.BATON_SIGTERM_PID);

async function admin(path, method = 'POST') {
  const r = await fetch(`http://${decodeAdmin}${path}`, { method });
  const body = await r.text();
  assert.equal(r.status, 200, `${method} ${path}: ${r.status} ${body}`);
  return JSON.parse(body);
}

test('SIGTERM mid-stream is an error in the SDK', async () => {
  assert.ok(decodeAdmin && pid > 0, 'BATON_DECODE_ADMIN and BATON_SIGTERM_PID are not set');
  const openai = client(process.env.BATON_SIGTERM_BASE_URL);
  // The generation may outrun the freeze; then it ends normally and the
  // next attempt tries again. Only a stream that the freeze caught
  // mid-generation is cut.
  for (let attempt = 0; attempt < 10; attempt++) {
    const id = `sdk-sigterm-${process.pid}-${attempt}`;
    const stream = await openai.completions.create(
      { model, prompt: 'Once upon a time', max_tokens: 460, ignore_eos: true, temperature: 0, stream: true },
      { headers: { 'X-Request-Id': id } },
    );
    let chunks = 0;
    let finished = false;
    let cut = false;
    let err = null;
    try {
      for await (const chunk of stream) {
        chunks++;
        if (chunk.choices[0]?.finish_reason) finished = true;
        if (chunks === 1) {
          await admin('/debug/freeze?for=30s');
          const { requests } = await admin('/debug/requests', 'GET');
          if (requests.some((r) => r.request_id.includes(id))) {
            cut = true;
            process.kill(pid, 'SIGTERM');
          } else {
            await admin('/debug/unfreeze');
          }
        }
      }
    } catch (e) {
      err = e;
    } finally {
      await admin('/debug/unfreeze');
    }
    if (!cut) {
      assert.equal(err, null, `attempt ${attempt}: a stream the freeze missed failed: ${err}`);
      continue;
    }
    assert.ok(err instanceof OpenAI.APIError, `the cut stream ended ${err ? `with ${err.constructor.name}: ${err.message}` : `normally after ${chunks} chunks`}, want an APIError`);
    assert.equal(finished, false, 'the cut stream had a finish_reason');
    return;
  }
  assert.fail('10 attempts: the freeze never caught a stream mid-generation');
});
