// @a2a-js/sdk client factories with mutual TLS, shared by the scripts here. HTTPS presents our
// client certificate (or none: clientCert false); gRPC requires the server to hold the SVID of
// config.server_id (the DNS name made from it, and it as the one URI SAN). With
// config.pin_uri_only both check only the URI SAN, no host name: the server's SVID may carry
// nothing else (a SPIRE registration without -dns).
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
// Node has verified the chain to the CA; the one URI SAN must be the SPIFFE ID we want.
export function pinnedUri(want) {
  return (_host, peer) => {
    const uris = (peer.subjectaltname || '').split(', ').filter((s) => s.startsWith('URI:'));
    return uris.length === 1 && uris[0] === `URI:${want}` ? undefined : new Error(`server is not ${want}`);
  };
}

export function mtlsFactories(config) {
  const [ca, cert, key] = [config.ca, config.cert, config.key].map((p) => fs.readFileSync(p));
  const pinned = config.pin_uri_only ? { checkServerIdentity: pinnedUri(config.server_id) } : {};
  const fetchWith = (clientCert) => {
    const connect = clientCert ? { ca, cert, key, ...pinned } : { ca, ...pinned };
    const dispatcher = new Agent({ connect });
    return (url, init) => undiciFetch(url, { ...init, dispatcher });
  };
  const grpcCredentials = grpc.credentials.createSsl(ca, key, cert, {
    checkServerIdentity: (host, peer) => {
      if (config.pin_uri_only) return pinnedUri(config.server_id)(host, peer);
      const err = tls.checkServerIdentity(svidName(config.server_id), peer);
      if (err) return err;
      return pinnedUri(config.server_id)(host, peer);
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
