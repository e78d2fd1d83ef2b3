// The browser console: a master of the gateway it is served by, over the same HTTP API and DPS
// WebSocket as any other (docs/browser-console.md). view.js keeps the §7.8 state, render.js
// draws the transcript; this file does the I/O: HTTP calls with the token, the WebSocket with a
// one-time ticket, reattaching after a reload or a lost connection, the question dialog, keys,
// files attached to the next prompt (PUT to the session's files, then context_files), and the
// agent's own saved conversations, listed for a workspace and continued in a new session.

import { Renderer, describeCall, el, jsonTree } from "./render.js";
import { HistoryParts, SessionView, makeFrame, timeKey } from "./view.js";
import { UsageMeter } from "./usage.js";
import { McpServers } from "./mcp.js";

const SUBPROTOCOL = "rawp-dps-1.0";
const TOKEN_KEY = "rawp-console.token";
const SAVED_PREFIX = "rawp-console.session.";
const SESSION_HASH = /^#session=([0-9a-f-]{36})$/; // /ui#session=<id> opens that session
const MAX_SAVED_CHARS = 2_000_000; // one session's saved transcript in sessionStorage
const RECONNECT_MAX_MS = 10_000;
const SESSIONS_POLL_MS = 5_000;
const SAVE_DELAY_MS = 300;
const MAX_ATTACHMENTS = 20; // context_files of one prompt (the gateway refuses more)
// What this master can show: everything (the gateway filters what a master does not announce).
const FEATURES = {
  thinking_stream: true,
  tool_streaming: true,
  structured_output: true,
  subagent: true,
  subagent_context: true,
  context_compaction: true,
  plan_mode: true,
  file_reference: true,
  file_search_fuzzy: true,
};

const $ = (id) => document.getElementById(id);

// The URL a gateway prints when it made its own token (`serve` on a terminal, `demo`) carries it
// in the fragment, which never reaches a server: `/ui#token=...` or `/ui#session=<id>&token=...`.
// It is kept as a typed token is (this tab's sessionStorage) and taken out of the address at once,
// so it stays out of the history, bookmarks and any link copied from the bar. True when one came.
function takeTokenFromAddress() {
  const params = new URLSearchParams(location.hash.slice(1));
  const token = params.get("token");
  if (!token) return false;
  sessionStorage.setItem(TOKEN_KEY, token.trim());
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  return true;
}

takeTokenFromAddress();

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  sessions: [],
  current: null, // {id, view, ws, caps, retry, timer, closing, trimmed}
  asking: null, // {id, frame, timer}
  attachments: [], // files for the next prompt: {name, mimeType, size, fileUrl, chip}
  me: null, // {user, role}: who the token is (GET /v1/whoami)
};

// Roles in rank order (docs/identities.md): a user's role on a session is the lower of their own
// and the one the session gives them; the owner has their own, an admin has admin everywhere.
const ROLES = ["viewer", "operator", "admin"];

function roleOn(s) {
  const me = state.me;
  if (!me || !s) return me ? me.role : null;
  if (me.role === "admin" || s.owner === undefined || s.owner === me.user) return me.role;
  const given = (s.members || {})[me.user];
  if (!given) return null;
  return ROLES.indexOf(given) < ROLES.indexOf(me.role) ? given : me.role;
}

function atLeast(role, wanted) {
  return role !== null && ROLES.indexOf(role) >= ROLES.indexOf(wanted);
}

// The role on the attached session (or the gateway-wide one): what the page offers follows it.
function currentRole() {
  const cur = state.current;
  const info = cur && state.sessions.find((s) => s.session_id === cur.id);
  return info ? roleOn(info) : state.me && state.me.role;
}

async function loadWhoami() {
  state.me = await api("GET", "v1/whoami");
  renderer.me = state.me.user;
  showWhoami();
}

function showWhoami() {
  const me = state.me;
  if (!me) return;
  const role = currentRole();
  $("whoami").textContent = role && role !== me.role ? `${me.user} · ${role} here (${me.role})` : `${me.user} · ${me.role}`;
  $("whoami").dataset.role = role || "";
  document.body.dataset.role = role || "";
  document.body.dataset.mayOperate = atLeast(role, "operator") ? "yes" : "no";
  document.body.dataset.mayCreate = atLeast(me.role, "operator") ? "yes" : "no";
}

