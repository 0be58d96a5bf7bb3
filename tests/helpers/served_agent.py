"""What the interop tests share: alice as ``serve`` runs her, and the Java clients' set-up.

Each client that is not ours runs in its own process against a real
``a2a-gateway serve`` with the A2A HTTP bindings on (an HTTPS certificate for
``localhost``), bob granted what the test names and carol one task of her own
(another peer's task, to be invisible to bob).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    load_pem_private_key,
    pkcs12,
)
from cryptography.x509 import load_pem_x509_certificate

from tests.helpers.a2a_http import carol_task, https_certificate
from tests.helpers.agent_process import AgentProcess, write_agent_toml
from tests.helpers.agents import Pki, audit_rows, grant, write_policy

TOOL_CACHE = Path(os.environ.get("A2AGW_INTEROP_GO_CACHE", "/var/cache/a2agw/interop-go"))
"""Where the Go client is built; the Java classpaths are kept beside it (as in .ci/run)."""
INTEROP = Path(__file__).parents[1] / "interop"
GO_DIR = INTEROP / "go"
"""The a2a-go 0.3 client project."""
JAVA_DIR = INTEROP / "java"
"""The A2A Java SDK 0.3 client project."""
JAVA1_DIR = INTEROP / "java1"
"""The A2A Java SDK 1.0 client project."""


def go_client() -> Path:
    """The built client, from the cache when its sources did not change (built if absent)."""
    if shutil.which("go") is None:
        pytest.skip("the Go toolchain is not installed (.ci/run builds the client)")
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((GO_DIR / name).read_bytes())
    binary = TOOL_CACHE / digest.hexdigest()[:16] / "a2a03client"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["go", "build", "-mod=readonly", "-o", str(binary), "."],
            cwd=GO_DIR,
            check=True,
            timeout=600,
        )
    return binary


class Served:
    """A running ``serve`` of alice, her audit log, and carol's task id."""

    def __init__(self, process: AgentProcess, audit_db: Path, carol_task: str) -> None:
        self.process = process
        self.audit_db = audit_db
        self.carol_task = carol_task

    def records(self) -> list[tuple[str, str, str, str]]:
        """(peer, capability, decision, reason) of every audit record committed so far."""
        return [(r.peer_id, r.capability, r.decision, r.reason) for r in audit_rows(self.audit_db)]

    def records_once_committed(self, expected: Counter[Any]) -> Counter[Any]:
        """The records, read again (for up to 10 s) until ``expected`` is committed:
        the agent commits allowed calls in batches."""
        deadline = time.monotonic() + 10.0
        while True:
            got = Counter(self.records())
            if got == expected or time.monotonic() > deadline:
                return got
            time.sleep(0.1)


def serve_alice(
    pki: Pki,
    tmp_path: Path,
    *,
    bob_may: Sequence[str],
    bob_cap: int,
    compat: bool | None,
    modules: Sequence[str] = ("capabilities.builtin",),
) -> Iterator[Served]:
    """alice serving gRPC and HTTPS (``[a2a] v0_3_compat`` as given, None: its default)."""
    policy = write_policy(
        tmp_path / "alice-policy.toml",
        [grant("bob", list(bob_may), max_payload_bytes=bob_cap), grant("carol", ["text.echo"])],
    )
    audit_db = tmp_path / "alice-audit.sqlite"
    config = write_agent_toml(
        tmp_path / "alice.toml",
        pki,
        "alice",
        listen="127.0.0.1:0",
        policy=policy,
        audit_db=audit_db,
        state_dir=tmp_path / "alice-state",
        modules=modules,
    )
    cert, key = https_certificate(pki, "alice", tmp_path / "https")
    text = config.read_text()
    text = text.replace(str(pki.dir / "alice.pem"), str(cert))
    text = text.replace(str(pki.dir / "alice.key"), str(key))
    text += '\n[a2a]\nhttp_listen = "localhost:0"\n'
    if compat is not None:
        text += f"v0_3_compat = {str(compat).lower()}\n"
    config.write_text(text)
    process = AgentProcess(config)
    try:
        process.start()
        yield Served(process, audit_db, carol_task(pki, process.https_url))
    finally:
        process.ensure_stopped()


def java_classpath(project: Path, cache_name: str) -> str:
    """The classpath Maven resolves from ``project``/pom.xml, kept under
    ``TOOL_CACHE.parent/cache_name/<hash of the pom>`` (resolved again when its jars are gone)."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("java/mvn not installed (.ci/run resolves the Java clients)")
    digest = hashlib.sha256((project / "pom.xml").read_bytes()).hexdigest()[:16]
    saved = TOOL_CACHE.parent / cache_name / digest / "classpath.txt"
    stale = saved.is_file() and not all(map(os.path.isfile, saved.read_text().strip().split(":")))
    if not saved.is_file() or stale:  # stale: the local Maven repository was emptied
        saved.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mvn", "-q", "-B", "dependency:build-classpath", f"-Dmdep.outputFile={saved}"],
            cwd=project,
            check=True,
            timeout=600,
        )
    return saved.read_text().strip()


def pkcs12_of(pki: Pki, name: str, path: Path, password: bytes) -> Path:
    """``name``'s key and certificate as a PKCS#12 file at ``path`` (what Java's TLS loads)."""
    key = load_pem_private_key((pki.dir / f"{name}.key").read_bytes(), None)
    assert isinstance(key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey))
    cert = load_pem_x509_certificate((pki.dir / f"{name}.pem").read_bytes())
    blob = pkcs12.serialize_key_and_certificates(
        name.encode(), key, cert, None, BestAvailableEncryption(password)
    )
    path.write_bytes(blob)
    return path
