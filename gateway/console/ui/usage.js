// The session's running totals and context gauge, in the header (docs/usage.md). Added up from
// the frames the transcript shows (a reattach's history included), by the gateway's own rules:
// only the main agent's session.usage counts (a subagent's own report is not added again); its
// tokens are the turn's; cost_usage.used is the agent's running total, so its increases add up;
// the context fill is the last usage's, or after a compaction what is left of the last window.

import { subagentOf } from "./view.js";

const fmt = (n) => Number(n || 0).toLocaleString("en-US");

export class UsageMeter {
  constructor(root) {
    this.root = root;
    this.reset();
  }

  reset() {
    this.tokens = { input: 0, output: 0, cached: 0 };
    this.cost = 0; // USD, as reported
    this.lastCost = 0; // the agent's last running total
    this.fill = null; // 0..1
    this.capacity = null;
    this.compactions = 0;
    this.draw();
  }

  frame(frame) {
    if (subagentOf(frame)) return;
    const p = frame.payload || {};
    if (frame.type === "session.usage") this.usage(p);
    else if (frame.type === "session.compacted") this.compacted(p);
    else return;
    this.draw();
  }

  usage(p) {
    const t = p.token_usage || {};
    this.tokens.input += Math.max(0, t.input_tokens || 0);
    this.tokens.output += Math.max(0, t.output_tokens || 0);
    this.tokens.cached += Math.max(0, t.cache_read_tokens || 0);
    const used = p.cost_usage && p.cost_usage.unit === "USD" ? Number(p.cost_usage.used) || 0 : 0;
    if (used > 0) {
      this.cost += used >= this.lastCost ? used - this.lastCost : used;
      this.lastCost = used;
    }
    const w = p.context_window;
    if (w) {
      if (w.capacity) this.capacity = w.capacity;
      let fill = w.utilization;
      if (typeof fill !== "number" && w.capacity && typeof w.used === "number") fill = w.used / w.capacity;
      if (typeof fill === "number" && isFinite(fill)) this.fill = Math.min(Math.max(fill, 0), 1);
    }
  }

  compacted(p) {
    this.compactions += 1;
    if (this.capacity && p.current_token_count >= 0) this.fill = Math.min(p.current_token_count / this.capacity, 1);
  }

  draw() {
    const { input, output, cached } = this.tokens;
    if (!input && !output && !cached && this.fill === null && !this.compactions) {
      this.root.replaceChildren(); // an empty pill is hidden
      return;
    }
    const parts = [`${fmt(input)} in · ${fmt(output)} out`];
    if (cached) parts.push(`${fmt(cached)} cached`);
    if (this.cost > 0) parts.push(`$${this.cost.toFixed(4)}`);
    const text = document.createElement("span");
    text.className = "usage-totals";
    text.textContent = parts.join(" · ");
    const children = [text];
    let title = `Session totals: ${fmt(input)} input, ${fmt(output)} output, ${fmt(cached)} cached tokens`;
    title += this.cost > 0 ? `; $${this.cost.toFixed(4)} as the agent reports it` : "; no cost reported";
    if (this.fill !== null) {
      const pct = Math.round(this.fill * 100);
      const meter = document.createElement("meter");
      Object.assign(meter, { min: 0, max: 1, low: 0.8, high: 0.95, optimum: 0, value: this.fill });
      meter.className = "context-meter";
      const label = document.createElement("span");
      label.className = "context-fill";
      label.textContent = `context ${pct}%`;
      children.push(meter, label);
      title += `; context window ${pct}% full` + (this.capacity ? ` of ${fmt(this.capacity)} tokens` : "");
    }
    if (this.compactions) {
      const c = document.createElement("span");
      c.className = "compactions";
      c.textContent = `compacted ×${this.compactions}`;
      children.push(c);
      title += `; compacted ${this.compactions} time${this.compactions === 1 ? "" : "s"}`;
    }
    this.root.title = title;
    this.root.replaceChildren(...children);
  }
}
