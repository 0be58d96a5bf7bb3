// Push-notification configs as the official A2A JavaScript SDK (@a2a-js/sdk) sets them, over
// JSON-RPC, HTTP+JSON and gRPC with mTLS. Reads one JSON config file (argv[2]):
// {https_url, server_id, ca, cert, key, webhook}; per binding: a blocking text.echo whose
// SendMessage carries a webhook (?binding=NAME), then on that task: create a second config,
// get it, list both, delete it twice, get it again (an error). Prints one JSON object.
import crypto from 'node:crypto';
import fs from 'node:fs';
import { mtlsFactories } from './mtls_clients.mjs';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const factoryFor = mtlsFactories(config);

function webhook(id, binding) {
  return {
    tenant: '',
    id,
    taskId: '',
    url: `${config.webhook}?binding=${encodeURIComponent(binding)}`,
    token: `token-${id}`,
    authentication: { scheme: 'Bearer', credentials: `secret-${id}` },
  };
}

function echo(binding) {
  return {
    tenant: '',
    metadata: undefined,
    configuration: {
      acceptedOutputModes: [],
      taskPushNotificationConfig: webhook('on-send', binding),
      historyLength: undefined,
      returnImmediately: false,
    },
    message: {
      messageId: crypto.randomUUID(),
      contextId: '',
      taskId: '',
      role: 1, // ROLE_USER
      parts: [{ content: { $case: 'data', value: { text: binding } }, metadata: undefined, filename: '', mediaType: '' }],
      metadata: { 'a2agw.capability': 'text.echo' },
      extensions: [],
      referenceTaskIds: [],
    },
  };
}

const errorName = (err) => (err && (err.name || err.constructor?.name)) || String(err);

async function run(binding) {
  const client = await factoryFor(binding).createFromUrl(config.https_url);
  const answer = await client.sendMessage(echo(binding));
  const task = answer.task ?? answer;
  const made = await client.createTaskPushNotificationConfig({ ...webhook('later', binding), taskId: task.id });
  const got = await client.getTaskPushNotificationConfig({ tenant: '', taskId: task.id, id: 'later' });
  const listed = await client.listTaskPushNotificationConfig({ tenant: '', taskId: task.id, pageSize: 0, pageToken: '' });
  await client.deleteTaskPushNotificationConfig({ tenant: '', taskId: task.id, id: 'later' });
  await client.deleteTaskPushNotificationConfig({ tenant: '', taskId: task.id, id: 'later' });
  let gone = 'found';
  try {
    await client.getTaskPushNotificationConfig({ tenant: '', taskId: task.id, id: 'later' });
  } catch (err) {
    gone = errorName(err);
  }
  let refused = 'accepted';
  try {
    await client.createTaskPushNotificationConfig({ ...webhook('plain', binding), taskId: task.id, url: 'http://127.0.0.1/hook' });
  } catch (err) {
    refused = errorName(err);
  }
  return {
    transport: client.transport?.protocolName ?? binding,
    task: task.id,
    state: task.status.state,
    made: { id: made.id, taskId: made.taskId, url: made.url },
    got: { id: got.id, token: got.token, scheme: got.authentication?.scheme },
    listed: listed.configs.map((c) => c.id),
    gone,
    refused,
  };
}

const out = {};
for (const binding of ['JSONRPC', 'HTTP+JSON', 'GRPC']) {
  try {
    out[binding] = await run(binding);
  } catch (err) {
    out[binding] = { error: String(err && err.stack ? err.stack : err) };
  }
}
await new Promise((resolve) => process.stdout.write(JSON.stringify(out) + '\n', resolve));
process.exit(0);
