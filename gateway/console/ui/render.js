// Frames -> DOM for the transcript. Everything from a frame goes in as text (textContent), never
// as markup. render(frame) is incremental; reset() + render(each) rebuilds the whole transcript
// (after a reattach's history the synthetic frames of the finalisation are gone again).

import { DISCONNECTED, isSynthetic, subagentOf } from "./view.js";

const MAX_TREE_DEPTH = 32; // JSON tree levels shown; deeper values are printed as JSON text
const STDERR_LINES = 5; // the end of an agent's stderr shown under its error

// Why a session ended, by session.deleted's reason. "client" is the gateway (the spec's client
// node), never the person at this page.
const DELETED_WHY = {
  user_request: "a user deleted it",
  master_request: "a master deleted it (DELETE /v1/session)",
  timeout: "no master reattached within its reattach window",
  error: "the gateway ended it after a fatal error, or as it shut down",
};

export function deletedText(p) {
  return `session ended: ${DELETED_WHY[p.reason] || p.reason} (${p.reason}, deleted_by: ${p.deleted_by})`;
}

const BUDGET_CODES = new Set(["BUDGET_WARNING", "BUDGET_EXCEEDED"]);

// "allowed by policy NAME" (or denied, asked) where a permission rule decided, from the frame's
// metadata.rawp_policy; null elsewhere.
export function policyNote(frame) {
  const meta = frame.metadata || {};
  if (typeof meta.rawp_policy !== "string") return null;
  const verb = { allow: "allowed", deny: "denied" }[meta.rawp_policy_decision] || "asked";
  return `${verb} by policy ${meta.rawp_policy}`;
}

// A turn of the agent's own saved conversation that this session continues, replayed into its
// history before the live ones (docs/protocol-notes.md): shown as the past it is.
function replayed(frame) {
  return Boolean(frame.metadata && frame.metadata.rawp_replayed === true);
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("data-") || k === "role" || k.startsWith("aria-") || k === "title")
      node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export function formatTokens(n) {
  return Number(n || 0).toLocaleString("en-US");
}

export function formatUsage(p) {
  const t = p.token_usage || {};
  const parts = [`${formatTokens(t.input_tokens)} in / ${formatTokens(t.output_tokens)} out tokens`];
  if (t.cache_read_tokens) parts.push(`${formatTokens(t.cache_read_tokens)} cached`);
  if (t.thinking_tokens) parts.push(`${formatTokens(t.thinking_tokens)} thinking`);
  const cost = p.cost_usage;
  if (cost) parts.push(`${Number(cost.used || 0).toFixed(4)} ${cost.unit || ""}`.trim());
  return parts.join(" · ");
}

const CALL_FIELDS = ["command", "file_path", "path", "pattern", "url", "query", "description", "prompt"];

export function describeCall(name, input) {
  input = input || {};
  for (const key of CALL_FIELDS) {
    if (typeof input[key] === "string" && input[key]) return `${name}: ${oneLine(input[key])}`;
  }
  const json = JSON.stringify(input);
  return json && json !== "{}" ? `${name}: ${oneLine(json)}` : name;
}

function oneLine(text, width = 100) {
  const line = String(text).replace(/\s+/g, " ").trim();
  return line.length > width ? line.slice(0, width - 1) + "…" : line;
}

function asText(output) {
  if (output === null || output === undefined) return "";
  if (typeof output === "string") return output;
  if (Array.isArray(output) && output.every((x) => typeof x === "string")) return output.join("\n");
  return JSON.stringify(output, null, 2);
}

// --- output_type renderers (§5.3.3) -----------------------------------------------------------

function renderDiff(output) {
  const pre = el("pre", { class: "diff" });
  for (const line of asText(output).replace(/\n$/, "").split("\n")) {
    let cls = "ctx";
    if (line.startsWith("+++") || line.startsWith("---")) cls = "file";
    else if (line.startsWith("@@")) cls = "hunk";
    else if (line.startsWith("+")) cls = "add";
    else if (line.startsWith("-")) cls = "del";
    pre.append(el("div", { class: `line ${cls}`, text: line || " " }));
  }
  return pre;
}