const renderer = new Renderer($("transcript"), { fetchBlob, meter: new UsageMeter($("usage")) });
const mcpServers = new McpServers($("mcp"));

// --- HTTP ------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(`${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  if (body === undefined) return request(method, path);
  return request(method, path, JSON.stringify(body), "application/json");
}

// One call with the token; a 401 asks for it (then tries again). `body` is sent as it is.
async function request(method, path, body, contentType) {
  for (let attempt = 0; ; attempt++) {
    const headers = {};
    if (state.token) headers.Authorization = `Bearer ${state.token}`;
    if (contentType) headers["Content-Type"] = contentType;
    const resp = await fetch(path, { method, headers, body });
    const data = await resp.json().catch(() => null);
    if (resp.status === 401 && attempt < 3) {
      await askToken(state.token ? "That token was refused." : null);
      continue;
    }
    if (!resp.ok) {
      const code = (data && data.error_code) || "HTTP_ERROR";
      throw new ApiError(resp.status, code, (data && data.message) || resp.statusText);
    }
    return data;
  }
}

async function fetchBlob(path) {
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
  const resp = await fetch(path, { headers });
  if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
  return resp.blob();
}

let tokenWaiters = null;

// Asks once for the token and keeps it for this tab (sessionStorage); concurrent callers share
// the one dialog.
function askToken(error) {
  if (tokenWaiters) return new Promise((resolve) => tokenWaiters.push(resolve));
  tokenWaiters = [];
  const dialog = $("token-dialog");
  $("token-error").hidden = !error;
  $("token-error").textContent = error || "";
  $("token").value = "";
  dialog.showModal();
  $("token").focus();
  return new Promise((resolve) => {
    tokenWaiters.push(resolve);
    $("token-form").onsubmit = () => {
      state.token = $("token").value.trim();
      sessionStorage.setItem(TOKEN_KEY, state.token);
      const waiters = tokenWaiters;
      tokenWaiters = null;
      for (const w of waiters) w();
    };
  });
}

// --- sessions ----------------------------------------------------------------------------------

// Paths: the gateway-wide calls are relative to the page (which may be served under a fleet's
// route prefix, /pods/<name>/ui); a session's own calls go where its ws_path says, the gateway
// that holds it (docs/fleet.md).
function sessionPath(id) {
  const s = state.sessions.find((x) => x.session_id === id);
  if (s && typeof s.ws_path === "string" && s.ws_path.endsWith("/ws")) return s.ws_path.slice(0, -3);
  return `v1/session/${id}`;
}

function showError(err) {
  banner(err.message || String(err), "error");
}

function banner(text, kind = "info") {
  const b = $("banner");
  b.textContent = text;
  b.dataset.kind = kind;
  b.hidden = !text;
}

async function loadAgents() {
  const data = await api("GET", "v1/agents");
  const select = $("new-agent");
  select.replaceChildren();
  for (const a of data.agents || []) {
    const option = el("option", { value: a.name, text: a.name, title: a.description || "" });
    option.dataset.conversations = a.conversations ? "yes" : "no";
    select.append(option);
  }
  if ([...select.options].some((o) => o.value === "demo")) select.value = "demo";
  agentChanged();
}

// --- the agent's own saved conversations (docs/http-api.md, Conversations) -----------------------

function agentChanged() {
  const option = $("new-agent").selectedOptions[0];
  $("list-conversations").disabled = !option || option.dataset.conversations !== "yes";
  $("conversations").hidden = true;
}

async function listConversations() {
  const agent = $("new-agent").value;
  const workspace = $("new-workspace").value.trim();
  const query = new URLSearchParams(workspace ? { workspace } : {});
  const data = await api("GET", `v1/agents/${encodeURIComponent(agent)}/conversations?${query}`);
  const list = $("conversations");
  list.replaceChildren();
  for (const c of data.conversations || []) {
    const when = c.updated_at ? c.updated_at.replace("T", " ").replace("Z", " UTC") : "";
    const turns = c.turns == null ? "" : ` · ${c.turns} turn${c.turns === 1 ? "" : "s"}`;
    // Inside the new-session form: a plain button, not one that submits it.
    const go = el("button", { type: "button", class: "continue", text: "Continue" });
    go.onclick = () => continueConversation(agent, workspace, c.id).catch(showError);
    list.append(
      el(
        "li",
        { "data-conversation-id": c.id },
        el("span", { class: "title", text: c.title || "(untitled)" }),
        el("span", { class: "meta", text: `${when}${turns}` }),
        go,
      ),
    );
  }
  if (!list.children.length) {
    list.append(el("li", { class: "empty", text: "No saved conversations in this workspace." }));
  } else if (!data.complete) {
    list.append(el("li", { class: "empty", text: "Only the newest are listed." }));
  }
  list.hidden = false;
}

