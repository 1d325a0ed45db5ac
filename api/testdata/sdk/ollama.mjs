// Runs the official Ollama JavaScript library against a meshp2p API:
// chat (whole and streamed), generate (whole and streamed), list (tags),
// show, version, a chat with tools whose answer has tool_calls (whole and
// streamed; then the tool result sent back), and an unknown model as the
// library's ResponseError. The key goes as Authorization: Bearer through
// the headers option.
// Environment: MESHP2P_BASE_URL (the server's root), MESHP2P_API_KEY (may
// be empty), MESHP2P_MODEL, MESHP2P_MAX_TOKENS (num_predict, default 32),
// MESHP2P_TOOLS_OPTIONAL=1 (skip the tool checks when the model answers
// in text; the tool requests send meshp2p's tool_choice extension
// "required", so a call is forced by a grammar even on a model that knows
// nothing of tools). Prints one JSON summary line; exits 1 when an assertion fails. Run
// by api/sdk_test.go through internal/sdktest.
import { Ollama } from 'ollama';

const host = process.env.MESHP2P_BASE_URL;
const key = process.env.MESHP2P_API_KEY || 'no-key';
const model = process.env.MESHP2P_MODEL;
const numPredict = Number(process.env.MESHP2P_MAX_TOKENS || 32);
const summary = { sdk: 'ollama' };

function check(cond, what) {
  if (!cond) throw new Error(`assertion failed: ${what}`);
}

const ollama = new Ollama({ host, headers: { Authorization: `Bearer ${key}` } });
const options = { num_predict: numPredict, temperature: 0 };
const question = { role: 'user', content: 'Say hello in five words.' };
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 } }, required: ['city'] },
  },
}];
const ask = { role: 'user', content: 'What is the weather in Paris? Use the get_weather tool.' };

try {
  const chat = await ollama.chat({ model, messages: [question], options });
  check(chat.done && chat.message.role === 'assistant' && chat.message.content.length > 0, `chat: ${JSON.stringify(chat)}`);
  check(['stop', 'length'].includes(chat.done_reason) && chat.eval_count > 0, `chat counts: ${JSON.stringify(chat)}`);
  summary.chat = { text: chat.message.content, done_reason: chat.done_reason, eval_count: chat.eval_count,
    prompt_eval_count: chat.prompt_eval_count, model: chat.model };

  let text = '';
  let last;
  let parts = 0;
  for await (const part of await ollama.chat({ model, messages: [question], options, stream: true })) {
    text += part.message.content;
    last = part;
    parts++;
  }
  check(text.length > 0 && last.done && parts > 1, `chat stream: ${parts} parts, ${JSON.stringify(last)}`);
  summary.chat_stream = { text, parts, done_reason: last.done_reason };

  const gen = await ollama.generate({ model, prompt: 'Once upon a time', options });
  check(gen.done && gen.response.length > 0, `generate: ${JSON.stringify(gen)}`);
  summary.generate = { text: gen.response, done_reason: gen.done_reason };
  let gtext = '';
  for await (const part of await ollama.generate({ model, prompt: 'Once upon a time', options, stream: true })) {
    gtext += part.response;
    last = part;
  }
  check(gtext.length > 0 && last.done, `generate stream: ${JSON.stringify(last)}`);
  summary.generate_stream = { text: gtext };

  const list = await ollama.list();
  const listed = list.models.find((m) => m.name === model || m.model === model);
  check(listed !== undefined, `list: ${JSON.stringify(list)}`);
  summary.list = { models: list.models.map((m) => m.name), digest: listed.digest, format: listed.details?.format };
  const show = await ollama.show({ model });
  check(typeof show.modelfile === 'string' && show.details !== undefined, `show: ${JSON.stringify(show)}`);
  summary.show = { capabilities: show.capabilities, model_info: show.model_info };
  summary.version = (await ollama.version()).version;

  // tool_choice is meshp2p's extension (Ollama has none): force a call.
  const tc = await ollama.chat({ model, messages: [ask], tools, tool_choice: 'required', options: { ...options, num_predict: 200 } });
  const calls = tc.message.tool_calls ?? [];
  if (calls.length === 0 && process.env.MESHP2P_TOOLS_OPTIONAL === '1') {
    summary.tools = { skipped: `no tool call: ${tc.message.content}` };
    console.log(JSON.stringify(summary));
    process.exit(0);
  }
  check(calls.length > 0 && calls[0].function.name === 'get_weather', `tool call: ${JSON.stringify(tc)}`);
  const args = calls[0].function.arguments;
  check(typeof args === 'object' && args !== null && !Array.isArray(args), `tool arguments: ${JSON.stringify(args)}`);
  summary.tools = { name: calls[0].function.name, arguments: args, calls: calls.length };
  const answer = await ollama.chat({ model, options,
    messages: [ask, tc.message, { role: 'tool', content: '18 degrees and sunny', tool_name: 'get_weather' }] });
  check(answer.message.content.length > 0, `after the tool result: ${JSON.stringify(answer)}`);
  summary.tools.answer = answer.message.content;

  const streamed = [];
  for await (const part of await ollama.chat({ model, messages: [ask], tools, tool_choice: 'required', options: { ...options, num_predict: 200 }, stream: true })) {
    for (const c of part.message.tool_calls ?? []) {
      check(typeof c.function.arguments === 'object', `streamed call arrives whole: ${JSON.stringify(c)}`);
      streamed.push(c.function);
    }
  }
  check(streamed.length > 0 && streamed[0].name === 'get_weather', `streamed tool calls: ${JSON.stringify(streamed)}`);
  summary.stream_tools = { calls: streamed };

  try {
    await ollama.chat({ model: 'no-such-model', messages: [question], options });
    check(false, 'an unknown model was accepted');
  } catch (e) {
    check(e.name === 'ResponseError' && e.status_code === 404, `unknown model: ${e}`);
    summary.not_found = { status: e.status_code, error: e.error };
  }
} catch (e) {
  summary.error = String(e?.stack || e);
  console.log(JSON.stringify(summary));
  process.exit(1);
}
console.log(JSON.stringify(summary));
