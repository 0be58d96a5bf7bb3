// A webhook receiver's check of an A2A Peer Gateway push notification, with node:crypto alone
// (docs/a2a-push.md shows the same function). argv: a JSON file of
// {ca, agent, notifications: [{url, body_b64, signature}]}; prints [{ok, error?, jti?}].
import crypto from 'node:crypto';
import fs from 'node:fs';

const HASHES = { ES256: 'sha256', ES384: 'sha384', ES512: 'sha512', RS256: 'sha256' };

// body: the request body (a Buffer, as received); signature: the X-A2A-Notification-Signature
// header; caPem: the agent's trust domain CA; agentId: its SPIFFE ID; url: the webhook URL.
export function verifyNotification(body, signature, caPem, agentId, url) {
  const [protectedPart, payload, sig] = signature.split('.');
  const header = JSON.parse(Buffer.from(protectedPart, 'base64url'));
  if (payload !== '' || header.b64 !== false || !header.crit?.includes('b64')) throw new Error('not a detached unencoded JWS');
  const hash = HASHES[header.alg];
  if (!hash) throw new Error(`algorithm ${header.alg}`);
  const chain = header.x5c.map((der) => new crypto.X509Certificate(Buffer.from(der, 'base64')));
  const issuers = [...chain.slice(1), new crypto.X509Certificate(caPem)];
  const now = Date.now();
  chain.forEach((cert, i) => {
    const valid = Date.parse(cert.validFrom) <= now && now <= Date.parse(cert.validTo);
    if (!valid || !cert.checkIssued(issuers[i]) || !cert.verify(issuers[i].publicKey)) throw new Error('chain');
  });
  const uris = (chain[0].subjectAltName ?? '').split(', ').filter((name) => name.startsWith('URI:'));
  if (uris.length !== 1 || uris[0] !== `URI:${agentId}`) throw new Error('not the agent');
  const input = Buffer.concat([Buffer.from(`${protectedPart}.`), body]);
  const key = { key: chain[0].publicKey, dsaEncoding: 'ieee-p1363' };
  if (!crypto.verify(hash, input, key, Buffer.from(sig, 'base64url'))) throw new Error('signature');
  if (header.aud !== url) throw new Error('meant for another webhook');
  return header;
}

if (process.argv[2]) {
  const input = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const ca = fs.readFileSync(input.ca);
  const out = input.notifications.map(({ url, body_b64: body, signature }) => {
    try {
      return { ok: true, jti: verifyNotification(Buffer.from(body, 'base64'), signature, ca, input.agent, url).jti };
    } catch (err) {
      return { ok: false, error: String(err.message ?? err) };
    }
  });
  process.stdout.write(JSON.stringify(out) + '\n');
}