async function continueConversation(agent, workspace, id) {
  const body = { agent, resume_conversation: id };
  if (workspace) body.workspace_path = workspace;
  const name = $("new-name").value.trim();
  if (name) body.name = name;
  const s = await api("POST", "v1/session", body);
  $("new-name").value = "";
  $("conversations").hidden = true;
  await refreshSessions();
  if (!state.sessions.some((x) => x.session_id === s.session_id)) state.sessions.push(s);
  await attachTo(s.session_id);
}

async function refreshSessions() {
  const data = await api("GET", "v1/sessions");
  state.sessions = data.sessions || [];
  const list = $("sessions");
  // Not while a rename is typed or a delete awaits its second click: redrawing would drop it.
  if (!list.querySelector(".rename-form, [data-confirm=yes]")) {
    list.replaceChildren();
    for (const s of state.sessions) list.append(sessionItem(s));
  }
  const cur = state.current && state.sessions.find((s) => s.session_id === state.current.id);
  if (cur) showSessionInfo(cur);
  showWhoami();
  updateControls();
}

function sessionItem(s) {
  const name = s.name || s.session_id.slice(0, 8);
  const attach = el("button", { class: "attach", text: "Attach", disabled: s.state === "TERMINATED" });
  attach.onclick = () => attachTo(s.session_id).catch(showError);
  const rename = el("button", { class: "rename", text: "Rename", disabled: s.state === "TERMINATED" });
  const del = el("button", { class: "delete", text: "Delete" });
  const label = el("span", { class: "name", text: name });
  // Renaming and deleting are an admin's: a button the role cannot use is not shown.
  const admin = atLeast(roleOn(s), "admin");
  const owner = s.owner && state.me && s.owner !== state.me.user ? ` · ${s.owner}'s` : "";
  const item = el(
    "li",
    { "data-session-id": s.session_id, "data-state": s.state, "data-role": roleOn(s) || "" },
    label,
    el("span", { class: "meta", text: `${s.agent} · ${s.state.toLowerCase()} · ${s.connections} attached${owner}` }),
    el("span", { class: "actions" }, attach, ...(admin ? [rename, del] : [])),
  );
  if (state.current && state.current.id === s.session_id) item.classList.add("current");
  rename.onclick = () => {
    const input = el("input", { class: "rename-input", value: s.name || "", "aria-label": "new name" });
    const save = el("button", { class: "rename-save", text: "Save" });
    const form = el("form", { class: "rename-form" }, input, save);
    form.onsubmit = (e) => {
      e.preventDefault();
      api("PATCH", sessionPath(s.session_id), { name: input.value.trim() })
        .then(() => {
          form.remove();
          return refreshSessions();
        })
        .catch(showError);
    };
    label.replaceWith(form);
    input.focus();
  };
  del.onclick = () => {
    if (del.dataset.confirm !== "yes") {
      // A second click confirms; no native confirm(), which blocks the page.
      del.dataset.confirm = "yes";
      del.textContent = "Really delete?";
      setTimeout(() => {
        del.dataset.confirm = "";
        del.textContent = "Delete";
      }, 4000);
      return;
    }
    del.dataset.confirm = "";
    api("DELETE", sessionPath(s.session_id))
      .then(() => {
        if (state.current && state.current.id === s.session_id) detach();
        return refreshSessions();
      })
      .catch(showError);
  };
  return item;
}

function showSessionInfo(s) {
  $("session-title").textContent = s.name || `${s.agent} ${s.session_id.slice(0, 8)}`;
  document.title = `${$("session-title").textContent} · rawp-gateway`;
}

