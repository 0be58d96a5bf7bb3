// A client that is not ours: the official A2A JavaScript SDK (@a2a-js/sdk) calling an agent
// over JSON-RPC, HTTP+JSON and gRPC, with mTLS. Reads one JSON config file (argv[2]):
// {https_url, server_id, ca, cert, key, other_task, stuck_tasks}; prints one JSON object with what
// each binding answered: the card, a data and a text message, a stream followed to its terminal
// event, a long-running task polled until it completed, one cancelled, the refusals, and a
// subscription that fails after its first event (stuck_tasks[binding]: an error mid-stream).
import crypto from 'node:crypto';
import fs from 'node:fs';
import { AgentCard, verifyAgentCardSignature } from '@a2a-js/sdk';
import { BinaryReader } from '@bufbuild/protobuf/wire';
import { mtlsFactories } from './mtls_clients.mjs';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const ca = fs.readFileSync(config.ca);
const factoryFor = mtlsFactories(config);

// A card signed by the holder of server_id: the JWS must verify with the key of the
// certificate in its x5c header, and that certificate must chain to our CA and name server_id.
// The verifier canonicalizes the card's JSON form (what was signed), not the client's objects.
async function checkCard(received) {
  const card = AgentCard.toJSON(received);
  const signature = card.signatures[0];
  const header = JSON.parse(Buffer.from(signature.protected, 'base64url').toString('utf8'));
  const leaf = new crypto.X509Certificate(Buffer.from(header.x5c[0], 'base64'));
  if (!leaf.verify(new crypto.X509Certificate(ca).publicKey)) throw new Error('not issued by our CA');
  if (leaf.subjectAltName.split(', ').filter((s) => s.startsWith('URI:')).join() !== `URI:${config.server_id}`) {
    throw new Error('signed by another SPIFFE ID');
  }
  await verifyAgentCardSignature(async () => leaf.publicKey)(card);
  return 'verified';
}

// Every field given: the gRPC transport encodes the object as it is (no defaults filled in).
// returnImmediately: answer at once with the task unfinished (then poll it with GetTask).
function message(capability, content, { returnImmediately = false } = {}) {
  const configuration = returnImmediately
    ? {
        acceptedOutputModes: [],
        taskPushNotificationConfig: undefined,
        historyLength: undefined,
        returnImmediately: true,
      }
    : undefined;
  return {
    tenant: '',
    configuration,
    metadata: undefined,
    message: {
      messageId: crypto.randomUUID(),
      contextId: '',
      taskId: '',
      role: 1, // ROLE_USER
      parts: [{ content, metadata: undefined, filename: '', mediaType: '' }],
      metadata: { 'a2agw.capability': capability },
      extensions: [],
      referenceTaskIds: [],
    },
  };
}

// google.rpc.Status (grpc-status-details-bin) → [{domain, reason}] of its ErrorInfo details.
function errorInfos(bin) {
  const infos = [];
  const status = new BinaryReader(bin);
  while (status.pos < status.len) {
    const [field, wireType] = status.tag();
    if (field !== 3) { status.skip(wireType); continue; }
    const any = new BinaryReader(status.bytes());
    let typeUrl = '', value = new Uint8Array();
    while (any.pos < any.len) {
      const [f, w] = any.tag();
      if (f === 1) typeUrl = any.string(); else if (f === 2) value = any.bytes(); else any.skip(w);
    }
    if (!typeUrl.endsWith('google.rpc.ErrorInfo')) continue;
    const info = new BinaryReader(value);
    const found = { reason: '', domain: '' };
    while (info.pos < info.len) {
      const [f, w] = info.tag();
      if (f === 1) found.reason = info.string(); else if (f === 2) found.domain = info.string(); else info.skip(w);
    }
    infos.push(found);
  }
  return infos;
}

// Our reason code: JSON-RPC error.data, REST error details, gRPC status details (ErrorInfo
// of domain a2agw.v1); else the message's "REASON: " (which the HTTP bindings always start with).
function refusal(err) {
  let infos = err.data ?? err.details ?? err.errorResponse?.error?.data;
  if (!Array.isArray(infos) && err.statusDetailsBin) infos = errorInfos(err.statusDetailsBin);
  const ours = Array.isArray(infos) ? infos.find((d) => d && d.domain === 'a2agw.v1') : undefined;
  const named = /\b([A-Z][A-Z_]+): /.exec(String(err.message));
  return {
    name: err.name,
    message: String(err.message),
    reason: ours ? ours.reason : named ? named[1] : '',
  };
}

async function refused(promise) {
  try {
    await promise;
    return { name: 'none' };
  } catch (err) {
    return refusal(err);
  }
}

