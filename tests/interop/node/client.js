// A client that is not ours: Node's gRPC stack (@grpc/grpc-js) calling an agent over mTLS,
// the way docs/other-languages.md tells a non-Python client to. Reads one JSON
// config file (argv[2]), prints one JSON object with what each call answered.
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const tls = require('node:tls');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));

// google.rpc.Status / ErrorInfo, just the fields needed to read a refusal's reason code.
const rpc = protobuf.Root.fromJSON({
  nested: {
    google: {
      nested: {
        protobuf: { nested: { Any: { fields: { type_url: { type: 'string', id: 1 }, value: { type: 'bytes', id: 2 } } } } },
        rpc: {
          nested: {
            Status: {
              fields: {
                code: { type: 'int32', id: 1 },
                message: { type: 'string', id: 2 },
                details: { rule: 'repeated', type: 'google.protobuf.Any', id: 3 },
              },
            },
            ErrorInfo: { fields: { reason: { type: 'string', id: 1 }, domain: { type: 'string', id: 2 } } },
          },
        },
      },
    },
  },
});
const Status = rpc.lookupType('google.rpc.Status');
const ErrorInfo = rpc.lookupType('google.rpc.ErrorInfo');

function svidName(spiffeId) {
  return 'id-' + crypto.createHash('sha256').update(spiffeId).digest('hex').slice(0, 32) + '.svid.a2agw.invalid';
}

// The server's one URI SAN must be the SPIFFE ID we want (Node has verified the chain to the CA).
function uriIs(cert, want) {
  const uris = (cert.subjectaltname || '').split(', ').filter((s) => s.startsWith('URI:'));
  return uris.length === 1 && uris[0] === `URI:${want}`;
}

// config.pin_uri_only: the server's SVID may carry only its SPIFFE ID, so no host name is
// checked at all, only the URI SAN; otherwise the derived name too.
function credentialsFor(want) {
  return grpc.credentials.createSsl(
    fs.readFileSync(config.ca), fs.readFileSync(config.key), fs.readFileSync(config.cert),
    {
      checkServerIdentity: (host, cert) => {
        const err = config.pin_uri_only ? undefined : tls.checkServerIdentity(host, cert);
        if (err) return err;
        return uriIs(cert, want) ? undefined : new Error(`server is not ${want}`);
      },
    },
  );
}

function load(descriptorSetPath) {
  const definition = protoLoader.loadFileDescriptorSetFromBuffer(fs.readFileSync(descriptorSetPath), {
    keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  });
  return grpc.loadPackageDefinition(definition);
}

function client(Service, want) {
  const named = config.pin_uri_only
    ? {}
    : { 'grpc.ssl_target_name_override': svidName(want), 'grpc.default_authority': svidName(want) };
  return new Service(config.address, credentialsFor(want), named);
}

function reasons(err) {
  const raw = err.metadata && err.metadata.get('grpc-status-details-bin');
  if (!raw || raw.length === 0) return [];
  const status = Status.decode(raw[0]);
  return status.details
    .filter((any) => any.type_url.endsWith('/google.rpc.ErrorInfo'))
    .map((any) => ErrorInfo.decode(any.value))
    .map((info) => ({ domain: info.domain, reason: info.reason }));
}

function unary(stub, method, request, metadata) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + 10000);
    stub[method](request, metadata || new grpc.Metadata(), { deadline }, (err, response) => {
      if (err) resolve({ ok: false, code: grpc.status[err.code], reasons: reasons(err), details: err.details });
      else resolve({ ok: true, response });
    });
  });
}

function value(json) {
  if (typeof json === 'string') return { string_value: json };
  if (typeof json === 'number') return { number_value: json };
  if (typeof json === 'boolean') return { bool_value: json };
  return { struct_value: struct(json) };
}

// Loaded from a FileDescriptorSet, protobufjs sees a map field as what the descriptor says it
// is on the wire: repeated {key, value} entries.
function struct(object) {
  return { fields: Object.entries(object).map(([key, v]) => ({ key, value: value(v) })) };
}

function plain(v) {
  if (v.kind === 'struct_value') {
    return Object.fromEntries(v.struct_value.fields.map(({ key, value: x }) => [key, plain(x)]));
  }
  return v[v.kind];
}

async function main() {
  const out = {};
  const { PeerGateway } = load(config.gateway_descriptor_set).a2agw.v1;
  const gateway = client(PeerGateway, config.server_id);

  const described = await unary(gateway, 'Describe', {});
  out.describe = described.ok ? described.response.capabilities.map((c) => c.name).sort() : described;

  const echo = await unary(gateway, 'Invoke', {
    request_id: crypto.randomUUID(), capability: 'text.echo', payload: Buffer.from('{"text":"from node"}'),
  });
  out.invoke = echo.ok ? { served_version: echo.response.served_version, payload: echo.response.payload.toString() } : echo;

  const refused = await unary(gateway, 'Invoke', {
    request_id: crypto.randomUUID(), capability: config.refused_capability, payload: Buffer.from('{}'),
  });
  out.refused = refused;

  const impostor = client(PeerGateway, config.wrong_server_id);
  const wrong = await unary(impostor, 'Describe', {});
  out.wrong_identity = wrong.ok ? 'served' : wrong.code;

  const { A2AService } = load(config.a2a_descriptor_set).lf.a2a.v1;
  const a2a = client(A2AService, config.server_id);
  const v1 = new grpc.Metadata();
  v1.set('a2a-version', '1.0');
  const sent = await unary(a2a, 'SendMessage', {
    message: {
      message_id: crypto.randomUUID(),
      role: 'ROLE_USER',
      metadata: struct({ 'a2agw.capability': 'text.echo' }),
      parts: [{ data: value({ text: 'a2a from node' }) }],
    },
  }, v1);
  out.send_message = sent.ok
    ? { state: sent.response.task.status.state, output: plain(sent.response.task.artifacts[0].parts[0].data) }
    : sent;

  const card = await unary(a2a, 'GetExtendedAgentCard', {}, v1);
  out.card_skills = card.ok ? card.response.skills.map((s) => s.id).sort() : card;

  process.stdout.write(JSON.stringify(out) + '\n');
  for (const stub of [gateway, impostor, a2a]) stub.close();
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack) + '\n');
  process.exit(1);
});