async function createSession(event) {
  event.preventDefault();
  const body = { agent: $("new-agent").value };
  const workspace = $("new-workspace").value.trim();
  const name = $("new-name").value.trim();
  if (workspace) body.workspace_path = workspace;
  if (name) body.name = name;
  const s = await api("POST", "v1/session", body);
  $("new-name").value = "";
  await refreshSessions();
  if (!state.sessions.some((x) => x.session_id === s.session_id)) state.sessions.push(s);
  await attachTo(s.session_id);
}

// --- attaching ---------------------------------------------------------------------------------

function savedKey(id) {
  return SAVED_PREFIX + id;
}

function loadSaved(id) {
  try {
    return JSON.parse(sessionStorage.getItem(savedKey(id)) || "null");
  } catch {
    return null;
  }
}

let saveTimer = null;

function scheduleSave() {
  if (saveTimer === null) saveTimer = setTimeout(saveNow, SAVE_DELAY_MS);
}

// The transcript and the reattach mark survive a reload of the tab; past MAX_SAVED_CHARS the
// oldest frames are left out (and the page says so when it comes back).
function saveNow() {
  clearTimeout(saveTimer);
  saveTimer = null;
  const cur = state.current;
  if (!cur) return;
  const snap = cur.view.snapshot();
  let frames = snap.transcript;
  let trimmed = cur.trimmed;
  for (;;) {
    const text = JSON.stringify({ ...snap, transcript: frames, trimmed });
    if (text.length <= MAX_SAVED_CHARS || frames.length === 0) {
      try {
        sessionStorage.setItem(savedKey(cur.id), text);
        return;
      } catch {
        // The tab's storage is full: other sessions' transcripts go first, then our oldest frames.
        if (dropOtherSessions(cur.id)) continue;
        if (frames.length === 0) return; // full even without frames: nothing kept
      }
    }
    frames = frames.slice(Math.ceil(frames.length / 4));
    trimmed = true;
  }
}

// Leaving (reload, navigation, a tab put in the back/forward cache): keep the transcript and close
// the socket, so the gateway buffers for a reattach. A page restored from that cache finds the
// connection lost and reattaches by itself.
function leavePage() {
  saveNow();
  const cur = state.current;
  if (cur && cur.ws) cur.ws.close(1000, "page hidden");
}

function dropOtherSessions(keep) {
  const others = [];
  for (let i = 0; i < sessionStorage.length; i++) {
    const key = sessionStorage.key(i);
    if (key.startsWith(SAVED_PREFIX) && key !== savedKey(keep)) others.push(key);
  }
  for (const key of others) sessionStorage.removeItem(key);
  return others.length > 0;
}

function detach() {
  const cur = state.current;
  if (!cur) return;
  saveNow();
  cur.closing = true;
  clearTimeout(cur.timer);
  if (cur.ws) cur.ws.close(1000, "detached");
  state.current = null;
  closeAsk();
  clearAttachments(); // they were stored in that session
  renderer.reset();
  renderer.forget();
  mcpServers.reset();
  setConnection("none", "not attached");
  $("session-title").textContent = "rawp-gateway";
  history.replaceState(null, "", "#");
  updateControls();
}

async function attachTo(id) {
  if (state.current && state.current.id === id) return;
  detach();
  const saved = loadSaved(id);
  const view = saved ? SessionView.restore(id, saved) : new SessionView(id);
  const cur = { id, view, ws: null, caps: null, retry: 0, timer: null, closing: false };
  cur.trimmed = Boolean(saved && saved.trimmed);
  state.current = cur;
  history.replaceState(null, "", `#session=${id}`);
  document.body.classList.remove("show-sessions");
  const info = state.sessions.find((s) => s.session_id === id);
  if (info) showSessionInfo(info);
  for (const li of $("sessions").children) li.classList.toggle("current", li.dataset.sessionId === id);
  // What was open when the page went away is shown interrupted until the history comes.
  view.finalize();
  renderer.renderAll(view.transcript);
  if (cur.trimmed) banner("The earliest part of this transcript was not kept in this tab.", "info");
  else banner("");
  updateControls();
  await connect(cur);
}

