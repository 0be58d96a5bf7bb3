"""Every literal block in the docstrings of ``gateway/``, ``capabilities/`` and ``policies/`` is checked.

A docstring block introduced by ``::`` is either an example (TOML, JSON, Python) or a listing
of names the code also holds (the error tree, the decision order, problem kinds).
Each block is run or validated here against the code it describes.
Examples are parsed into the model they illustrate, Python is run, and listings are compared
with the tuple, enum or table they mirror.
A ``>>>`` example runs as a doctest.
A new block with no check fails :func:`test_every_block_has_a_check`, naming the module.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import json
import re
import textwrap
import tomllib
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "capabilities", "policies")
GENERATED = ROOT / "gateway" / "wire"


@dataclass(frozen=True)
class Block:
    """One ``::`` block: the module, the object whose docstring holds it, its place, its text."""

    module: str
    owner: str
    index: int
    text: str

    @property
    def key(self) -> tuple[str, str, int]:
        """What a check is registered under."""
        return (self.module, self.owner, self.index)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _documented(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) of the module and of every class and function in it."""
    module_doc = ast.get_docstring(tree)
    if module_doc:
        yield "", module_doc

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                doc = ast.get_docstring(child)
                if doc:
                    yield name, doc
                yield from visit(child, f"{name}.")

    yield from visit(tree, "")


