// The protocol-era scenario, run by the official TypeScript SDK client (@modelcontextprotocol/sdk
// 1.x, handshake era) on Node: `node ts_sdk_scenario.mjs NODE_MODULES stdio '<command JSON>' FOLDER`
// or `... NODE_MODULES http URL FOLDER`. NODE_MODULES is the folder of the pinned install
// (tests/fixtures_js.py). Prints one JSON line of what it saw; imports nothing of rlm-mcp.
import { createRequire } from "node:module";
import { join } from "node:path";

const [modules, transportKind, target, folder] = process.argv.slice(2);
const require = createRequire(join(modules, "resolve-from-here.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const LONG = { timeout: 300_000 }; // rlm_result waits up to 60 s: above the SDK's 60 s default

function transportFor() {
  if (transportKind === "stdio") {
    const spec = JSON.parse(target);
    return new StdioClientTransport({ command: spec.command, args: spec.args, env: spec.env, stderr: "inherit" });
  }
  return new StreamableHTTPClientTransport(new URL(target));
}

async function call(client, name, args, options = LONG) {
  const result = await client.callTool({ name, arguments: args }, undefined, options);
  if (result.isError) throw new Error(`${name} failed: ${JSON.stringify(result.content)}`);
  return result.structuredContent;
}

async function main() {
  const seen = {};
  const transport = transportFor();
  const setProtocolVersion = transport.setProtocolVersion?.bind(transport);
  transport.setProtocolVersion = (version) => {
    seen.protocol = version; // what the server answered to initialize
    setProtocolVersion?.(version);
  };
  const client = new Client({ name: "rlm-mcp-ts-sdk-test", version: "1.0.0" });
  await client.connect(transport);
  try {
    const loaded = await call(client, "rlm_load_context", { path: folder });
    const contextId = loaded.context_id;
    const progress = [];
    seen.complete = await call(client, "rlm_complete", { query: "Q-ok", context_id: contextId }, {
      ...LONG,
      onprogress: (p) => progress.push(p.message ?? ""),
    });
    seen.progress = progress.length;
    const started = await call(client, "rlm_start", { query: "Q-ok again", context_id: contextId });
    seen.status = (await call(client, "rlm_status", { run_id: started.run_id })).status;
    seen.result = await call(client, "rlm_result", { run_id: started.run_id, wait_s: 60 });
    const slow = await call(client, "rlm_start", { query: "Q-slow", context_id: contextId });
    await call(client, "rlm_cancel", { run_id: slow.run_id });
    seen.cancelled = await call(client, "rlm_result", { run_id: slow.run_id, wait_s: 60 });
    const resource = await client.readResource({ uri: `rlm://contexts/${contextId}` });
    seen.resource = JSON.parse(resource.contents[0].text);
  } finally {
    await client.close();
  }
  process.stdout.write(JSON.stringify(seen) + "\n");
}

main().catch((error) => {
  process.stderr.write(`${error?.stack ?? error}\n`);
  process.exit(1);
});
