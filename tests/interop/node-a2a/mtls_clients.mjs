// @a2a-js/sdk client factories with mutual TLS, shared by the scripts here. HTTPS presents our
// client certificate (or none: clientCert false); gRPC requires the server to hold the SVID of
// config.server_id (the DNS name made from it, and it as the one URI SAN).
import crypto from 'node:crypto';
import fs from 'node:fs';
import tls from 'node:tls';
import * as grpc from '@grpc/grpc-js';
import {
  ClientFactory,
  ClientFactoryOptions,
  DefaultAgentCardResolver,
  JsonRpcTransportFactory,
  RestTransportFactory,
} from '@a2a-js/sdk/client';
import { GrpcTransportFactory } from '@a2a-js/sdk/client/grpc';
import { Agent, fetch as undiciFetch } from 'undici';

export function svidName(spiffeId) {
  return 'id-' + crypto.createHash('sha256').update(spiffeId).digest('hex').slice(0, 32) + '.svid.a2agw.invalid';
}

// config: {server_id, ca, cert, key} (paths). Returns factoryFor(binding, clientCert = true).
export function mtlsFactories(config) {
  const [ca, cert, key] = [config.ca, config.cert, config.key].map((p) => fs.readFileSync(p));
  const fetchWith = (clientCert) => {
    const dispatcher = new Agent({ connect: clientCert ? { ca, cert, key } : { ca } });
    return (url, init) => undiciFetch(url, { ...init, dispatcher });
  };
  const grpcCredentials = grpc.credentials.createSsl(ca, key, cert, {
    checkServerIdentity: (_host, peer) => {
      const err = tls.checkServerIdentity(svidName(config.server_id), peer);
      if (err) return err;
      const uris = (peer.subjectaltname || '').split(', ').filter((s) => s.startsWith('URI:'));
      return uris.length === 1 && uris[0] === `URI:${config.server_id}` ? undefined : new Error('wrong server');
    },
  });
  return function factoryFor(binding, clientCert = true) {
    const fetchImpl = fetchWith(clientCert);
    return new ClientFactory(
      ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
        transports: [
          new JsonRpcTransportFactory({ fetchImpl }),
          new RestTransportFactory({ fetchImpl }),
          new GrpcTransportFactory({ grpcChannelCredentials: grpcCredentials }),
        ],
        preferredTransports: [binding],
        cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
      }),
    );
  };
}
