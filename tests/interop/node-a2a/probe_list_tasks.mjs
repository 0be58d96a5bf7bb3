// A probe of ListTasks as the official A2A JavaScript SDK (@a2a-js/sdk) sees it, over
// JSON-RPC, HTTP+JSON and gRPC with mTLS. Reads one JSON config file (argv[2]):
// {https_url, server_id, ca, cert, key}; prints one JSON object, per binding: the ids of three
// tasks of one context of its own (A: job.watch started first and cancelled last, B and C:
// text.echo, completed in between) and the pages ListTasks answers for that context with
// pageSize 2 (ids, pageSize, totalSize, whether a next page token came).
import crypto from 'node:crypto';
import fs from 'node:fs';
import { mtlsFactories } from './mtls_clients.mjs';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const factoryFor = mtlsFactories(config);

// Every field given: the gRPC transport encodes the object as it is.
function message(capability, value, contextId, returnImmediately = false) {
  return {
    tenant: '',
    metadata: undefined,
    configuration: returnImmediately
      ? { acceptedOutputModes: [], taskPushNotificationConfig: undefined, historyLength: undefined, returnImmediately: true }
      : undefined,
    message: {
      messageId: crypto.randomUUID(),
      contextId,
      taskId: '',
      role: 1, // ROLE_USER
      parts: [{ content: { $case: 'data', value }, metadata: undefined, filename: '', mediaType: '' }],
      metadata: { 'a2agw.capability': capability },
      extensions: [],
      referenceTaskIds: [],
    },
  };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const taskOf = (answer) => answer.task ?? answer;

async function run(binding, contextId) {
  const client = await factoryFor(binding).createFromUrl(config.https_url);
  const a = taskOf(await client.sendMessage(message('job.watch', { tag: contextId }, contextId, true)));
  await sleep(50);
  const b = taskOf(await client.sendMessage(message('text.echo', { text: 'b' }, contextId)));
  await sleep(50);
  const c = taskOf(await client.sendMessage(message('text.echo', { text: 'c' }, contextId)));
  await sleep(50);
  const canceled = await client.cancelTask({ tenant: '', id: a.id, metadata: undefined });
  const pages = [];
  let pageToken = '';
  for (let n = 0; n < 5; n++) {
    const page = await client.listTasks({
      tenant: '',
      contextId,
      status: 0,
      pageSize: 2,
      pageToken,
      historyLength: undefined,
      statusTimestampAfter: undefined,
      includeArtifacts: false,
    });
    pages.push({
      ids: page.tasks.map((t) => t.id),
      pageSize: page.pageSize,
      totalSize: page.totalSize,
      more: Boolean(page.nextPageToken),
    });
    pageToken = page.nextPageToken;
    if (!pageToken) break;
  }
  return {
    transport: client.transport?.protocolName ?? binding,
    a: a.id,
    b: b.id,
    c: c.id,
    states: [canceled.status.state, b.status.state, c.status.state],
    pages,
  };
}

const out = {};
for (const [binding, contextId] of [['JSONRPC', 'probe-jsonrpc'], ['HTTP+JSON', 'probe-rest'], ['GRPC', 'probe-grpc']]) {
  try {
    out[binding] = await run(binding, contextId);
  } catch (err) {
    out[binding] = { error: String(err && err.stack ? err.stack : err) };
  }
}
await new Promise((resolve) => process.stdout.write(JSON.stringify(out) + '\n', resolve));
process.exit(0);
