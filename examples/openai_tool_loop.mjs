// Quickstart: the `openai` npm package's tool loop through `selfheal serve`.
//
//   selfheal serve --upstream http://127.0.0.1:8080/v1 &      # any OpenAI-compatible server
//   npm install openai
//   OPENAI_BASE_URL=http://127.0.0.1:7420/v1 MODEL=your-model node examples/openai_tool_loop.mjs
//
// The only change an agent needs is the base URL. Each answer carries the gateway's `selfheal`
// report (status, actions taken, budget). Run by the e2e suite (tests/e2e/test_quickstarts.py)
// in front of a fault-injecting upstream.
import OpenAI from "openai";

// maxRetries: 0 — the gateway retries as its policy says.
const client = new OpenAI({
  baseURL: process.env.OPENAI_BASE_URL ?? "http://127.0.0.1:7420/v1",
  apiKey: process.env.OPENAI_API_KEY ?? "unused",
  maxRetries: 0,
});
const model = process.env.MODEL ?? "gpt-4o-mini";

const tools = [{
  type: "function",
  function: {
    name: "lookup",
    description: "Look a key up in the local index.",
    parameters: { type: "object", properties: { key: { type: "string" } }, required: ["key"] },
  },
}];
const lookup = ({ key }) => `ok: ${key === "answer" ? 42 : "unknown"}`;

const messages = [{ role: "user", content: "What is the answer? Use the lookup tool." }];
const reports = [];
let message;
for (let turn = 0; turn < 8; turn++) {
  const r = await client.chat.completions.create({ model, messages, tools });
  reports.push(r.selfheal);
  message = r.choices[0].message;
  if (!message.tool_calls?.length) break;
  messages.push(message);
  for (const call of message.tool_calls) {
    const result = lookup(JSON.parse(call.function.arguments));
    messages.push({ role: "tool", tool_call_id: call.id, content: result });
  }
}
console.log(JSON.stringify({ answer: message.content, selfheal: reports }));
