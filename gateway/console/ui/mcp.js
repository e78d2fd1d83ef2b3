// What became of the session's MCP servers, in the header (docs/mcp.md#what-masters-see): the
// newest catalog's metadata.rawp_mcp_servers (or the gateway's session.capabilities'
// extensions.mcp_servers) as a pill, "MCP 1/2" (connected of all), marked when one failed, that
// opens the list: each server's name, kind, origin, status, number of tools, and why it failed.
// The list carries names, never the values of env variables or headers; what the agent said (a
// reason, a server it reported) is text, never markup.

const MAX_SHOWN = 64; // servers listed (the gateway gives a session at most 32, the agent a few more)

export function serversOf(frame) {
  let servers;
  if (frame.type === "tool.catalog.publish") servers = (frame.metadata || {}).rawp_mcp_servers;
  else if (frame.type === "session.capabilities") servers = ((frame.payload || {}).extensions || {}).mcp_servers;
  else return null;
  if (!Array.isArray(servers)) return [];
  return servers.filter((s) => s && typeof s === "object" && typeof s.name === "string").slice(0, MAX_SHOWN);
}

const text = (v) => (typeof v === "string" || typeof v === "number" ? String(v) : "");

function item(server) {
  const li = document.createElement("li");
  const status = text(server.status) || "pending";
  li.className = "mcp-server";
  li.dataset.name = server.name;
  li.dataset.status = status;
  const name = document.createElement("span");
  name.className = "mcp-name";
  name.textContent = server.name;
  const badge = document.createElement("span");
  badge.className = "mcp-status";
  badge.textContent = status === "failed" ? "✗ failed" : status;
  const tools = Array.isArray(server.tools) ? server.tools.length : 0;
  const meta = document.createElement("span");
  meta.className = "mcp-meta";
  meta.textContent = [text(server.kind), text(server.origin) && `from ${text(server.origin)}`, `${tools} tool${tools === 1 ? "" : "s"}`]
    .filter(Boolean)
    .join(" · ");
  li.append(name, badge, meta);
  if (server.reason) {
    const reason = document.createElement("span");
    reason.className = "mcp-reason";
    reason.textContent = text(server.reason);
    li.append(reason);
  }
  if (tools) li.title = server.tools.map(text).join("\n");
  return li;
}

export class McpServers {
  constructor(root) {
    this.root = root;
    this.reset();
  }

  reset() {
    this.servers = [];
    this.draw();
  }

  // Any frame: a catalog or the gateway's capabilities replace what is shown.
  frame(frame) {
    const servers = serversOf(frame);
    if (servers === null) return;
    this.servers = servers;
    this.draw();
  }

  draw() {
    const root = this.root;
    const servers = this.servers;
    root.hidden = servers.length === 0;
    const connected = servers.filter((s) => s.status === "connected").length;
    const failed = servers.filter((s) => s.status === "failed").length;
    root.dataset.state = failed ? "failed" : servers.some((s) => s.status !== "connected") ? "partial" : "connected";
    const summary = document.createElement("summary");
    summary.className = "pill";
    summary.textContent = `MCP ${connected}/${servers.length}` + (failed ? ` · ${failed} failed` : "");
    summary.title = "The session's MCP servers: connected of all";
    const list = document.createElement("ul");
    list.className = "mcp-list";
    list.append(...servers.map(item));
    root.replaceChildren(summary, list);
  }
}
