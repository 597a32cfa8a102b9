// Drives a router with the official SDKs, unchanged but for their base
// URL: the OpenAI Node SDK's responses.create (stored, then continued by
// previous_response_id, streamed and not) and the Anthropic TypeScript
// SDK's messages.create and messages.stream. Prints one line per check
// and exits non-zero on the first failure. Usage: node sdk.mjs --url BASE
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const url = process.argv[process.argv.indexOf("--url") + 1];
const fail = (msg) => {
  console.error("FAIL " + msg);
  process.exit(1);
};
const ok = (msg) => console.log("ok " + msg);

const openai = new OpenAI({ baseURL: url + "/v1", apiKey: "unused", maxRetries: 0 });
const first = await openai.responses.create({ model: "m", instructions: "Be brief.", input: "Say hello.", store: true, max_output_tokens: 8 });
if (!first.id || typeof first.output_text !== "string" || first.output_text.length === 0) fail("responses.create: " + JSON.stringify(first));
ok("responses.create " + first.id);

let prev = first.id;
for (let turn = 0; turn < 4; turn++) {
  const next = await openai.responses.create({ model: "m", input: "And then? " + turn, previous_response_id: prev, store: true, max_output_tokens: 8 });
  if (next.previous_response_id !== prev || !next.output_text) fail("continuation " + turn + ": " + JSON.stringify(next));
  prev = next.id;
}
ok("responses.create with previous_response_id, 4 turns");

const stream = await openai.responses.create({ model: "m", input: "Stream it.", previous_response_id: prev, stream: true, max_output_tokens: 8 });
let text = "", created = "", completed = null;
for await (const ev of stream) {
  if (ev.type === "response.created") created = ev.response.id;
  if (ev.type === "response.output_text.delta") text += ev.delta;
  if (ev.type === "response.completed") completed = ev.response;
}
if (!created || !completed || completed.id !== created || !text || !completed.usage) fail("streamed continuation: " + JSON.stringify(completed));
const last = await openai.responses.create({ model: "m", input: "Once more.", previous_response_id: created, max_output_tokens: 4 });
if (!last.output_text) fail("continuing a streamed response");
ok("streamed responses.create, continued");

const retrieved = await openai.responses.retrieve(created);
if (retrieved.id !== created) fail("responses.retrieve");
ok("responses.retrieve");

try {
  await openai.responses.create({ model: "m", input: "x", previous_response_id: "resp_does_not_exist" });
  fail("an unknown previous_response_id was served");
} catch (e) {
  if (!(e instanceof OpenAI.NotFoundError)) fail("unknown previous_response_id: " + e);
}
ok("unknown previous_response_id: NotFoundError");

const anthropic = new Anthropic({ baseURL: url, apiKey: "unused", maxRetries: 0 });
const msg = await anthropic.messages.create({ model: "m", max_tokens: 8, system: "Be brief.", messages: [{ role: "user", content: "Say hello." }] },
  { headers: { "x-claude-code-session-id": "sdk-session" } });
if (msg.type !== "message" || msg.content[0].type !== "text" || !msg.content[0].text || !msg.usage.output_tokens) fail("messages.create: " + JSON.stringify(msg));
ok("messages.create");

const ms = anthropic.messages.stream({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "Stream it." }] });
let deltas = "";
ms.on("text", (t) => { deltas += t; });
const final = await ms.finalMessage();
if (!deltas || final.content[0].text !== deltas || !final.stop_reason || !final.usage.output_tokens) fail("messages.stream: " + JSON.stringify(final));
ok("messages.stream");

try {
  await anthropic.messages.create({ model: "m", messages: [{ role: "user", content: "no budget" }] });
  fail("a request without max_tokens was served");
} catch (e) {
  if (!(e instanceof Anthropic.BadRequestError) || e.error?.type !== "error") fail("missing max_tokens: " + e);
}
ok("messages.create without max_tokens: BadRequestError in Anthropic's shape");
