// Quickstart: the Vercel AI SDK (`ai` with `@ai-sdk/openai`) through `selfheal serve`.
//
//   selfheal serve --upstream http://127.0.0.1:8080/v1 &      # any OpenAI-compatible server
//   npm install ai @ai-sdk/openai zod
//   OPENAI_BASE_URL=http://127.0.0.1:7420/v1 MODEL=your-model node examples/vercel_ai_tool_loop.mjs
//
// `createOpenAI` with the gateway as its base URL; `.chat(model)` speaks chat completions.
// Run by the e2e suite (tests/e2e/test_quickstarts.py) in front of a fault-injecting upstream.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";

const provider = createOpenAI({
  baseURL: process.env.OPENAI_BASE_URL ?? "http://127.0.0.1:7420/v1",
  apiKey: process.env.OPENAI_API_KEY ?? "unused",
});

const { text } = await generateText({
  model: provider.chat(process.env.MODEL ?? "gpt-4o-mini"),
  maxRetries: 0, // the gateway retries as its policy says
  tools: {
    lookup: tool({
      description: "Look a key up in the local index.",
      inputSchema: z.object({ key: z.string() }),
      execute: async ({ key }) => `ok: ${key === "answer" ? 42 : "unknown"}`,
    }),
  },
  stopWhen: stepCountIs(8),
  prompt: "What is the answer? Use the lookup tool.",
});
console.log(JSON.stringify({ answer: text }));
