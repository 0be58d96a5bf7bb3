// The @a2a-js/sdk client against an agent whose SVID carries only its SPIFFE ID: every binding
// pins the URI SAN (mtls_clients.mjs, pin_uri_only) and checks no host name. Reads one JSON
// config (argv[2]): {https_url, server_id, wrong_server_id, ca, cert, key}; prints, per binding,
// what one call answered as server_id, and what the same call did when pinned to wrong_server_id.
import crypto from 'node:crypto';
import fs from 'node:fs';
import { mtlsFactories } from './mtls_clients.mjs';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));

function message(text) {
  return {
    tenant: '',
    configuration: undefined,
    metadata: undefined,
    message: {
      messageId: crypto.randomUUID(),
      contextId: '',
      taskId: '',
      role: 1, // ROLE_USER
      parts: [{ content: { $case: 'data', value: { text } }, metadata: undefined, filename: '', mediaType: '' }],
      metadata: { 'a2agw.capability': 'text.echo' },
      extensions: [],
      referenceTaskIds: [],
    },
  };
}

async function call(serverId, binding) {
  const factoryFor = mtlsFactories({ ...config, server_id: serverId, pin_uri_only: true });
  try {
    const client = await factoryFor(binding).createFromUrl(config.https_url);
    const answer = await client.sendMessage(message(`over ${binding}`));
    const task = answer.task ?? answer;
    return { output: task.artifacts[0].parts[0].content.value };
  } catch (err) {
    return { error: String(err && err.cause ? err.cause.message : err.message) };
  }
}

const out = {};
for (const binding of ['JSONRPC', 'HTTP+JSON', 'GRPC']) {
  out[binding] = { right: await call(config.server_id, binding), wrong: await call(config.wrong_server_id, binding) };
}
await new Promise((resolve) => process.stdout.write(JSON.stringify(out) + '\n', resolve));
process.exit(0);