def literal_blocks(doc: str) -> list[str]:
    """The dedented text of each block a line ending in ``::`` introduces."""
    lines = doc.splitlines()
    blocks = []
    for number, line in enumerate(lines):
        if not line.rstrip().endswith("::"):
            continue
        indent = len(line) - len(line.lstrip())
        body: list[str] = []
        for following in lines[number + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            body.append(following)
        text = textwrap.dedent("\n".join(body)).strip("\n")
        if text:
            blocks.append(text + "\n")
    return blocks


def all_blocks() -> list[Block]:
    """Every ``::`` block of every docstring of ours (generated code left out)."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(GENERATED) or "_compiled" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for owner, doc in _documented(tree):
                for index, text in enumerate(literal_blocks(doc)):
                    found.append(Block(_module_name(path), owner, index, text))
    return found


def doctest_modules() -> list[str]:
    """Modules of ours whose docstrings hold a ``>>>`` example."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(GENERATED):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if any(">>>" in doc for _, doc in _documented(tree)):
                found.append(_module_name(path))
    return found


# --- the checks, one per block ------------------------------------------------


def _agent_config(text: str) -> None:
    from gateway.config import AgentConfig

    config = AgentConfig.model_validate(tomllib.loads(text))
    assert config.a2a.http_listen == "127.0.0.1:7443"
    assert config.upstreams[0].skills[0].capability == "legacy.echo"
    assert config.console is not None


def _plan(text: str) -> None:
    from gateway.plans.document.model import parse_plan

    plan = parse_plan(text, "docstring")
    assert [step.id for step in plan.steps] == ["search", "store"]
    assert plan.step("store").depends_on == ("search",)


def _capability_decorator(text: str) -> None:
    from capabilities import CallContext, Capability, ContractModel

    class EchoIn(ContractModel):
        text: str

    class EchoOut(ContractModel):
        text: str

    scope: dict[str, Any] = {"EchoIn": EchoIn, "EchoOut": EchoOut, "CallContext": CallContext}
    exec("from capabilities import capability\n" + text, scope)
    assert isinstance(scope["echo"], Capability)
    assert scope["echo"].contract.key == "text.echo@1.0.0"


def _observe_counter(text: str) -> None:
    from gateway.config import MetricsSettings
    from gateway.telemetry.metrics import AgentMetrics

    metrics = AgentMetrics("spiffe://example.org/agent/a", MetricsSettings(listen="127.0.0.1:0"))
    store = SimpleNamespace(reloads_ok=3)
    exec(text, {"metrics": metrics, "store": store})
    assert 'a2agw_policy_reloads_total{result="ok"} 3' in metrics.prometheus_text()
    metrics.shutdown()


def _checkpoint_line(text: str) -> None:
    from gateway.audit.checkpoint import CheckpointSigner
    from gateway.devtools.pki import CertificateAuthority

    agent = "spiffe://example.org/agent/a"
    ca = CertificateAuthority.create("example.org")
    cert_pem, key_pem = ca.issue_svid(agent)
    line = CheckpointSigner(agent, key_pem, cert_pem).sign(1000, "ab" * 32, 1).to_line()
    assert set(json.loads(text)) == set(json.loads(line))


def _error_tree(text: str) -> None:
    import grpc

    from gateway import errors
    from gateway.transport.status import status_code_for

    parents: list[type[errors.GatewayError]] = []
    for line in text.splitlines():
        name_at = re.search(r"[A-Za-z]", line)
        assert name_at is not None, line
        depth = name_at.start() // 4
        name, *rest = line[name_at.start() :].split("(")[0].split()
        cls = getattr(errors, name)
        parents[depth:] = [cls]
        if depth:
            assert cls.__bases__[0] is parents[depth - 1], name
        instance = cls("x")
        codes = [word for word in rest if word.isupper()]
        if len(codes) == 2:
            status, reason = codes
            assert status_code_for(instance) is grpc.StatusCode[status], name
            assert cls.reason == reason, name
        elif status_code_for(instance).name != codes[0]:  # one code: the status, or the reason
            assert cls.reason == codes[0], name


def _decision_order(text: str) -> None:
    from gateway.inbound.pipeline import CALL_CHECKS

    named = re.findall(r"^([a-z_]+)\s", text, re.M)
    assert named == [check.name for check in CALL_CHECKS]


def _problem_kinds(text: str) -> None:
    from gateway.audit.verify import ProblemKind

    named = re.findall(r"^([a-z_]+)\s", text, re.M)
    assert set(named) <= set(typing.get_args(ProblemKind)) and named


def _task_states(text: str) -> None:
    from gateway.plans.task import PlanTaskState

    words = set(re.findall(r"[a-z-]+", text))
    assert {state.value for state in PlanTaskState} <= words


def _schema_subset(text: str) -> None:
    from capabilities import schema_models

    listed = set(re.findall(r"[A-Za-z]+", re.sub(r"\(.*?\)", "", text)))
    keywords = set().union(*schema_models._ALLOWED.values())
    assert listed == keywords | set(schema_models._ALLOWED)


def _chain_formula(text: str) -> None:
    import hashlib

    from gateway.audit.chain import canonical_bytes, record_hash
    from gateway.audit.record import AuditRecord

    assert "sha256(prev_hash_hex || 0x0a || canonical_bytes(record))" in text
    record = AuditRecord(
        seq=1,
        time_unix_ms=1,
        peer_id="spiffe://example.org/agent/b",
        capability="text.echo",
        version_constraint="",
        served_version="1.0.0",
        decision="allow",
        reason="OK",
        payload_sha256="",
        payload_size=0,
        latency_ms=0.0,
        request_id="r",
    )
    prev = "0" * 64
    expected = hashlib.sha256(prev.encode() + b"\n" + canonical_bytes(record)).hexdigest()
    assert record_hash(prev, record) == expected


def _http_routes(text: str) -> None:
    from gateway.server.a2a_http import JSONRPC_PATH, REST_PATH

    paths = re.findall(r"^\S+\s+(/\S+)", text, re.M)
    assert paths == ["/.well-known/agent-card.json", JSONRPC_PATH, REST_PATH + "/..."]


def _card_extension(text: str) -> None:
    listed = set(re.findall(r"\b([a-z_]+)\b", text))
    source = (ROOT / "gateway/server/a2a/card.py").read_text(encoding="utf-8")
    keys = set(re.findall(r'"([a-z_]+)":', source))
    for key in ("max_payload_bytes", "grant_expires_at", "capabilities", "versions"):
        assert key in listed and key in keys, key


def _identity_tokens(text: str) -> None:
    from gateway.config.identity import IdentitySettings

    settings = IdentitySettings.model_validate(tomllib.loads(text)["identity"])
    assert settings.tokens is not None
    assert [issuer.kind for issuer in settings.tokens.issuers] == ["jwt-svid", "oidc"]


def _named_reasons(text: str) -> list[str]:
    from gateway.errors import all_error_classes

    known = {cls.reason for cls in all_error_classes()}
    named = re.findall(r"\b(?:TOKEN|USER|UNAUTH)[A-Z_]+\b", text)
    assert named and set(named) <= known, sorted(set(named) - known)
    return named


def _token_callers(text: str) -> None:
    cases = [line.split("  ")[0] for line in text.splitlines() if line and not line[0].isspace()]
    assert cases == [
        "certificate, no token",
        "certificate and token",
        "token, no certificate",
        "neither",
    ]
    _named_reasons(text)


def _token_checks(text: str) -> None:
    named = _named_reasons(text)
    assert named[0] == "TOKEN_INVALID" and "TOKEN_REPLAYED" in named


def _reply_forms(text: str) -> None:
    from capabilities.parts import (
        Artifact,
        DataPart,
        FilePart,
        MessageReply,
        TaskReply,
        TextPart,
        UrlPart,
    )
    from capabilities.replies import reply_json

    parts = (TextPart("t"), DataPart({}), FilePart(b"x", "text/csv", "out.csv"), UrlPart("u"))
    task = reply_json(TaskReply(artifacts=(Artifact(parts, name="report"),), text="done"))
    message = reply_json(MessageReply((TextPart("m"),)))

    def keys(value: Any) -> set[str]:
        if isinstance(value, dict):
            return set(value).union(*(keys(v) for v in value.values()))
        if isinstance(value, list):
            return set().union(*(keys(v) for v in value))
        return set()

    assert set(re.findall(r'"([a-z0-9_.]+)":', text)) == keys(task) | keys(message)
    for part in task["artifacts"][0]["parts"]:
        assert f'"kind": "{part["kind"]}"' in text


CHECKS: dict[tuple[str, str, int], Callable[[str], None]] = {
    ("gateway.config.agent", "", 0): _agent_config,
    ("gateway.plans.document.model", "", 0): _plan,
    ("capabilities.registry", "capability", 0): _capability_decorator,
    ("gateway.telemetry.metrics", "", 0): _observe_counter,
    ("gateway.audit.checkpoint", "", 0): _checkpoint_line,
    ("gateway.errors", "", 0): _error_tree,
    ("gateway.inbound.pipeline", "", 0): _decision_order,
    ("gateway.audit.verify", "", 0): _problem_kinds,
    ("gateway.audit.checkpoint_verify", "", 0): _problem_kinds,
    ("gateway.plans.task", "", 0): _task_states,
    ("capabilities.schema_models", "", 0): _schema_subset,
    ("gateway.audit.chain", "", 0): _chain_formula,
    ("gateway.server.a2a_http.edge", "", 0): _http_routes,
    ("gateway.server.a2a.card", "", 0): _card_extension,
    ("gateway.config.identity", "", 0): _identity_tokens,
    ("gateway.identity.callers", "", 0): _token_callers,
    ("gateway.identity.verifier", "", 0): _token_checks,
    ("capabilities.replies", "", 0): _reply_forms,
}
"""(module, object, n-th block of its docstring) -> the check of that block."""

BLOCKS = all_blocks()


def test_every_block_has_a_check() -> None:
    unchecked = [block.key for block in BLOCKS if block.key not in CHECKS]
    stale = sorted(set(CHECKS) - {block.key for block in BLOCKS})
    assert unchecked == []
    assert stale == []


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.key in CHECKS], ids=lambda b: f"{b.module}:{b.owner}"
)
def test_block_matches_the_code(block: Block) -> None:
    CHECKS[block.key](block.text)


def test_doctest_examples_run() -> None:
    failed = []
    for name in doctest_modules():
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        if result.failed:
            failed.append(name)
    assert failed == []


def test_blocks_are_read_as_written() -> None:
    doc = "Intro::\n\n    a = 1\n      b\n\nAfter.\n\nList::\n\n    x\n"
    assert literal_blocks(doc) == ["a = 1\n  b\n", "x\n"]
