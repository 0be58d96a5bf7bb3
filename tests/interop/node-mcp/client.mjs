// The official MCP TypeScript SDK's client against an agent's MCP endpoint, over mTLS.
// Usage: node client.mjs CONFIG.json, where CONFIG is
//   {url, ca, cert?, key?, scenario, tool?, arguments?, wait_file?}
// (cert and key absent: no client certificate). Prints one JSON line: what happened.
//
// Scenarios: "list" (tools/list), "call" (tools/call), "progress" (a call with an
// onprogress handler: the progress messages seen), "cancel" (a call aborted once its
// first progress arrived, then a second call showing the session still works).
import fs from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Agent, fetch as undiciFetch } from 'undici';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const read = (path) => (path ? fs.readFileSync(path) : undefined);
const dispatcher = new Agent({
  connect: { ca: read(config.ca), cert: read(config.cert), key: read(config.key) },
});
const fetchImpl = (url, init) => undiciFetch(url, { ...init, dispatcher });

function errorOf(err) {
  return { error: { name: err.name, code: err.code, message: String(err.message), data: err.data } };
}

async function connected() {
  const client = new Client({ name: 'a2agw-interop', version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(config.url), { fetch: fetchImpl });
  await client.connect(transport);
  return client;
}

async function run() {
  let client;
  try {
    client = await connected();
  } catch (err) {
    return { connected: false, ...errorOf(err) };
  }
  const version = client.getServerVersion();
  const call = { name: config.tool, arguments: config.arguments ?? {} };
  try {
    switch (config.scenario) {
      case 'list': {
        const listed = await client.listTools();
        return { server: version, tools: listed.tools };
      }
      case 'call':
        return { result: await client.callTool(call) };
      case 'progress': {
        const seen = [];
        const result = await client.callTool(call, undefined, {
          onprogress: (progress) => seen.push(progress),
        });
        return { result, progress: seen };
      }
      case 'cancel': {
        const controller = new AbortController();
        let cancelled;
        try {
          await client.callTool(call, undefined, {
            signal: controller.signal,
            onprogress: () => controller.abort('enough'),
          });
          cancelled = false;
        } catch (err) {
          cancelled = err.name === 'AbortError' || String(err).includes('enough');
        }
        const after = await client.callTool({ name: 'text.echo', arguments: { text: 'after' } });
        return { cancelled, after };
      }
      default:
        return { error: { message: `unknown scenario ${config.scenario}` } };
    }
  } catch (err) {
    return errorOf(err);
  } finally {
    await client.close();
  }
}

const outcome = await run();
process.stdout.write(JSON.stringify(outcome) + '\n');
await dispatcher.close();
