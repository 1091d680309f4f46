// The chat page: talks to /v1/chat/completions with streaming, shows reasoning folded, renders replies as Markdown
// (code blocks with copy buttons), can stop a reply, and shows the model's name and the generation speed. Plain DOM
// code, no framework, no build step. Model text only ever reaches the page as text nodes (textContent), never as
// HTML, so a reply cannot inject markup or script.
#include "server/webpage.h"

namespace strata::server {

namespace {
const char *const kPage = R"PAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Strata chat</title>
<style>
:root { --bg:#f6f7f9; --fg:#1d2330; --muted:#6b7280; --user:#dbe8ff; --bot:#ffffff; --line:#d9dde5; --accent:#2f6fde; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--fg);
       display:flex; flex-direction:column; height:100vh; }
header { display:flex; gap:1em; align-items:center; padding:.6em 1em; border-bottom:1px solid var(--line); background:#fff; }
header h1 { font-size:1.05em; margin:0; }
header .info { color:var(--muted); font-size:.9em; }
header .grow { flex:1; }
header input { width:11em; font:inherit; padding:.2em .4em; border:1px solid var(--line); border-radius:4px; }
#log { flex:1; overflow-y:auto; padding:1em; display:flex; flex-direction:column; gap:.8em; }
.msg { max-width:52em; padding:.6em .9em; border-radius:8px; border:1px solid var(--line); white-space:pre-wrap;
       word-wrap:break-word; }
.msg.user { background:var(--user); align-self:flex-end; }
.msg.assistant { background:var(--bot); align-self:flex-start; }
.msg.error { background:#ffe4e4; align-self:flex-start; }
.msg details { color:var(--muted); margin-bottom:.4em; }
.msg details summary { cursor:pointer; font-size:.9em; }
.msg .tool { font-family:ui-monospace, monospace; font-size:.9em; background:#f1f3f7; padding:.3em; border-radius:4px; }
.msg .stats { color:var(--muted); font-size:.8em; margin-top:.3em; }
.msg.assistant { white-space:normal; }
.msg.assistant details div { white-space:pre-wrap; }
.content p { margin:.3em 0; white-space:pre-wrap; }
.content h1, .content h2, .content h3 { font-size:1.05em; margin:.5em 0 .2em; }
.content ul, .content ol { margin:.3em 0; padding-left:1.4em; }
.content code { font-family:ui-monospace, monospace; font-size:.9em; background:#f1f3f7; padding:0 .2em; border-radius:3px; }
.codeblock { border:1px solid var(--line); border-radius:6px; margin:.4em 0; overflow:hidden; }
.codeblock .bar { display:flex; justify-content:space-between; align-items:center; background:#eef1f6; padding:.1em .5em;
                  font-size:.8em; color:var(--muted); }
.codeblock .bar button { font-size:.9em; padding:.1em .6em; background:#fff; color:var(--fg); border:1px solid var(--line); }
.codeblock pre { margin:0; padding:.5em; overflow-x:auto; background:#f8f9fb; }
.codeblock pre code { background:none; padding:0; white-space:pre; }
form { display:flex; gap:.5em; padding:.8em 1em; border-top:1px solid var(--line); background:#fff; }
textarea { flex:1; font:inherit; padding:.5em; border:1px solid var(--line); border-radius:6px; resize:vertical; min-height:2.6em; }
button { font:inherit; padding:.4em 1.1em; border:0; border-radius:6px; background:var(--accent); color:#fff; cursor:pointer; }
button:disabled { background:#9db7ea; cursor:default; }
button#stop { background:#c2410c; }
button#stop:disabled { background:#e7b9a1; }
</style>
</head>
<body>
<header>
  <h1>Strata</h1>
  <span class="info">model: <b id="model">…</b></span>
  <span class="info" id="speed"></span>
  <span class="grow"></span>
  <label class="info">max tokens <input id="maxtok" type="number" value="512" min="1" style="width:5em"></label>
  <input id="apikey" type="password" placeholder="API key (if any)">
  <button id="clear" type="button">New chat</button>
</header>
<div id="log"></div>
<form id="form">
  <textarea id="input" placeholder="Send a message (Enter to send, Shift+Enter for a new line)"></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" disabled>Stop</button>
</form>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const log = $("log"), input = $("input"), sendBtn = $("send"), stopBtn = $("stop");
let history = [], controller = null;
$("apikey").value = localStorage.getItem("strata-api-key") || "";
$("apikey").addEventListener("change", () => { localStorage.setItem("strata-api-key", $("apikey").value); loadModel(); });

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("apikey").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}
async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    $("model").textContent = r.ok ? j.data[0].id : "(" + (j.error ? j.error.message : r.status) + ")";
  } catch (e) { $("model").textContent = "(unreachable)"; }
}
function bubble(cls) {
  const d = document.createElement("div");
  d.className = "msg " + cls;
  log.appendChild(d);
  log.scrollTop = log.scrollHeight;
  return d;
}
function assistantBubble() {
  const d = bubble("assistant");
  const det = document.createElement("details");
  const sum = document.createElement("summary");
  sum.textContent = "Reasoning";
  const reasoning = document.createElement("div");
  det.append(sum, reasoning);
  det.hidden = true;
  const content = document.createElement("div");
  content.className = "content";
  const tools = document.createElement("div");
  const stats = document.createElement("div");
  stats.className = "stats";
  d.append(det, content, tools, stats);
  return { d, det, reasoning, content, tools, stats };
}
function setBusy(b) { sendBtn.disabled = b; stopBtn.disabled = !b; }

// Markdown, the common parts (fenced code, headings, lists, paragraphs, `code`, **bold**, *italic*), built from
// elements and text nodes only: whatever the model writes, no HTML of it is ever parsed.
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function copyText(text, button) {
  const done = () => { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500); };
  if (navigator.clipboard && window.isSecureContext) { navigator.clipboard.writeText(text).then(done, () => {}); return; }
  const t = el("textarea"); t.value = text; document.body.appendChild(t); t.select();
  try { document.execCommand("copy"); done(); } catch (e) {} finally { t.remove(); }
}
function inline(parent, text) {
  const re = /`([^`\n]+)`|\*\*([^*\n]+)\*\*|\*([^*\s][^*\n]*)\*/g;
  let last = 0, m;
  while ((m = re.exec(text))) {
    if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
    if (m[1] !== undefined) parent.appendChild(el("code", "", m[1]));
    else if (m[2] !== undefined) parent.appendChild(el("strong", "", m[2]));
    else parent.appendChild(el("em", "", m[3]));
    last = re.lastIndex;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}
function renderMarkdown(box, text) {
  box.replaceChildren();
  const lines = text.split("\n");
  let para = [], list = null;
  const flush = () => {
    if (para.length) { const p = el("p"); inline(p, para.join("\n")); box.appendChild(p); para = []; }
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+#.-]*)\s*$/);
    if (fence) {
      flush();
      const code = [];
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
      const block = el("div", "codeblock"), bar = el("div", "bar"), btn = el("button", "copy", "Copy");
      btn.type = "button";
      const source = code.join("\n");
      btn.addEventListener("click", () => copyText(source, btn));
      bar.append(el("span", "", fence[1] || "code"), btn);
      const pre = el("pre");
      pre.appendChild(el("code", "", source));
      block.append(bar, pre);
      box.appendChild(block);
      continue;
    }
    const h = line.match(/^(#{1,3})\s+(.*)$/);
    if (h) { flush(); const e = el("h" + h[1].length); inline(e, h[2]); box.appendChild(e); continue; }
    const li = line.match(/^\s*(?:[-*+]|(\d+)[.)])\s+(.*)$/);
    if (li) {
      if (para.length) flush();
      const kind = li[1] ? "ol" : "ul";
      if (!list || list.tagName.toLowerCase() !== kind) { list = el(kind); box.appendChild(list); }
      const item = el("li"); inline(item, li[2]); list.appendChild(item);
      continue;
    }
    if (!line.trim()) { flush(); continue; }
    list = null;
    para.push(line);
  }
  flush();
}

async function send(text) {
  history.push({ role: "user", content: text });
  bubble("user").textContent = text;
  const view = assistantBubble();
  controller = new AbortController();
  setBusy(true);
  let content = "", reasoning = "", calls = [], t0 = performance.now(), tFirst = 0, n = 0, speed = "";
  // The page is drawn at most once a frame: a fast model sends hundreds of deltas a second, and redrawing a long
  // reply for each of them would stall the page (and its Stop button).
  let frame = 0;
  const draw = () => {
    frame = 0;
    if (reasoning) { view.det.hidden = false; view.reasoning.textContent = reasoning; }
    renderMarkdown(view.content, content);
    for (const call of calls) call.view.textContent = "tool call: " + call.name + "(" + call.arguments + ")";
    if (speed) $("speed").textContent = speed;
    log.scrollTop = log.scrollHeight;
  };
  const redraw = () => { if (!frame) frame = requestAnimationFrame(draw); };
  const body = { messages: history, stream: true, stream_options: { include_usage: true },
                 max_tokens: parseInt($("maxtok").value) || 512 };
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                     signal: controller.signal });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error(j.error ? j.error.message : "HTTP " + r.status);
    }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i); buf = buf.slice(i + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          if (j.usage) n = j.usage.completion_tokens;
          if (j.timings && j.timings.predicted_per_second) speed = j.timings.predicted_per_second.toFixed(1) + " tok/s";
          if (!j.choices || !j.choices.length) continue;
          const delta = j.choices[0].delta || {};
          if (!tFirst && (delta.content || delta.reasoning_content || delta.tool_calls)) tFirst = performance.now();
          reasoning += delta.reasoning_content || "";
          content += delta.content || "";
          if (delta.tool_calls) for (const c of delta.tool_calls) {
            // A call's first piece names it; later pieces add to its arguments.
            let call = calls[c.index];
            if (!call) {
              call = calls[c.index] = { id: c.id, name: c.function.name, arguments: "",
                                        view: document.createElement("div") };
              call.view.className = "tool";
              view.tools.appendChild(call.view);
            }
            call.arguments += c.function.arguments || "";
          }
        }
      }
      redraw();
    }
  } catch (e) {
    if (e.name !== "AbortError") { const err = bubble("error"); err.textContent = "Error: " + e.message; }
  } finally {
    cancelAnimationFrame(frame);
    draw();
    const secs = ((tFirst ? performance.now() - tFirst : 0) / 1000);
    const parts = [];
    if (controller.signal.aborted) parts.push("stopped");
    if (n) parts.push(n + " tokens");
    if (n && secs > 0) parts.push((n / secs).toFixed(1) + " tok/s");
    parts.push(((performance.now() - t0) / 1000).toFixed(2) + " s");
    view.stats.textContent = parts.join(" · ");
    const msg = { role: "assistant", content: content };
    if (calls.length)
      msg.tool_calls = calls.map((c) => ({ id: c.id, type: "function",
                                           function: { name: c.name, arguments: c.arguments } }));
    history.push(msg);
    controller = null;
    setBusy(false);
    input.focus();
  }
}
$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = "";
  send(text);
});
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("form").requestSubmit(); }
});
stopBtn.addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => { if (!controller) { history = []; log.replaceChildren(); } });
loadModel();
input.focus();
</script>
</body>
</html>
)PAGE";
}  // namespace

const std::string &web_page() {
    static const std::string page(kPage);
    return page;
}

}  // namespace strata::server