async function connect(cur) {
  if (cur !== state.current) return;
  setConnection("connecting", cur.view.lastMessageId ? "reattaching…" : "connecting…");
  let ticket = null;
  try {
    const info = await api("GET", sessionPath(cur.id));
    if (info.state === "TERMINATED") return ended(cur, "This session has ended.");
    if (state.token) ticket = (await api("POST", `${sessionPath(cur.id)}/ws-ticket`)).ticket;
  } catch (err) {
    if (err instanceof ApiError && (err.status === 404 || err.status === 409)) {
      return ended(cur, "This session no longer exists on the gateway.");
    }
    return retryLater(cur);
  }
  if (cur !== state.current) return;
  const params = new URLSearchParams();
  // With nothing of this session yet (a new tab, another browser, a gateway restarted), ask for
  // everything the gateway still holds: a reattach from nowhere would say "truncated".
  cur.fresh = !cur.view.lastMessageId;
  if (cur.fresh) params.set("history", "all");
  else params.set("last_message_id", cur.view.lastMessageId);
  if (ticket) params.set("ticket", ticket); // never the token itself
  const url = new URL(`${sessionPath(cur.id)}/ws`, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.search = params.toString();
  const ws = new WebSocket(url.href, SUBPROTOCOL);
  cur.ws = ws;
  cur.historyParts = new HistoryParts();
  ws.onopen = () => {
    cur.retry = 0;
    const caps = {
      protocol_version: SUBPROTOCOL,
      supported_namespaces: ["agent", "tool", "control", "session"],
      features: FEATURES,
    };
    ws.send(JSON.stringify(makeFrame(cur.id, "session.capabilities", caps)));
    setConnection("open", "attached");
    updateControls();
    refreshSessions().catch(() => {});
  };
  ws.onmessage = (msg) => {
    if (cur !== state.current || typeof msg.data !== "string") return;
    let frame;
    try {
      frame = JSON.parse(msg.data);
    } catch {
      return;
    }
    if (frame && typeof frame.type === "string") receive(cur, frame);
  };
  ws.onclose = () => {
    if (cur.ws !== ws) return;
    cur.ws = null;
    if (cur.closing || cur !== state.current) return;
    lost(cur);
  };
}

function ended(cur, text) {
  if (cur !== state.current) return;
  setConnection("ended", "ended");
  banner(text, "error");
  updateControls();
}

// The connection is gone: close what was open locally, then try again with the reattach mark.
function lost(cur) {
  const made = cur.view.finalize();
  for (const f of made) renderer.render(f);
  closeAsk();
  scheduleSave();
  if (cur.view.deleted) return ended(cur, "This session was deleted.");
  retryLater(cur);
}

function retryLater(cur) {
  if (cur !== state.current) return;
  const delay = Math.min(RECONNECT_MAX_MS, 500 * 2 ** cur.retry);
  cur.retry += 1;
  setConnection("reconnecting", `connection lost — retrying in ${Math.round(delay / 1000)} s`);
  updateControls();
  cur.timer = setTimeout(() => connect(cur), delay);
}

function receive(cur, frame) {
  // The parts of a split history are applied together: one notice, one §7.8 replay, and the
  // reattach mark moves only once their frames are shown.
  if (frame.type === "session.history") frame = cur.historyParts.add(frame);
  if (frame === null) return;
  const view = cur.view;
  view.received(frame);
  if (frame.type === "session.history") {
    const outcome = view.history(frame.payload);
    if (outcome.unfinalized) {
      renderer.renderAll(view.transcript);
    } else {
      for (const f of outcome.frames) renderer.render(f);
    }
    if (outcome.reason === "truncated" && cur.fresh) {
      const lost = outcome.lost == null ? "Some" : outcome.lost;
      banner(`${lost} earlier frame(s) of this session are no longer held by the gateway; the conversation shown starts later.`, "warning");
    } else if (outcome.reason === "truncated") {
      const lost = outcome.lost == null ? "some" : outcome.lost;
      banner(`History truncated: the gateway no longer had ${lost} frame(s) of what happened while this page was away; what was open is shown interrupted.`, "warning");
    } else if (outcome.reason === "deleted") {
      banner("This session was deleted while this page was away.", "error");
    } else if (!cur.trimmed) {
      banner("");
    }
  } else if (frame.type === "session.capabilities") {
    cur.caps = frame.payload;
  } else if (view.apply(frame)) {
    renderer.render(frame);
  }
  afterFrame(cur, frame);
  scheduleSave();
}

function afterFrame(cur, frame) {
  const p = frame.payload || {};
  // A catalog said again on attach is one the view has (the same id): it is still the newest.
  mcpServers.frame(frame);
  switch (frame.type) {
    case "session.renamed":
      refreshSessions().catch(() => {});
      break;
    case "session.deleted":
      cur.closing = true;
      ended(cur, "This session was deleted.");
      refreshSessions().catch(() => {});
      break;
    case "session.error":
      if (String(p.error_code).startsWith("MODE_")) $("mode").value = cur.view.mode || "default";
      break;
  }
  // Whatever the frame, the question on screen must be one still open.
  syncAsk(cur);
  updateControls();
}

function send(type, payload, opts = {}) {
  const cur = state.current;
  if (!cur || !cur.ws || cur.ws.readyState !== WebSocket.OPEN) {
    banner("Not connected: wait for the console to reattach.", "error");
    return null;
  }
  const frame = makeFrame(cur.id, type, payload, opts);
  cur.ws.send(JSON.stringify(frame));
  // The gateway stamps who sent it on the copies the other masters get; ours says it too.
  if (opts.record && state.me) frame.metadata = { ...(frame.metadata || {}), rawp_user: state.me.user };
  // Our own prompts and answers are part of the transcript (and close what they answer).
  if (opts.record && cur.view.apply(frame)) renderer.render(frame);
  scheduleSave();
  return frame;
}

// --- controls ----------------------------------------------------------------------------------

function setConnection(kind, text) {
  document.body.dataset.connection = kind;
  $("connection").textContent = text;
  $("connection").dataset.kind = kind;
}

function updateControls() {
  const cur = state.current;
  // A deleted session's socket may still be open for a moment: nothing goes to it any more.
  const open = Boolean(
    cur && !cur.view.deleted && cur.ws && cur.ws.readyState === WebSocket.OPEN,
  );
  const features = (cur && cur.caps && cur.caps.features) || {};
  const running = Boolean(cur && cur.view.turnId);
  showWhoami();
  $("prompt").disabled = !cur || Boolean(cur.view.deleted);
  $("send").disabled = !open;
  $("attach").disabled = !cur || Boolean(cur.view.deleted);
  $("cancel").disabled = !open || !running;
  $("compact").disabled = !open || running || !features.context_compaction;
  $("mode").disabled = !open || running || !features.plan_mode;
  if (cur && cur.view.mode && document.activeElement !== $("mode")) $("mode").value = cur.view.mode;
  $("agent-state").textContent = cur ? cur.view.open.agentState : "";
  document.body.dataset.turn = running ? "running" : "idle";
}

function sendPrompt() {
  const text = $("prompt").value;
  const files = state.attachments;
  if (!text.trim() && files.length === 0) return;
  if (files.some((a) => !a.fileUrl)) {
    banner("Wait until the attached files are uploaded.", "info");
    return;
  }
  const slash = text.startsWith("/");
  const payload = { prompt_text: text, input_type: slash ? "slash_command" : "text" };
  if (files.length) {
    payload.context_files = files.map((a) => ({ file_url: a.fileUrl, file_name: a.name, mime_type: a.mimeType }));
  }
  if (send("control.prompt.request", payload, { record: true })) {
    $("prompt").value = "";
    clearAttachments();
  }
}

// --- files for the next prompt (docs/files.md: PUT, then context_files) --------------------------

function formatSize(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

function clearAttachments() {
  state.attachments = [];
  $("attachments").replaceChildren();
  $("attachments").hidden = true;
}

function dropAttachment(a) {
  state.attachments = state.attachments.filter((x) => x !== a);
  a.chip.remove();
  $("attachments").hidden = state.attachments.length === 0;
}

// Each file is stored in the session at once (PUT with its type and the token, one at a time) and
// shown as a chip; the next prompt names the stored ones. A refusal (too large, a bad name, the
// session's storage full) is said in the banner and the file is not attached.
async function attachFiles(files) {
  const cur = state.current;
  if (!cur) return;
  const queued = [];
  for (const file of files) {
    if (state.attachments.length >= MAX_ATTACHMENTS) {
      banner(`At most ${MAX_ATTACHMENTS} files go with one prompt; ${file.name} was not attached.`, "error");
      continue;
    }
    const a = { name: file.name, mimeType: file.type || "application/octet-stream", size: file.size, fileUrl: null };
    a.chip = attachmentChip(a);
    state.attachments.push(a);
    $("attachments").append(a.chip);
    queued.push([a, file]);
  }
  $("attachments").hidden = state.attachments.length === 0;
  for (const [a, file] of queued) {
    if (cur !== state.current || !state.attachments.includes(a)) continue; // left, or removed
    try {
      const path = `${sessionPath(cur.id)}/files?name=${encodeURIComponent(a.name)}`;
      const stored = await request("PUT", path, file, a.mimeType);
      if (cur !== state.current || !state.attachments.includes(a)) continue;
      a.fileUrl = stored.file_url;
      a.mimeType = stored.mime_type || a.mimeType;
      a.chip.dataset.state = "ready";
      a.chip.querySelector(".chip-meta").textContent = formatSize(stored.size_bytes ?? a.size);
    } catch (err) {
      if (state.attachments.includes(a)) dropAttachment(a);
      banner(`Could not attach ${a.name}: ${err.message}`, "error");
    }
  }
}

function cancelTurn() {
  const cur = state.current;
  const turnId = cur && cur.view.turnId;
  if (!turnId) return;
  send("control.prompt.cancel", { target_turn_id: turnId, reason: "user_cancelled" }, { turnId });
}

function attachmentChip(a) {
  const remove = el("button", { type: "button", class: "chip-remove", text: "×", title: `Leave ${a.name} out`, "aria-label": `remove ${a.name}` });
  remove.onclick = () => dropAttachment(a);
  return el(
    "li",
    { class: "chip", "data-state": "uploading", title: `${a.name} (${a.mimeType})` },
    el("span", { class: "chip-name", text: a.name }),
    el("span", { class: "chip-meta", text: `${formatSize(a.size)} · uploading` }),
    remove,
  );
}

// --- questions (agent.interaction.request) ------------------------------------------------------

function syncAsk(cur) {
  // A viewer sees the question in the transcript; answering is an operator's.
  const pending = atLeast(currentRole(), "operator") ? cur.view.pendingInteractions : [];
  if (state.asking && !pending.some((f) => f.payload.interaction_id === state.asking.id)) closeAsk();
  if (!state.asking && pending.length > 0) showAsk(pending[0]);
}

function closeAsk() {
  if (!state.asking) return;
  clearInterval(state.asking.timer);
  state.asking = null;
  const dialog = $("ask-dialog");
  if (dialog.open) dialog.close();
  if (state.current) $("prompt").focus();
}

function answer(frame, value, textInput) {
  const payload = { interaction_id: frame.payload.interaction_id, selected_value: value };
  if (textInput !== undefined) payload.text_input = textInput;
  send("control.interaction.response", payload, { turnId: frame.turn_id, record: true });
  closeAsk();
  if (state.current) syncAsk(state.current);
}

function showAsk(frame) {
  const p = frame.payload;
  const dialog = $("ask-dialog");
  dialog.dataset.type = p.interaction_type;
  dialog.dataset.interactionId = p.interaction_id;
  const ctx = p.context || {};
  $("ask-question").textContent = ctx.tool_name ? `Allow ${describeCall(ctx.tool_name, ctx.tool_input)}?` : p.question_text;
  $("ask-context").replaceChildren();
  if (ctx.tool_input) $("ask-context").append(jsonTree(ctx.tool_input));
  if (ctx.affected_paths && ctx.affected_paths.length) {
    $("ask-context").append(el("div", { class: "paths", text: ctx.affected_paths.join(", ") }));
  }
  const input = $("ask-input");
  const options = $("ask-options");
  input.replaceChildren();
  options.replaceChildren();
  const buttons = [];
  if (p.interaction_type === "TEXT_INPUT") {
    const field = el("input", { id: "ask-text", value: p.default_value || "", "aria-label": "answer" });
    input.append(field);
    const ok = el("button", { type: "button", class: "option", text: "Answer" });
    ok.onclick = () => answer(frame, field.value, field.value);
    buttons.push(ok);
  } else if (p.interaction_type === "MULTI_SELECT") {
    for (const o of p.options) {
      input.append(el("label", { class: "check" }, el("input", { type: "checkbox", value: o.value }), ` ${o.label}`));
    }
    const ok = el("button", { type: "button", class: "option", text: "Answer" });
    ok.onclick = () => answer(frame, [...input.querySelectorAll("input:checked")].map((c) => c.value));
    buttons.push(ok);
  } else {
    for (const o of p.options) {
      const b = el("button", { type: "button", class: "option", text: o.label, title: o.description || "" });
      b.dataset.value = o.value;
      if (o.risk_level) b.dataset.risk = o.risk_level;
      b.onclick = () => answer(frame, o.value);
      buttons.push(b);
    }
  }
  options.append(...buttons);
  const deadline = Math.min(timeKey(frame.timestamp), Date.now()) + p.timeout_sec * 1000;
  const tick = () => {
    const left = Math.max(0, Math.ceil((deadline - Date.now()) / 1000));
    $("ask-remaining").textContent = left > 0 ? `${left} s left to answer` : "time is up";
  };
  tick();
  state.asking = { id: p.interaction_id, frame, timer: setInterval(tick, 250) };
  if (!dialog.open) dialog.showModal();
  if (buttons.length) buttons[0].focus();
}

// --- wiring --------------------------------------------------------------------------------------

function wire() {
  $("new-session").addEventListener("submit", (e) => createSession(e).catch(showError));
  $("new-agent").addEventListener("change", agentChanged);
  $("new-workspace").addEventListener("input", () => ($("conversations").hidden = true));
  $("list-conversations").onclick = () => listConversations().catch(showError);
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    sendPrompt();
  });
  $("attach").onclick = () => $("attach-input").click();
  $("attach-input").addEventListener("change", () => {
    const files = [...$("attach-input").files];
    $("attach-input").value = ""; // the same file can be chosen again
    attachFiles(files).catch(showError);
  });
  // A pasted image (a screenshot) is attached; pasted text stays text.
  $("prompt").addEventListener("paste", (e) => {
    const files = [...((e.clipboardData && e.clipboardData.files) || [])];
    if (files.length === 0) return;
    e.preventDefault();
    attachFiles(files).catch(showError);
  });
  // Files dropped anywhere on the page are attached (and never open in place of the console).
  const carriesFiles = (e) => Boolean(e.dataTransfer && e.dataTransfer.types.includes("Files"));
  document.addEventListener("dragover", (e) => {
    if (!carriesFiles(e)) return;
    e.preventDefault();
    $("composer").classList.toggle("dropping", Boolean(state.current));
  });
  document.addEventListener("dragleave", (e) => {
    if (e.relatedTarget === null) $("composer").classList.remove("dropping");
  });
  document.addEventListener("drop", (e) => {
    if (!carriesFiles(e)) return;
    e.preventDefault();
    $("composer").classList.remove("dropping");
    if (state.current) attachFiles([...e.dataTransfer.files]).catch(showError);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      sendPrompt();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.current && state.current.view.turnId) {
      e.preventDefault();
      cancelTurn();
    }
  });
  // Esc in the question dialog cancels the turn (above) and does not just hide the question.
  $("ask-dialog").addEventListener("cancel", (e) => e.preventDefault());
  $("token-dialog").addEventListener("cancel", (e) => e.preventDefault());
  $("cancel").onclick = cancelTurn;
  $("compact").onclick = () => send("control.session.compact", {});
  $("mode").onchange = () => send("control.mode.switch", { mode: $("mode").value });
  $("toggle-sessions").onclick = () => document.body.classList.toggle("show-sessions");
  window.addEventListener("pagehide", leavePage);
  // A URL naming another session (`rawp-gateway demo` prints one) opens it in this tab too.
  window.addEventListener("hashchange", () => {
    if (takeTokenFromAddress()) state.token = sessionStorage.getItem(TOKEN_KEY);
    const match = SESSION_HASH.exec(location.hash);
    if (match) attachTo(match[1]).catch(showError);
  });
}

async function main() {
  wire();
  try {
    await loadWhoami();
    await loadAgents();
    await refreshSessions();
  } catch (err) {
    showError(err);
  }
  const match = SESSION_HASH.exec(location.hash);
  if (match) await attachTo(match[1]).catch(showError);
  else document.body.classList.add("show-sessions");
  setInterval(() => {
    if (document.visibilityState === "visible") refreshSessions().catch(() => {});
  }, SESSIONS_POLL_MS);
}

main();
