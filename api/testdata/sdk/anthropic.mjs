// Runs the official Anthropic TypeScript SDK against a meshp2p API:
// messages.create (the key as x-api-key), messages.stream (the key as
// Authorization: Bearer, as the SDK sends an apiKey), a tool_use round
// trip (tool_choice "tool" -> tool_use block -> tool_result -> text),
// the same call streamed, and a refused request as the SDK's typed error.
// Environment: MESHP2P_BASE_URL (the server's root, e.g.
// http://127.0.0.1:8080), MESHP2P_API_KEY (may be empty), MESHP2P_MODEL,
// MESHP2P_MAX_TOKENS (max_tokens of the text requests, default 32).
// Prints one JSON summary line; exits 1 when an assertion fails.
// Run by api/sdk_test.go through internal/sdktest.
import Anthropic from '@anthropic-ai/sdk';

const baseURL = process.env.MESHP2P_BASE_URL;
const key = process.env.MESHP2P_API_KEY || 'no-key';
const model = process.env.MESHP2P_MODEL;
const maxTokens = Number(process.env.MESHP2P_MAX_TOKENS || 32);
const summary = { sdk: '@anthropic-ai/sdk' };

function check(cond, what) {
  if (!cond) throw new Error(`assertion failed: ${what}`);
}
const textOf = (msg) => msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

const client = new Anthropic({ baseURL, apiKey: key, maxRetries: 0, timeout: 300_000 });
// Most Anthropic clients send the key as x-api-key.
const keyClient = new Anthropic({ baseURL, apiKey: null, authToken: null, defaultHeaders: { 'x-api-key': key },
  maxRetries: 0, timeout: 300_000 });

const question = { role: 'user', content: 'Say hello in five words.' };
const tools = [{
  name: 'get_weather',
  description: 'The current weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'] },
}];
const ask = { role: 'user', content: 'What is the weather in Paris?' };

try {
  const msg = await keyClient.messages.create({ model, max_tokens: maxTokens, messages: [question] });
  check(msg.type === 'message' && msg.role === 'assistant' && msg.id.startsWith('msg_'), `create: ${JSON.stringify(msg)}`);
  check(textOf(msg).length > 0, 'create: some text');
  check(['end_turn', 'max_tokens'].includes(msg.stop_reason), `create: stop_reason ${msg.stop_reason}`);
  summary.create = { text: textOf(msg), stop_reason: msg.stop_reason, usage: msg.usage, model: msg.model };

  const stream = client.messages.stream({ model, max_tokens: maxTokens, system: 'You are terse.', messages: [question] });
  let streamed = '';
  stream.on('text', (t) => { streamed += t; });
  const final = await stream.finalMessage();
  check(streamed.length > 0 && textOf(final) === streamed, `stream: ${streamed} vs ${JSON.stringify(final)}`);
  summary.stream = { text: streamed, stop_reason: final.stop_reason, usage: final.usage };

  const first = await client.messages.create({ model, max_tokens: 200, tools,
    tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true }, messages: [ask] });
  const use = first.content.find((b) => b.type === 'tool_use');
  check(first.stop_reason === 'tool_use' && use && use.name === 'get_weather', `tool call: ${JSON.stringify(first)}`);
  check(typeof use.input === 'object' && use.input !== null && !Array.isArray(use.input), `tool input: ${JSON.stringify(use.input)}`);
  const second = await client.messages.create({ model, max_tokens: maxTokens, tools, tool_choice: { type: 'none' },
    messages: [ask, { role: 'assistant', content: first.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '18 degrees and sunny' }] }] });
  check(second.stop_reason !== 'tool_use' && textOf(second).length > 0, `after the tool result: ${JSON.stringify(second)}`);
  summary.tools = { tool_use: { id: use.id, name: use.name, input: use.input }, stop_reason: first.stop_reason,
    answer: textOf(second), answer_stop_reason: second.stop_reason };

  const ts = client.messages.stream({ model, max_tokens: 200, tools, tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true }, messages: [ask] });
  let partial = '';
  ts.on('inputJson', (delta) => { partial += delta; });
  const tfinal = await ts.finalMessage();
  const suse = tfinal.content.find((b) => b.type === 'tool_use');
  check(tfinal.stop_reason === 'tool_use' && suse && suse.name === 'get_weather', `streamed tool call: ${JSON.stringify(tfinal)}`);
  check(JSON.stringify(JSON.parse(partial)) === JSON.stringify(suse.input), `streamed input ${partial} vs ${JSON.stringify(suse.input)}`);
  summary.stream_tools = { name: suse.name, input: suse.input, stop_reason: tfinal.stop_reason };

  try {
    await client.messages.create({ model, max_tokens: 8, messages: [question], top_k: -1 });
    check(false, 'top_k -1 was accepted');
  } catch (e) {
    check(e instanceof Anthropic.BadRequestError, `bad request: ${e}`);
    summary.bad_request = { status: e.status, type: e.error?.error?.type, message: e.error?.error?.message };
  }
  try {
    await client.messages.create({ model: 'no-such-model', max_tokens: 8, messages: [question] });
    check(false, 'an unknown model was accepted');
  } catch (e) {
    check(e instanceof Anthropic.NotFoundError, `unknown model: ${e}`);
    summary.not_found = { status: e.status, type: e.error?.error?.type };
  }
} catch (e) {
  summary.error = String(e?.stack || e);
  console.log(JSON.stringify(summary));
  process.exit(1);
}
console.log(JSON.stringify(summary));
