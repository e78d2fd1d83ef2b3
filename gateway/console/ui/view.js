// The master's state of one session and the §7.8 rules, with no DOM and no I/O (the same rules
// as MasterView in gateway/client/view.py). apply() takes every frame received or sent;
// finalize() runs when the socket is lost and closes what is open with synthetic frames
// (metadata.synthetic); history() after a reattach removes them, reopens what they closed and
// replays the history in timestamp, then message_id order, unless the buffer was truncated or the
// session was deleted.

export const SYNTHETIC_OUTPUT = "Connection lost";
export const DISCONNECTED = "disconnected";

// Frames a gateway may send to one connection only, outside its replay buffer: they never move
// the reattach mark.
const MAYBE_UNBUFFERED = new Set([
  "session.capabilities",
  "session.history",
  "session.error",
  "tool.catalog.publish",
  "agent.commands.publish",
]);

export function uuid4() {
  // crypto.randomUUID exists only in secure contexts; a gateway reached over plain http on a
  // LAN address is not one, getRandomValues works everywhere.
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

export function makeFrame(sessionId, type, payload, { turnId, metadata } = {}) {
  const frame = {
    v: 1,
    type,
    message_id: uuid4(),
    timestamp: new Date().toISOString(),
    session_id: sessionId,
    payload,
  };
  if (turnId) frame.turn_id = turnId;
  if (metadata) frame.metadata = metadata;
  return frame;
}

export function timeKey(ts) {
  const t = Date.parse(ts);
  return Number.isNaN(t) ? Number.MAX_SAFE_INTEGER : t;
}

export function historyOrder(frames) {
  return [...frames].sort((a, b) => {
    const d = timeKey(a.timestamp) - timeKey(b.timestamp);
    if (d !== 0) return d;
    return a.message_id < b.message_id ? -1 : a.message_id > b.message_id ? 1 : 0;
  });
}

// A history the gateway split to fit its max_frame_size (metadata.history_part of
// history_parts, docs/protocol-notes.md) is applied as one session.history, as Connection in
// gateway/client/websocket.py does: the parts' frames in order, the last part's ids and status.
// One per connection; the gateway bounds what the parts hold (its send queue), so nothing here
// needs a limit of its own.
export class HistoryParts {
  constructor() {
    this.frames = null;
  }

  // The whole history, or null while parts are still to come.
  add(frame) {
    const meta = frame.metadata || {};
    const part = meta.history_part;
    const parts = meta.history_parts;
    if (!(Number.isInteger(part) && Number.isInteger(parts) && parts > 1)) return frame;
    if (part === 1 || this.frames === null) this.frames = [];
    this.frames.push(...((frame.payload || {}).frames || []));
    if (part < parts) return null;
    const whole = { ...frame, payload: { ...frame.payload, frames: this.frames } };
    this.frames = null;
    return whole;
  }
}

export const isSynthetic = (f) => Boolean(f.metadata && f.metadata.synthetic === true);

export function subagentOf(frame) {
  const ctx = frame.metadata && frame.metadata.subagent_context;
  return ctx && typeof ctx === "object" ? ctx : null;
}

function blockKey(frame, index) {
  const ctx = subagentOf(frame);
  return JSON.stringify([frame.turn_id || null, ctx ? ctx.parent_invocation_id : null, index]);
}

function emptyOpen() {
  return {
    text: new Map(), // blockKey -> {first, parts}
    thinking: new Map(),
    calls: new Map(), // invocation_id -> request frame
    interactions: new Map(), // interaction_id -> request frame
    turn: null,
    agentState: "idle",
  };
}

function mergeOpen(into, other) {
  for (const name of ["text", "thinking", "calls", "interactions"]) {
    for (const [k, v] of other[name]) into[name].set(k, v);
  }
  into.turn = other.turn || into.turn;
  if (other.agentState !== "idle") into.agentState = other.agentState;
}

const SEEN_CAPACITY = 65536;
const CLOSED_CAPACITY = 4096;

export class SessionView {
  constructor(sessionId) {
    this.sessionId = sessionId;
    this.transcript = [];
    this.mode = null;
    this.deleted = null;
    this.lastMessageId = null; // newest frame the gateway's buffer surely holds
    this.mark = null; // its time
    this.open = emptyOpen();
    this.finalized = null;
    this.seen = new Set();
    this.closed = new Map(); // key -> time of the closing frame (insertion ordered)
  }

  get turnId() {
    return this.open.turn ? this.open.turn.payload.turn_id : null;
  }

  get pendingInteractions() {
    return [...this.open.interactions.values()];
  }

  // The reattach mark (Connection._advance in gateway/client/websocket.py): frames sent to this
  // connection only, and frames older than the mark, do not move it.
  received(frame) {
    if (frame.type === "session.history") {
      if (frame.payload.last_message_id) {
        this.lastMessageId = frame.payload.last_message_id;
        this.mark = timeKey(frame.payload.last_sync_timestamp);
      }
      return;
    }
    if (MAYBE_UNBUFFERED.has(frame.type)) return;
    const at = timeKey(frame.timestamp);
    if (this.mark !== null && at < this.mark) return;
    this.lastMessageId = frame.message_id;
    this.mark = at;
  }

  remember(id) {
    if (this.seen.has(id)) return false;
    this.seen.add(id);
    if (this.seen.size > SEEN_CAPACITY) this.seen.delete(this.seen.values().next().value);
    return true;
  }

  closeKey(key, frame) {
    this.closed.delete(key);
    this.closed.set(key, timeKey(frame.timestamp));
    if (this.closed.size > CLOSED_CAPACITY) this.closed.delete(this.closed.keys().next().value);
  }

  closedSince(key, frame) {
    const at = this.closed.get(key);
    return at !== undefined && timeKey(frame.timestamp) <= at;
  }

  // One frame into the view; false for a frame applied before. An opening frame never reopens
  // what a frame of the same or a later time closed (history order shuffles one millisecond).
  apply(frame) {
    if (!this.remember(frame.message_id)) return false;
    this.transcript.push(frame);
    const o = this.open;
    const p = frame.payload || {};
    switch (frame.type) {
      case "agent.text.delta":
      case "agent.thinking.delta": {
        const blocks = frame.type === "agent.text.delta" ? o.text : o.thinking;
        const key = blockKey(frame, p.content_index);
        if (blocks.has(key)) blocks.get(key).parts.push(p.text);
        else if (!this.closedSince(frame.type + key, frame))
          blocks.set(key, { first: frame, parts: [p.text] });
        break;
      }
      case "agent.text.done":
      case "agent.thinking.done": {
        const text = frame.type === "agent.text.done";
        const key = blockKey(frame, p.content_index);
        (text ? o.text : o.thinking).delete(key);
        this.closeKey((text ? "agent.text.delta" : "agent.thinking.delta") + key, frame);
        break;
      }
      case "tool.invoke.request":
        if (!this.closedSince("call" + p.invocation_id, frame)) o.calls.set(p.invocation_id, frame);
        break;
      case "tool.invoke.result":
        o.calls.delete(p.invocation_id);
        this.closeKey("call" + p.invocation_id, frame);
        break;
      case "agent.interaction.request":
        if (!this.closedSince("ask" + p.interaction_id, frame))
          o.interactions.set(p.interaction_id, frame);
        break;
      case "control.interaction.response":
      case "control.interaction.timeout":
        o.interactions.delete(p.interaction_id);
        this.closeKey("ask" + p.interaction_id, frame);
        break;
      case "session.turn.start":
        if (!this.closedSince("turn" + p.turn_id, frame)) o.turn = frame;
        if (p.mode) this.mode = p.mode;
        break;
      case "session.turn.end":
        if (this.turnId === p.turn_id) o.turn = null;
        this.closeKey("turn" + p.turn_id, frame);
        for (const [iid, req] of [...o.interactions]) {
          if (req.turn_id === p.turn_id) {
            o.interactions.delete(iid);
            this.closeKey("ask" + iid, frame);
          }
        }
        break;
      case "agent.state.changed":
        o.agentState = p.current_state;
        if (frame.metadata && frame.metadata.mode) this.mode = frame.metadata.mode;
        break;
      case "session.deleted":
        this.deleted = p;
        break;
    }
    return true;
  }

  synth(type, payload, like) {
    const metadata = { synthetic: true };
    const ctx = like ? subagentOf(like) : null;
    if (ctx) metadata.subagent_context = ctx;
    return makeFrame(this.sessionId, type, payload, { turnId: like && like.turn_id, metadata });
  }

  // The connection is gone: close everything open locally (DPS-7.8-finalize).
  finalize() {
    const o = this.open;
    const made = [];
    for (const [key, { first }] of o.thinking) {
      made.push(this.synth("agent.thinking.done", { content_index: JSON.parse(key)[2] }, first));
    }
    for (const [key, { first, parts }] of o.text) {
      const payload = { content_index: JSON.parse(key)[2], full_text: parts.join("") };
      made.push(this.synth("agent.text.done", payload, first));
    }
    for (const req of o.calls.values()) {
      const payload = {
        invocation_id: req.payload.invocation_id,
        tool_name: req.payload.tool_name,
        status: "cancelled",
        output: SYNTHETIC_OUTPUT,
        output_type: "text",
      };
      made.push(this.synth("tool.invoke.result", payload, req));
    }
    if (o.turn) {
      const payload = { turn_id: o.turn.payload.turn_id, stop_reason: DISCONNECTED };
      made.push(this.synth("session.turn.end", payload, o.turn));
    }
    if (o.agentState !== "idle") {
      const payload = { previous_state: o.agentState, current_state: "idle", reason: DISCONNECTED };
      made.push(this.synth("agent.state.changed", payload, null));
    }
    if (this.finalized === null) this.finalized = o;
    else mergeOpen(this.finalized, o);
    this.open = emptyOpen();
    for (const f of made) {
      this.remember(f.message_id);
      this.transcript.push(f);
    }
    return made;
  }

  // A reattach brought session.history (DPS-7.8-unfinalize, DPS-2.3-history-order).
  // Returns {unfinalized, reason, lost, frames}: frames are those to show (all of the history
  // when the finalisation stands, otherwise those newly applied).
  history(payload) {
    const frames = historyOrder(payload.frames || []);
    const status = payload.buffer_status || {};
    const deleted = frames.find((f) => f.type === "session.deleted");
    const reason = status.truncated ? "truncated" : deleted ? "deleted" : null;
    const lost = status.lost_frame_count ?? null;
    if (reason !== null) {
      // The finalisation stands; what came after is still shown (and tracked) as it is.
      const shown = frames.filter((f) => this.apply(f));
      return { unfinalized: false, reason, lost, frames: shown };
    }
    this.transcript = this.transcript.filter((f) => !isSynthetic(f));
    if (this.finalized !== null) {
      mergeOpen(this.finalized, this.open);
      this.open = this.finalized;
      this.finalized = null;
    }
    const applied = frames.filter((f) => this.apply(f));
    return { unfinalized: true, reason: null, lost, frames: applied };
  }

  // What survives a page reload: the transcript and the reattach mark.
  snapshot() {
    return { transcript: this.transcript, lastMessageId: this.lastMessageId, mark: this.mark };
  }

  static restore(sessionId, saved) {
    const view = new SessionView(sessionId);
    // Synthetic frames of an earlier finalisation are left out: the page finalises afresh, so
    // that a reattach can reopen what they would have closed.
    for (const f of saved.transcript || []) if (!isSynthetic(f)) view.apply(f);
    view.lastMessageId = saved.lastMessageId || null;
    view.mark = saved.mark ?? null;
    return view;
  }
}
