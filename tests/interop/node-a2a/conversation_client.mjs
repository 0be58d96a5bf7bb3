// The official A2A JavaScript SDK (@a2a-js/sdk) in a conversation with a gateway agent, over
// JSON-RPC, HTTP+JSON and gRPC with mTLS. Reads one JSON config file (argv[2]):
// {https_url, server_id, ca, cert, key}; prints one JSON object with what each binding answered:
// a multi-turn conversation through input-required (chat.loop), a file part in and a text
// artifact out (doc.words), and a Message answer (chat.reply).
import crypto from 'node:crypto';
import fs from 'node:fs';
import { mtlsFactories } from './mtls_clients.mjs';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const factoryFor = mtlsFactories(config);
const STATE = { 1: 'SUBMITTED', 2: 'WORKING', 3: 'COMPLETED', 4: 'FAILED', 5: 'CANCELED', 6: 'INPUT_REQUIRED' };

// Every field given: the gRPC transport encodes the object as it is (no defaults filled in).
function message(parts, { capability = '', taskId = '', contextId = '' } = {}) {
  return {
    tenant: '',
    configuration: undefined,
    metadata: undefined,
    message: {
      messageId: crypto.randomUUID(),
      contextId,
      taskId,
      role: 1, // ROLE_USER
      parts: parts.map((part) => ({ metadata: undefined, filename: '', mediaType: '', ...part })),
      metadata: capability ? { 'a2agw.capability': capability } : undefined,
      extensions: [],
      referenceTaskIds: [],
    },
  };
}
const text = (value) => ({ content: { $case: 'text', value } });
const texts = (parts) => parts.filter((p) => p.content.$case === 'text').map((p) => p.content.value);

async function run(binding) {
  const client = await factoryFor(binding).createFromUrl(config.https_url);
  // A conversation: the task asks, the owner answers on the same task, it completes.
  const asked = await client.sendMessage(message([text('one')], { capability: 'chat.loop' }));
  const answered = await client.sendMessage(message([text('two')], { taskId: asked.id }));
  const done = await client.sendMessage(message([text('done')], { taskId: asked.id, contextId: asked.contextId }));
  // A file part in, a text artifact out.
  const file = {
    content: { $case: 'raw', value: Buffer.from('alpha beta gamma') },
    mediaType: 'text/plain',
    filename: 'notes.txt',
  };
  const counted = await client.sendMessage(message([file], { capability: 'doc.words' }));
  // A Message answer: no task.
  const reply = await client.sendMessage(message([text('js')], { capability: 'chat.reply' }));
  return {
    asked: [STATE[asked.status.state], texts(asked.status.message.parts)],
    answered: [answered.id === asked.id, STATE[answered.status.state], texts(answered.status.message.parts)],
    done: [done.id === asked.id, STATE[done.status.state], done.artifacts.map((a) => texts(a.parts))],
    history: done.history.length,
    counted: [STATE[counted.status.state], counted.artifacts.map((a) => texts(a.parts))],
    reply: { kind: reply.status ? 'task' : 'message', texts: texts(reply.parts ?? []), role: reply.role },
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
  // Exit only once the pipe has taken the line (process.exit can cut a pending write).
  await new Promise((resolve) => process.stdout.write(JSON.stringify(out) + '\n', resolve));
}

main().then(() => process.exit(0), (err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
  process.exit(1);
});
