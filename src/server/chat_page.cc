#include "server/chat_page.h"

namespace polychip::server {
namespace {

// Kept in one literal so that the binary carries the page; the element ids (#input, #send,
// #stop, #stats, .msg.assistant) are what tests/server/chat_page_test.mjs drives.
constexpr std::string_view kPage = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>polychip chat</title>
<style>
  :root { --bg: #f6f7f9; --fg: #1d232b; --muted: #6a7380; --accent: #2f6fdd; --card: #fff; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, sans-serif; background: var(--bg); color: var(--fg);
         display: grid; grid-template-columns: 280px 1fr; height: 100vh; }
  aside { padding: 16px; border-right: 1px solid #dde1e6; background: var(--card); overflow: auto; }
  aside h1 { font-size: 18px; margin: 0 0 12px; }
  label { display: block; font-size: 12px; color: var(--muted); margin: 12px 0 4px; }
  textarea, input, select { width: 100%; font: inherit; padding: 6px 8px; border: 1px solid #cfd5dc;
                    border-radius: 6px; background: #fff; }
  main { display: flex; flex-direction: column; height: 100vh; }
  #log { flex: 1; overflow: auto; padding: 16px 24px; }
  .msg { max-width: 760px; margin: 0 0 12px; padding: 10px 14px; border-radius: 10px;
         white-space: pre-wrap; word-break: break-word; background: var(--card);
         box-shadow: 0 1px 2px rgba(0,0,0,.06); }
  .msg.user { background: #e4edfc; margin-left: auto; }
  .msg .role { display: block; font-size: 11px; color: var(--muted); text-transform: uppercase; }
  .msg.error { background: #fde8e8; color: #8a1c1c; }
  .msg details.reasoning { margin: 2px 0 6px; color: var(--muted); font-size: 13px; }
  .msg details.reasoning summary { cursor: pointer; font-size: 12px; }
  form { display: flex; gap: 8px; padding: 12px 24px; border-top: 1px solid #dde1e6;
         background: var(--card); }
  form textarea { flex: 1; height: 60px; resize: vertical; }
  button { font: inherit; padding: 0 18px; border: 0; border-radius: 6px; color: #fff;
           background: var(--accent); cursor: pointer; }
  button:disabled { opacity: .45; cursor: default; }
  #stop { background: #b23b3b; }
  #stats { font-size: 12px; color: var(--muted); padding: 0 24px 8px; background: var(--card); }
</style>
</head>
<body>
<aside>
  <h1>polychip</h1>
  <div id="model">model: …</div>
  <label for="system">System prompt</label>
  <textarea id="system" rows="4" placeholder="You are a helpful assistant."></textarea>
  <label for="temperature">Temperature</label>
  <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7">
  <label for="max_tokens">Max tokens</label>
  <input id="max_tokens" type="number" min="1" step="1" value="256">
  <label for="api">API</label>
  <select id="api">
    <option value="chat">OpenAI chat completions</option>
    <option value="messages">Anthropic messages</option>
    <option value="responses">OpenAI responses</option>
  </select>
  <label for="api_key">API key (if the server wants one)</label>
  <input id="api_key" type="password" autocomplete="off">
  <label><button id="clear" type="button">New conversation</button></label>
</aside>
<main>
  <div id="log"></div>
  <div id="stats"></div>
  <form id="form">
    <textarea id="input" placeholder="Type a message (Enter sends, Shift+Enter: new line)"></textarea>
    <button id="send" type="submit">Send</button>
    <button id="stop" type="button" disabled>Stop</button>
  </form>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const history = [];
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const r = document.createElement("span");
  r.className = "role";
  r.textContent = role;
  const body = document.createElement("span");
  body.className = "content";
  body.textContent = text;
  div.append(r, body);
  $("log").append(div);
  $("log").scrollTop = $("log").scrollHeight;
  return body;
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    $("model").textContent = "model: " + (j.data?.[0]?.id ?? "?");
  } catch (e) { $("model").textContent = "model: unavailable"; }
}

// The three APIs the server speaks: how a turn is asked for and how the stream's events read
// (the text they add; `s.tokens` from the usage they carry).
const apis = {
  chat: {
    path: "/v1/chat/completions",
    body: (system, t, n) => ({
      messages: [...(system ? [{ role: "system", content: system }] : []), ...history],
      stream: true, stream_options: { include_usage: true }, temperature: t, max_tokens: n,
    }),
    read: (j, s) => {
      if (j.usage) s.tokens = j.usage.completion_tokens;
      return j.choices?.[0]?.delta?.content;
    },
    think: (j) => j.choices?.[0]?.delta?.reasoning_content,
  },
  messages: {
    path: "/v1/messages",
    body: (system, t, n) => ({
      ...(system ? { system } : {}), messages: history, stream: true,
      temperature: Math.min(t, 1), max_tokens: n,
    }),
    read: (j, s) => {
      if (j.type === "message_delta") s.tokens = j.usage.output_tokens;
      return j.type === "content_block_delta" ? j.delta.text : undefined;
    },
    think: (j) => (j.type === "content_block_delta" ? j.delta.thinking : undefined),
  },
  responses: {
    path: "/v1/responses",
    body: (system, t, n) => ({
      ...(system ? { instructions: system } : {}), input: history, stream: true, store: false,
      temperature: t, max_output_tokens: n,
    }),
    read: (j, s) => {
      if (j.response?.usage) s.tokens = j.response.usage.output_tokens;
      return j.type === "response.output_text.delta" ? j.delta : undefined;
    },
    think: (j) => (j.type === "response.reasoning_text.delta" ? j.delta : undefined),
  },
};

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const out = addMessage("assistant", "");
  const api = apis[$("api").value];
  // A thinking model's reasoning goes in a block of its own above the answer, collapsed
  // unless opened; it is not sent back in the history.
  const thinking = document.createElement("details");
  thinking.className = "reasoning";
  thinking.hidden = true;
  const summary = document.createElement("summary");
  summary.textContent = "reasoning";
  const thought = document.createElement("div");
  thinking.append(summary, thought);
  out.before(thinking);
  let reasoning = "";
  const system = $("system").value.trim();
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const start = performance.now();
  let first = 0, answer = "";
  const usage = { tokens: 0 };
  try {
    const r = await fetch(api.path, {
      method: "POST", headers: headers(), signal: controller.signal,
      body: JSON.stringify(api.body(system, Number($("temperature").value),
                                    Number($("max_tokens").value))),
    });
    if (!r.ok) throw new Error((await r.json()).error?.message ?? ("HTTP " + r.status));
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          if (j.type === "error") throw new Error(j.message);
          const think = api.think(j);
          if (think) {
            if (!first) first = performance.now();
            reasoning += think;
            thought.textContent = reasoning;
            thinking.hidden = false;
          }
          const delta = api.read(j, usage);
          if (delta) {
            if (!first) first = performance.now();
            answer += delta;
            out.textContent = answer;
            ++usage.tokens;
            $("log").scrollTop = $("log").scrollHeight;
          }
        }
      }
      const tokens = usage.tokens;
      const secs = ((performance.now() - (first || start)) / 1000) || 1e-9;
      $("stats").textContent = tokens + " tokens, " + (tokens / secs).toFixed(1) + " tokens/s";
    }
    const tokens = usage.tokens;
    const total = (performance.now() - start) / 1000;
    const gen = first ? (performance.now() - first) / 1000 : total;
    $("stats").textContent = tokens + " tokens in " + total.toFixed(2) + " s, " +
        (tokens / Math.max(gen, 1e-3)).toFixed(1) + " tokens/s" +
        (first ? ", first token after " + ((first - start) / 1000).toFixed(2) + " s" : "");
  } catch (e) {
    if (e.name !== "AbortError") {
      out.parentElement.classList.add("error");
      out.textContent = answer + (answer ? "\n" : "") + "error: " + e.message;
    } else {
      $("stats").textContent += " (stopped)";
    }
  } finally {
    history.push({ role: "assistant", content: answer });
    out.parentElement.dataset.done = "1";
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => controller?.abort());
$("api_key").addEventListener("change", loadModel);
$("clear").addEventListener("click", () => { history.length = 0; $("log").textContent = ""; $("stats").textContent = ""; });
loadModel();
</script>
</body>
</html>
)html";

}  // namespace

std::string_view ChatPageHtml() { return kPage; }

}  // namespace polychip::server