function renderFileList(output) {
  let items = output;
  if (typeof output === "string") items = output.split("\n").filter(Boolean);
  if (!Array.isArray(items)) return renderStructured(output);
  const list = el("ul", { class: "file-list" });
  for (const item of items) {
    const name = typeof item === "string" ? item : item.path || item.name || JSON.stringify(item);
    list.append(el("li", { text: name }));
  }
  if (items.length === 0) list.append(el("li", { class: "empty", text: "(no files)" }));
  return list;
}

// "     1→text" (Claude Code's Read) or "1\ttext": the agent's own numbers are kept.
const NUMBERED = /^\s*(\d+)(?:→|\t)(.*)$/;

function renderFileContent(output) {
  let text = output;
  if (output && typeof output === "object" && !Array.isArray(output)) {
    text = output.content ?? output.text ?? JSON.stringify(output, null, 2);
  }
  const lines = asText(text).replace(/\n$/, "").split("\n");
  const numbered = lines.length > 0 && lines.every((l) => NUMBERED.test(l));
  const table = el("table", { class: "file-content" });
  lines.forEach((line, i) => {
    const m = numbered ? NUMBERED.exec(line) : null;
    table.append(
      el(
        "tr",
        {},
        el("td", { class: "ln", text: m ? m[1] : String(i + 1) }),
        el("td", { class: "code", text: m ? m[2] : line }),
      ),
    );
  });
  return table;
}

