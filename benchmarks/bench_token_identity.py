"""Server instructions per call with a bearer token (cached keys) against certificate-only.

Run ``python benchmarks/bench_token_identity.py`` (about 5 minutes on 2 cores).

One server process (``bench_invoke``'s, a real :class:`~gateway.runtime.agent.Agent`
with ``[identity.tokens]`` trusting one JWT-SVID issuer whose key is a JWKS
file) runs under ``valgrind --tool=callgrind``, and this process drives it
over mTLS, in the same run, with two kinds of ``a2agw.v1`` Invoke of
``text.echo``: ``cert`` (the client certificate alone) and ``token`` (the same
certificate and an ``authorization: Bearer`` JWT-SVID bound to it, the same
token on every call, as a caller reuses it until it expires). Phases are cut
by the server's own ``os.times()`` readings, as in
``bench_server_instructions.py``, whose launcher and drivers this reuses.

The figure the target is about is ``token / cert`` (at most 1.10: a token
check costs at most 10% more server CPU per call). The first call verifies
the signature (ES256) and caches the verified token, so the phases measure
what every later call costs: reading the header, the cache lookup, the
binding to the certificate, and the second admission path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_invoke
import jwt
from bench_instructions import annotate
from bench_invoke import (
    ALLOWED_CAPABILITY,
    ServerProcess,
    Target,
    drive,
    echo_payload,
    make_workspace,
)
from bench_server_instructions import SECONDS_UNDER_VALGRIND, valgrind_python
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from grpc import aio
from jwt.algorithms import ECAlgorithm

from gateway.config import AgentConfig
from gateway.transport.tls import channel_options
from gateway.wire.v1 import gateway_pb2

TARGETS = ("cert", "token")
TARGET_RATIO = 1.10


@dataclass
class TokenTarget(Target):
    """``Target`` whose calls carry ``authorization: Bearer <token>``."""

    token: str = ""

    async def call(self) -> float:
        """One Invoke with the bearer token; returns its latency in ms."""
        self.sent += 1
        request = gateway_pb2.InvokeRequest(
            request_id=f"bench-{self.name}-{self.sent}",
            capability=self.capability,
            payload=self.payload,
            deadline_unix_ms=int((time.time() + bench_invoke.CALL_TIMEOUT_SECONDS) * 1000),
        )
        started = time.perf_counter()
        metadata = (("authorization", f"Bearer {self.token}"),) if self.token else ()
        try:
            reply = await self.stub.Invoke(
                request, timeout=bench_invoke.CALL_TIMEOUT_SECONDS, metadata=metadata
            )
        except aio.AioRpcError as err:
            self.errors.append(f"{err.code().name}: {err.details()}")
            return (time.perf_counter() - started) * 1000.0
        if reply.payload != self.payload:
            self.errors.append("the echo did not return the payload")
        return (time.perf_counter() - started) * 1000.0


def with_tokens(
    config: AgentConfig, folder: Path
) -> tuple[AgentConfig, ec.EllipticCurvePrivateKey]:
    """``config`` trusting JWT-SVIDs of its trust domain, signed by a key minted here."""
    key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(ECAlgorithm.to_jwk(key.public_key())) | {"kid": "bench", "use": "jwt-svid"}
    bundle = folder / "jwt-bundle.json"
    bundle.write_text(json.dumps({"keys": [jwk]}))
    domain = config.id.split("/")[2]
    identity = {
        "tokens": {
            "issuers": [
                {"name": "spire", "kind": "jwt-svid", "trust_domain": domain, "jwks_file": bundle}
            ]
        }
    }
    return AgentConfig.model_validate({**config.model_dump(), "identity": identity}), key


def caller_token(key: ec.EllipticCurvePrivateKey, caller_pem: bytes, audience: str) -> str:
    """A JWT-SVID for the caller's own SPIFFE ID (bound to its certificate), valid 55 min."""
    cert = x509.load_pem_x509_certificate(caller_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    uri = san.get_values_for_type(x509.UniformResourceIdentifier)[0]
    now = int(time.time())
    claims = {"sub": uri, "aud": [audience], "iat": now, "exp": now + 55 * 60}
    return jwt.encode(claims, key, algorithm="ES256", headers={"kid": "bench"})


async def run_phases(
    targets: dict[str, Target],
    server: ServerProcess,
    modes: tuple[int, ...],
    calls: int,
    warmup: int,
) -> list[tuple[str, int, int, int]]:
    """(target, in flight, calls, callgrind part) of every measured phase, in order."""
    readings = 0
    measured = []
    for in_flight in modes:
        for name in TARGETS:
            target = targets[name]
            await drive(target, in_flight, warmup, SECONDS_UNDER_VALGRIND)
            server.cpu_seconds()
            readings += 1
            phase = await drive(target, in_flight, calls, SECONDS_UNDER_VALGRIND)
            server.cpu_seconds()
            readings += 1
            measured.append((name, in_flight, phase.calls, readings))
            if target.errors:
                raise RuntimeError(f"{name}: {target.errors[:3]}")
    return measured


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per phase (default 200)")
    parser.add_argument("--warmup", type=int, default=40, help="warm-up calls per phase")
    parser.add_argument("--in-flight", type=int, default=32, help="calls at once (default 32)")
    parser.add_argument("--payload-bytes", type=int, default=256, help="JSON payload size")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        print("valgrind (callgrind) is not installed: apt-get install valgrind", file=sys.stderr)
        return 2
    bench_invoke.CALL_TIMEOUT_SECONDS = SECONDS_UNDER_VALGRIND
    modes = (1, args.in_flight)
    with tempfile.TemporaryDirectory(prefix="bench-token-identity-") as tmp:
        folder = Path(tmp)
        out_file = folder / "callgrind.out"
        multiprocessing.get_context("spawn").set_executable(str(valgrind_python(folder, out_file)))
        ws = make_workspace(folder, args.payload_bytes)
        config, key = with_tokens(ws.config, folder)
        token = caller_token(key, ws.caller_tls.cert_pem, config.id)
        server = ServerProcess(config, None)
        try:
            ports = server.start(timeout=SECONDS_UNDER_VALGRIND)

            async def client() -> list[tuple[str, int, int, int]]:
                def channel() -> aio.Channel:
                    return aio.secure_channel(
                        f"127.0.0.1:{ports['gateway_port']}",
                        ws.caller_tls.channel_credentials(),
                        options=channel_options(config.id),
                    )

                payload = echo_payload(args.payload_bytes)
                targets: dict[str, Target] = {
                    "cert": TokenTarget("cert", channel(), ALLOWED_CAPABILITY, payload),
                    "token": TokenTarget(
                        "token", channel(), ALLOWED_CAPABILITY, payload, token=token
                    ),
                }
                try:
                    return await run_phases(targets, server, modes, args.calls, args.warmup)
                finally:
                    for target in targets.values():
                        await target.channel.close()

            measured = asyncio.run(client())
        finally:
            server.stop(timeout=SECONDS_UNDER_VALGRIND)
        per_call = {}
        for name, in_flight, calls, part in measured:
            total, _ = annotate(folder / f"callgrind.out.{part}")
            per_call[(name, in_flight)] = total / calls
    figures: dict[str, Any] = {"payload_bytes": args.payload_bytes, "modes": {}}
    for in_flight in modes:
        cert, tok = per_call[("cert", in_flight)], per_call[("token", in_flight)]
        figures["modes"]["sequential" if in_flight == 1 else f"conc{in_flight}"] = {
            "cert": round(cert),
            "token": round(tok),
            "token_minus_cert": round(tok - cert),
            "token_over_cert": round(tok / cert, 3),
        }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"Server instructions per call (callgrind), payload {args.payload_bytes} B\n")
        print(f"{'mode':<12}{'cert':>12}{'token':>12}{'token - cert':>14}{'token / cert':>14}")
        for mode, row in figures["modes"].items():
            print(
                f"{mode:<12}{row['cert']:>12,}{row['token']:>12,}"
                f"{row['token_minus_cert']:>14,}{row['token_over_cert']:>14.3f}"
            )
        print(f"\ntarget: token / cert <= {TARGET_RATIO}")
    worst = max(row["token_over_cert"] for row in figures["modes"].values())
    return 0 if worst <= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
