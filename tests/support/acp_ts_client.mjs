// An editor made of the official ACP TypeScript SDK (@agentclientprotocol/sdk, pinned in
// scripts/install-agents.sh): it launches the agent command given as its arguments (here
// `rawp-gateway acp --url ...`) over stdio, as editors launch custom agents, and lets a test drive
// it with JSON lines on its own stdin (with `--http URL` instead of a command, it connects to URL
// with the SDK's Streamable HTTP client, createHttpStream; with `--ws URL`, with its WebSocket
// client, createWebSocketStream, given the `ws` package's WebSocket: Node 20 has no global one;
// either presents the headers of ACP_HEADERS, a JSON object: the credentials):
//   {"op": "request", "n": 1, "method": "session/new", "params": {...}}  -> {"reply": 1, "result"|"error": ...}
//   {"op": "notify", "method": "session/cancel", "params": {...}}
//   {"op": "answer", "n": 0, "optionId": "allow"}   answers question n (optionId null: cancelled)
//   {"op": "exit"}
// and reports on its stdout: {"event": "update", "params": ...} for each session/update,
// {"event": "question", "n": k, "params": ...} for each session/request_permission (held until
// answered), {"event": "ready"} once the agent runs. Everything the SDK does (framing, ids,
// parsing the agent's messages) is the SDK's own.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import path from "node:path";
import readline from "node:readline";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const prefix = process.env.ACP_SDK_PREFIX;
const require = createRequire(path.join(prefix, "package.json"));
const acp = await import(pathToFileURL(require.resolve("@agentclientprotocol/sdk")).href);

const say = (message) => process.stdout.write(JSON.stringify(message) + "\n");

const [command, ...args] = process.argv.slice(2);
let agent = null;
let stream;
const headers = JSON.parse(process.env.ACP_HEADERS ?? "{}");
if (command === "--http") {
  const http = await import(
    pathToFileURL(require.resolve("@agentclientprotocol/sdk/experimental/http-client")).href
  );
  stream = http.createHttpStream(args[0], { headers });
} else if (command === "--ws") {
  const { WebSocket } = createRequire(path.join(process.env.ACP_WS_PREFIX, "package.json"))("ws");
  const wsClient = await import(
    pathToFileURL(require.resolve("@agentclientprotocol/sdk/experimental/ws-client")).href
  );
  stream = wsClient.createWebSocketStream(args[0], { headers, WebSocket });
} else {
  agent = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
  stream = acp.ndJsonStream(
    Writable.toWeb(agent.stdin),
    Readable.toWeb(agent.stdout),
  );
}

const questions = [];
const app = acp
  .client({ name: "rawp-test-editor" })
  .onNotification(acp.methods.client.session.update, (context) => {
    say({ event: "update", params: context.params });
  })
  .onRequest(acp.methods.client.session.requestPermission, (context) =>
    new Promise((resolve) => {
      questions.push(resolve);
      say({ event: "question", n: questions.length - 1, params: context.params });
    }),
  );

function errorOf(err) {
  return { code: err.code ?? null, message: String(err.message ?? err), data: err.data ?? null };
}

await app.connectWith(stream, async (ctx) => {
  say({ event: "ready" });
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const cmd = JSON.parse(line);
    if (cmd.op === "exit") break;
    if (cmd.op === "request") {
      ctx.request(cmd.method, cmd.params).then(
        (result) => say({ reply: cmd.n, result: result ?? null }),
        (err) => say({ reply: cmd.n, error: errorOf(err) }),
      );
    } else if (cmd.op === "notify") {
      await ctx.notify(cmd.method, cmd.params);
    } else if (cmd.op === "answer") {
      const outcome = cmd.optionId == null
        ? { outcome: "cancelled" }
        : { outcome: "selected", optionId: cmd.optionId };
      questions[cmd.n]({ outcome });
    }
  }
});
if (agent !== null) {
  agent.stdin.end();
  await new Promise((resolve) => agent.once("exit", resolve));
}
process.exit(0);