export function jsonTree(value, depth = 0) {
  if (value === null || typeof value !== "object") {
    const kind = value === null ? "null" : typeof value;
    return el("span", { class: `json-${kind}`, text: JSON.stringify(value) });
  }
  if (depth >= MAX_TREE_DEPTH) return el("span", { class: "json-deep", text: JSON.stringify(value) });
  const entries = Array.isArray(value) ? value.map((v, i) => [i, v]) : Object.entries(value);
  const label = Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}`;
  const details = el("details", { class: "json", open: depth < 2 }, el("summary", { text: label }));
  const list = el("ul");
  for (const [k, v] of entries) {
    list.append(el("li", {}, el("span", { class: "json-key", text: `${k}: ` }), jsonTree(v, depth + 1)));
  }
  details.append(list);
  return details;
}

function renderStructured(output) {
  return el("div", { class: "structured" }, jsonTree(output));
}

function renderWeb(output) {
  const box = el("div", { class: "web-content" });
  if (output && typeof output === "object" && !Array.isArray(output)) {
    if (output.title) box.append(el("div", { class: "web-title", text: output.title }));
    if (output.url) box.append(el("div", { class: "web-url", text: output.url }));
    const body = output.content ?? output.text ?? output.results;
    if (body !== undefined) box.append(el("pre", { text: asText(body) }));
    return box;
  }
  box.append(el("pre", { text: asText(output) }));
  return box;
}

// `files` (the Renderer): objectUrl(path) for a file of the session, and the names of the files
// announced by agent.file.transfer, by transfer_id.
function renderBinary(output, files) {
  const box = el("div", { class: "binary-ref" });
  if (Array.isArray(output)) {
    for (const ref of output) box.append(renderBinary(ref, files));
    return box;
  }
  const ref = output && typeof output === "object" ? output : {};
  const name = files.transfers.get(ref.transfer_id) || null;
  const label = `${ref.mime_type || "file"} · ${formatTokens(ref.size_bytes)} bytes`;
  box.append(el("div", { class: "binary-label", text: name ? `${name} · ${label}` : label }));
  if (typeof ref.text === "string" && ref.text) box.append(el("pre", { class: "text-output", text: ref.text }));
  if (typeof ref.file_url === "string" && ref.file_url.startsWith("/")) {
    // Fetched with the token (an <img src> could not send it) and shown from a blob: URL.
    files.objectUrl(ref.file_url).then(
      (url) => {
        if (String(ref.mime_type || "").startsWith("image/")) {
          box.append(el("img", { src: url, alt: name || ref.file_url }));
        } else {
          box.append(el("a", { href: url, download: name || ref.transfer_id || "file", text: "download" }));
        }
      },
      (err) => box.append(el("div", { class: "error", text: `could not load: ${err.message}` })),
    );
  }
  return box;
}

export function renderOutput(type, output, files) {
  switch (type) {
    case "diff":
      return renderDiff(output);
    case "file_list":
      return renderFileList(output);
    case "file_content":
      return renderFileContent(output);
    case "structured":
      return renderStructured(output);
    case "web_content":
      return renderWeb(output);
    case "binary_ref":
      return renderBinary(output, files);
    case "empty":
      return el("div", { class: "empty", text: "(no output)" });
    default: // text, agent_result
      return el("pre", { class: "text-output", text: asText(output) });
  }
}

// --- the transcript ---------------------------------------------------------------------------

export class Renderer {
  constructor(root, { fetchBlob, meter = null }) {
    this.root = root;
    this.fetchBlob = fetchBlob;
    this.meter = meter; // sees every frame drawn (usage.js), and is reset with the transcript
    this.objectUrls = new Map(); // file_url -> Promise of its blob: URL
    this.me = null; // the signed-in user: their own prompts need no name
    this.reset();
  }

  reset() {
    this.root.replaceChildren();
    if (this.meter) this.meter.reset();
    this.turns = new Map(); // turn_id -> {el, body, footer}
    this.blocks = new Map(); // key -> element
    this.cards = new Map(); // invocation_id -> card parts
    this.groups = new Map(); // parallel_group_id -> element
    this.subagents = new Map(); // parent_invocation_id -> {el, body, usage, status}
    this.asks = new Map(); // interaction_id -> element
    this.transfers = new Map(); // transfer_id -> file_name (agent.file.transfer)
  }

  // A blob: URL for a file of the session, fetched once (with the token) however often the
  // transcript is drawn again; a failed fetch is tried again next time.
  objectUrl(path) {
    let url = this.objectUrls.get(path);
    if (!url) {
      url = this.fetchBlob(path).then((blob) => URL.createObjectURL(blob));
      url.catch(() => this.objectUrls.delete(path));
      this.objectUrls.set(path, url);
    }
    return url;
  }

  // Another session: its files' blob: URLs are let go.
  forget() {
    for (const url of this.objectUrls.values()) url.then((u) => URL.revokeObjectURL(u), () => {});
    this.objectUrls.clear();
  }

  scrolled(fn) {
    const r = this.root;
    const atBottom = r.scrollHeight - r.scrollTop - r.clientHeight < 40;
    fn();
    if (atBottom) r.scrollTop = r.scrollHeight;
  }

  render(frame) {
    this.scrolled(() => this.renderOne(frame));
  }

  renderAll(frames) {
    this.reset();
    for (const f of frames) this.renderOne(f);
    this.root.scrollTop = this.root.scrollHeight;
  }

  turn(turnId) {
    let t = this.turns.get(turnId);
    if (!t) {
      const body = el("div", { class: "turn-body" });
      const footer = el("div", { class: "turn-footer" });
      const node = el("section", { class: "turn", "data-turn-id": turnId }, body, footer);
      this.root.append(node);
      t = { el: node, body, footer, usage: null, end: null };
      this.turns.set(turnId, t);
    }
    return t;
  }

  // Where a frame's content goes: its subagent's box, its turn, or the transcript itself.
  container(frame) {
    const ctx = subagentOf(frame);
    if (ctx) {
      const sub = this.subagent(ctx.parent_invocation_id, ctx.depth, ctx.agent_type, frame);
      if (sub) return sub.body;
    }
    if (frame.turn_id) return this.turn(frame.turn_id).body;
    return this.root;
  }

  subagent(parentId, depth, agentType, frame) {
    let sub = this.subagents.get(parentId);
    if (!sub) {
      const card = this.cards.get(parentId);
      if (!card) return null;
      const head = el("div", { class: "subagent-head", text: `subagent ${agentType || ""}`.trim() });
      const status = el("span", { class: "subagent-status", text: "running" });
      head.append(" ", status);
      const body = el("div", { class: "subagent-body" });
      const usage = el("div", { class: "subagent-usage usage" });
      const node = el("div", { class: "subagent", "data-parent": parentId, "data-depth": depth ?? 1 }, head, body, usage);
      node.style.setProperty("--depth", String(depth ?? 1));
      card.subagents.append(node);
      sub = { el: node, head, body, usage, status };
      this.subagents.set(parentId, sub);
    }
    return sub;
  }

  block(frame, kind) {
    const ctx = subagentOf(frame);
    const key = JSON.stringify([kind, frame.turn_id || null, ctx ? ctx.parent_invocation_id : null, frame.payload.content_index]);
    let node = this.blocks.get(key);
    if (!node) {
      if (kind === "thinking") {
        const body = el("div", { class: "thinking-body" });
        node = el("details", { class: "thinking", open: true }, el("summary", { text: "Thinking" }), body);
        node.body = body;
      } else {
        node = el("div", { class: "text" });
        node.body = node;
      }
      node.dataset.state = "streaming";
      this.container(frame).append(node);
      this.blocks.set(key, node);
    }
    return node;
  }

  // What an error's details add (as the terminal client shows them): exit code or signal, the
  // end of the agent's stderr, and the hint (where credentials go).
  errorDetails(node, p) {
    const d = p.details || {};
    const facts = [];
    if (d.exit_code != null && !p.message.includes(`exit code ${d.exit_code}`)) facts.push(`exit code ${d.exit_code}`);
    if (d.signal != null && !p.message.includes(`signal ${d.signal}`)) facts.push(`signal ${d.signal}`);
    if (d.http_status != null && !p.message.includes(String(d.http_status))) facts.push(`HTTP ${d.http_status}`);
    if (facts.length) node.append(el("div", { class: "error-facts", text: facts.join(" · ") }));
    const stderr = (d.stderr || "").trim();
    if (stderr && !p.message.includes(stderr)) {
      node.append(el("pre", { class: "error-stderr", text: stderr.split("\n").slice(-STDERR_LINES).join("\n") }));
    }
    if (d.hint) node.append(el("div", { class: "error-hint", text: `hint: ${d.hint}` }));
  }

  notice(frame, cls, text) {
    const node = el("div", { class: `notice ${cls}`, text });
    this.container(frame).append(node);
    return node;
  }

  renderOne(frame) {
    if (this.meter) this.meter.frame(frame);
    const p = frame.payload || {};
    switch (frame.type) {
      case "control.prompt.request": {
        const node = el("div", { class: "prompt", text: p.prompt_text });
        const who = frame.metadata && frame.metadata.rawp_user;
        if (who && who !== this.me) {
          node.dataset.by = who;
          node.prepend(el("span", { class: "by", text: `${who}: ` }));
        }
        if (replayed(frame)) node.dataset.replayed = "yes";
        if (Array.isArray(p.context_files) && p.context_files.length) {
          const files = el("div", { class: "prompt-files" });
          for (const f of p.context_files) files.append(this.attached(f));
          node.append(files);
        }
        this.root.append(node);
        break;
      }
      case "agent.file.transfer":
        if (p.transfer_id && p.file_name) this.transfers.set(p.transfer_id, p.file_name);
        break;
      case "session.turn.start": {
        const t = this.turn(p.turn_id);
        t.el.dataset.state = "running";
        if (replayed(frame)) t.el.dataset.replayed = "yes";
        if (p.mode && p.mode !== "default") t.el.dataset.mode = p.mode;
        break;
      }
      case "session.turn.end": {
        const t = this.turn(p.turn_id);
        const interrupted = p.stop_reason === DISCONNECTED;
        t.el.dataset.state = interrupted ? "interrupted" : "ended";
        t.el.dataset.stopReason = p.stop_reason;
        if (!t.end) {
          t.end = el("span", { class: "stop-reason" });
          t.footer.prepend(t.end);
        }
        t.end.textContent = interrupted ? "interrupted (connection lost)" : p.stop_reason.replace("_", " ");
        break;
      }
      case "session.usage": {
        const ctx = subagentOf(frame);
        const sub = ctx && this.subagents.get(ctx.parent_invocation_id);
        if (sub) {
          sub.usage.textContent = formatUsage(p);
        } else if (frame.turn_id || p.turn_id) {
          const t = this.turn(p.turn_id || frame.turn_id);
          if (!t.usage) {
            t.usage = el("span", { class: "usage" });
            t.footer.append(t.usage);
          }
          t.usage.textContent = formatUsage(p);
        }
        break;
      }
      case "agent.text.delta":
      case "agent.thinking.delta": {
        const kind = frame.type === "agent.text.delta" ? "text" : "thinking";
        const node = this.block(frame, kind);
        node.body.append(p.redacted ? "(redacted)" : p.text);
        break;
      }
      case "agent.text.done":
      case "agent.thinking.done": {
        const kind = frame.type === "agent.text.done" ? "text" : "thinking";
        const node = this.block(frame, kind);
        if (kind === "text" && typeof p.full_text === "string") node.body.textContent = p.full_text;
        if (isSynthetic(frame)) {
          node.dataset.state = "interrupted";
          node.append(el("span", { class: "badge interrupted", text: "interrupted" }));
        } else {
          node.dataset.state = p.is_cancelled ? "cancelled" : "done";
          if (p.is_cancelled) node.append(el("span", { class: "badge", text: "cancelled" }));
          if (kind === "thinking") node.open = false;
        }
        break;
      }
      case "tool.invoke.request":
        this.toolRequest(frame, p);
        break;
      case "tool.invoke.stream": {
        const card = this.cards.get(p.invocation_id);
        if (card) card.stream.append(el("span", { class: p.stream_type, text: p.chunk }));
        if (card) card.stream.hidden = false;
        break;
      }
      case "tool.invoke.result":
        this.toolResult(frame, p);
        break;
      case "agent.subagent.started": {
        const sub = this.subagent(p.parent_invocation_id, p.depth, p.agent_type, frame);
        if (sub && p.description) sub.head.firstChild.textContent += `: ${p.description}`;
        break;
      }
      case "agent.subagent.ended": {
        const sub = this.subagents.get(p.parent_invocation_id);
        if (sub) {
          sub.status.textContent = p.status + (p.duration_ms != null ? ` · ${p.duration_ms} ms` : "");
          sub.el.dataset.state = p.status;
        }
        break;
      }
      case "agent.interaction.request": {
        const ruled = policyNote(frame);
        const node = this.notice(frame, "ask", `asked: ${p.question_text}${ruled ? ` (${ruled})` : ""}`);
        node.dataset.state = "pending";
        this.asks.set(p.interaction_id, node);
        break;
      }
      case "control.interaction.response":
      case "control.interaction.timeout": {
        const node = this.asks.get(p.interaction_id);
        if (node) {
          const answer = frame.type.endsWith("timeout") ? "timed out" : [].concat(p.selected_value).join(", ");
          node.dataset.state = "answered";
          const who = frame.metadata && frame.metadata.rawp_user;
          const span = el("span", { class: "answer", text: ` → ${answer}` });
          // Who answered (metadata.rawp_user, stamped by the gateway): docs/identities.md.
          if (who && who !== this.me) span.append(el("span", { class: "by", text: ` by ${who}` }));
          if (who) node.dataset.answeredBy = who;
          node.append(span);
        }
        break;
      }
      case "session.compacted":
        this.compacted(frame, p);
        break;
      case "agent.state.changed":
        if (frame.metadata && frame.metadata.mode) {
          this.notice(frame, "mode", `mode: ${frame.metadata.mode}`);
        }
        break;
      case "session.error":
        if (BUDGET_CODES.has(p.error_code)) {
          // A budget nearly or wholly spent (docs/budgets.md): a warning, not an error.
          const node = this.notice(frame, "budget", `budget: ${p.message}`);
          node.dataset.code = p.error_code;
        } else {
          this.notice(frame, "error", `${p.error_code}: ${p.message}`);
        }
        break;
      case "agent.error":
        this.errorDetails(this.notice(frame, "error", `agent ${p.severity}: ${p.error_code}: ${p.message}`), p);
        break;
      case "session.renamed":
        this.notice(frame, "info", `renamed to “${p.name}”`);
        break;
      case "session.deleted":
        this.notice(frame, "error", deletedText(p));
        break;
    }
  }

  toolRequest(frame, p) {
    const status = el("span", { class: "tool-status", text: "running" });
    const head = el("div", { class: "tool-head" }, el("span", { class: "tool-title", text: describeCall(p.tool_name, p.input) }), status);
    const input = el("details", { class: "tool-input" }, el("summary", { text: "input" }), jsonTree(p.input || {}));
    const stream = el("pre", { class: "tool-stream", hidden: true });
    const result = el("div", { class: "tool-result" });
    const subagents = el("div", { class: "subagents" });
    const node = el("div", { class: "tool-card", "data-invocation-id": p.invocation_id, "data-tool": p.tool_name, "data-state": "running" }, head, input, stream, result, subagents);
    this.cards.set(p.invocation_id, { el: node, status, stream, result, subagents });
    const container = this.container(frame);
    if (p.parallel_group_id) {
      let group = this.groups.get(p.parallel_group_id);
      if (!group) {
        group = el("div", { class: "parallel", "data-group": p.parallel_group_id });
        container.append(group);
        this.groups.set(p.parallel_group_id, group);
      }
      group.append(node);
    } else {
      container.append(node);
    }
  }

  toolResult(frame, p) {
    let card = this.cards.get(p.invocation_id);
    if (!card) {
      this.toolRequest(frame, { invocation_id: p.invocation_id, tool_name: p.tool_name, input: {} });
      card = this.cards.get(p.invocation_id);
    }
    const synthetic = isSynthetic(frame);
    card.el.dataset.state = synthetic ? "interrupted" : p.status;
    card.el.dataset.outputType = p.output_type;
    let status = synthetic ? "interrupted (connection lost)" : p.status;
    if (p.duration_ms != null) status += ` · ${p.duration_ms} ms`;
    if (p.truncated) status += " · truncated";
    card.status.textContent = status;
    card.result.replaceChildren(renderOutput(p.output_type, p.output, this));
    const ruled = policyNote(frame);
    if (ruled) {
      // A rule answered where a person would have been asked (docs/policies.md).
      card.el.dataset.policy = frame.metadata.rawp_policy;
      card.status.append(el("span", { class: "policy", text: ` · ${ruled}` }));
    }
  }

  // A file that went with a prompt: its name, and an image as a thumbnail (fetched with the token).
  attached(f) {
    const chip = el("span", { class: "chip", title: f.mime_type || "" }, el("span", { class: "chip-name", text: f.file_name }));
    const url = f.file_url;
    if (String(f.mime_type || "").startsWith("image/") && typeof url === "string" && url.startsWith("/")) {
      this.objectUrl(url).then(
        (src) => chip.prepend(el("img", { class: "thumb", src, alt: f.file_name })),
        () => chip.classList.add("unavailable"),
      );
    }
    return chip;
  }

  compacted(frame, p) {
    const text = `compacted (${p.trigger}): ${formatTokens(p.previous_token_count)} → ${formatTokens(p.current_token_count)} tokens`;
    const node = el("details", { class: "notice compacted" }, el("summary", { text }), el("pre", { text: p.summary }));
    this.container(frame).append(node);
  }
}