const STATE = { 1: 'SUBMITTED', 2: 'WORKING', 3: 'COMPLETED', 4: 'FAILED', 5: 'CANCELED', 7: 'REJECTED' };
const TERMINAL = new Set([3, 4, 5, 7]);
const data = (value) => ({ $case: 'data', value });
const text = (value) => ({ $case: 'text', value });
const taskOf = (answer) => answer.task ?? answer;
const outputOf = (task) => task.artifacts[task.artifacts.length - 1].parts[0].content.value;

// task:SUBMITTED, status:WORKING, artifact (whatever shape this SDK version gives an event).
function kindOf(event) {
  const payload = event.payload ?? event;
  const which = payload.$case ?? (payload.kind === 'status-update' ? 'statusUpdate' : payload.kind);
  const value = payload.value ?? payload;
  if (which === 'task') return `task:${STATE[value.status.state]}`;
  if (which === 'statusUpdate') return `status:${STATE[value.status.state]}`;
  if (which === 'artifactUpdate') return 'artifact';
  return String(which);
}

// GetTask until the task is in one of `until` (bounded: 20 s); the states it was seen in.
async function poll(client, id, until) {
  const seen = [];
  for (let n = 0; n < 200; n++) {
    const task = await client.getTask({ tenant: '', id, historyLength: undefined });
    const state = STATE[task.status.state];
    if (seen[seen.length - 1] !== state) seen.push(state);
    if (until.has(task.status.state)) return { task, seen };
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`task ${id} stayed ${seen[seen.length - 1]}`);
}

async function run(binding) {
  const client = await factoryFor(binding).createFromUrl(config.https_url);
  const card = await client.getAgentCard();
  const task = taskOf(await client.sendMessage(message('text.echo', data({ text: 'hello' }))));
  const texted = taskOf(await client.sendMessage(message('text.echo', text('hi there'))));
  const stream = [];
  for await (const event of client.sendMessageStream(message('text.echo', data({ text: 'streamed' })))) {
    stream.push(kindOf(event));
  }
  const started = taskOf(await client.sendMessage(message('job.pause', data({ tag: 'p' }), { returnImmediately: true })));
  const polled = await poll(client, started.id, TERMINAL);
  const tag = `js-${binding}-watch`;
  const watched = taskOf(await client.sendMessage(message('job.watch', data({ tag }), { returnImmediately: true })));
  await poll(client, watched.id, new Set([2]));
  const canceled = await client.cancelTask({ tenant: '', id: watched.id, metadata: undefined });
  const subscribed = { kinds: [] };
  try {
    for await (const event of client.resubscribeTask({ tenant: '', id: config.stuck_tasks[binding] })) {
      subscribed.kinds.push(kindOf(event));
    }
    subscribed.error = { name: 'none' };
  } catch (err) {
    subscribed.error = refusal(err);
  }
  return {
    transport: client.transport?.protocolName ?? binding,
    skills: card.skills.map((s) => s.id).sort(),
    card_signature: await checkCard(card).catch((err) => String(err)),
    state: task.status.state,
    output: outputOf(task),
    text: [STATE[texted.status.state], outputOf(texted)],
    stream,
    polled: { answered: STATE[started.status.state], seen: polled.seen, output: outputOf(polled.task) },
    cancelled: { id: watched.id, tag, state: STATE[canceled.status.state] },
    text_part: await refused(client.sendMessage(message('text.search', text('hello')))),
    not_granted: await refused(client.sendMessage(message('kv.get', data({ key: 'a' })))),
    other_task: await refused(client.getTask({ tenant: '', id: config.other_task, historyLength: undefined })),
    subscribed,
  };
}

async function main() {
  const out = {};
  for (const binding of ['JSONRPC', 'HTTP+JSON', 'GRPC']) {
    try {
      out[binding] = await run(binding);
    } catch (err) {
      out[binding] = { error: String(err && err.stack ? err.stack : err) };
    }
  }
  // Without a client certificate: the public card, then UNAUTHENTICATED.
  try {
    const anonymous = await factoryFor('JSONRPC', false).createFromUrl(config.https_url);
    out.no_certificate = await refused(
      anonymous.sendMessage(message('text.echo', { $case: 'data', value: { text: 'hi' } })),
    );
  } catch (err) {
    out.no_certificate = { error: String(err) };
  }
  // Exit only once the pipe has taken the line (process.exit can cut a pending write).
  await new Promise((resolve) => process.stdout.write(JSON.stringify(out) + '\n', resolve));
}

main().then(() => process.exit(0), (err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
  process.exit(1);
});
