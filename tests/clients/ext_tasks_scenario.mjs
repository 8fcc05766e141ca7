// The official MCP Tasks requester (@modelcontextprotocol/ext-tasks, pinned in tests/js/tasks) against rlm-mcp over
// streamable HTTP at 2026-07-28: `node ext_tasks_scenario.mjs URL TOKEN CONTEXT_ID`. It calls
// rlm_complete through a task session twice: one run settles (its outcome printed), the other
// is cancelled through the execution. Prints one JSON line of what it saw; imports nothing of
// rlm-mcp. The TypeScript SDK client cannot send 2026-07-28 task requests itself, so the
// requester is given a raw dispatch (a JSON-RPC POST) and the request framing, as its docs say.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient } from "@modelcontextprotocol/ext-tasks/client";

const [url, token, contextId] = process.argv.slice(2);
const auth = { Authorization: `Bearer ${token}` };
const clientInfo = { name: "rlm-mcp-ext-tasks-test", version: "0" };
const PROTOCOL = "2026-07-28";

let nextId = 1;
async function rawDispatch(request, options = {}) {
  const params = request.params ?? {};
  const name = request.method === "tools/call" ? params.name : params.taskId;
  // One value per header whatever its case: the requester passes its own Mcp-Name too.
  const headers = new Headers(options.context?.headers ?? {});
  for (const [key, value] of Object.entries(auth)) headers.set(key, value);
  headers.set("content-type", "application/json");
  headers.set("accept", "application/json, text/event-stream");
  headers.set("mcp-protocol-version", PROTOCOL);
  headers.set("mcp-method", request.method);
  if (typeof name === "string") headers.set("mcp-name", name);
  const response = await fetch(url, {
    method: "POST",
    headers,
    body: JSON.stringify({ jsonrpc: "2.0", id: nextId++, ...request }),
    signal: options.signal,
  });
  const text = await response.text();
  const isStream = (response.headers.get("content-type") ?? "").includes("text/event-stream");
  const data = isStream ? text.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).pop() : text;
  const message = JSON.parse(data);
  return "error" in message ? { kind: "error", error: message.error } : { kind: "result", result: message.result };
}

const client = new Client(clientInfo, {
  capabilities: { extensions: { "io.modelcontextprotocol/tasks": {} } },
  versionNegotiation: { mode: { pin: PROTOCOL } },
});
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: auth } }));
const seen = { era: client.getProtocolEra() };
const session = createTaskSessionFromClient(client, {
  endpointId: "rlm-mcp-test",
  rawDispatch,
  v2RequestFraming: { protocolVersion: PROTOCOL, clientInfo, clientCapabilities: {} },
});
try {
  const done = await session.callTool("rlm_complete", { query: "OK-Q", context_id: contextId });
  seen.kind = done.kind;
  seen.taskId = done.handle?.taskId ?? null;
  const settled = await done.settle();
  seen.outcome = settled.outcome.status;
  seen.result = settled.outcome.status === "completed" ? settled.outcome.result : null;
  if (settled.outcome.status === "failed") seen.error = String(settled.outcome.error?.message ?? settled.outcome.error);
  seen.lastTask = settled.lastTask ? { status: settled.lastTask.status, retentionMs: settled.lastTask.retentionMs } : null;

  const slow = await session.callTool("rlm_complete", { query: "STUCK-Q", context_id: contextId });
  seen.slowKind = slow.kind;
  seen.slowTaskId = slow.handle?.taskId ?? null;
  await slow.cancel();
  seen.cancelled = (await slow.settle()).outcome.status;
} finally {
  await session.close();
  await client.close();
}
console.log(JSON.stringify(seen));
