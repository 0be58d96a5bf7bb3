"""The compiled hot path and the pure Python answer alike, and each verifies the other's logs.

Each path runs in its own interpreter (the choice is made once, at import of
``gateway``): ``A2AGW_PURE_PYTHON=1`` for the Python, nothing for the compiled
build of ``scripts/build_hotpath.py``. The comparisons are skipped, saying
so, where that build is absent; CI builds it first (``.ci/run``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

import pytest

from gateway import hotpath
from tests.support import Pki, agent_config, grant, started, write_policy
from tests.unit.hotpath_probe import VALID

REPO = Path(__file__).resolve().parents[2]


def probe(pure: bool, *args: str) -> dict[str, Any]:
    """Run ``tests/unit/hotpath_probe.py`` on one path; its JSON answer."""
    env = {k: v for k, v in os.environ.items() if k != hotpath.PURE_PYTHON_ENV}
    if pure:
        env[hotpath.PURE_PYTHON_ENV] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.hotpath_probe", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.fixture(scope="module")
def pure() -> dict[str, Any]:
    return probe(True, "results")


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    answer = probe(False, "results")
    if not answer["compiled"]:
        pytest.skip(f"no compiled hot path here ({answer['active']})")
    return answer


def test_the_env_var_forces_pure_python(pure: dict[str, Any]) -> None:
    assert pure["compiled"] is False
    assert pure["active"] == "pure Python (A2AGW_PURE_PYTHON=1)"
    assert all(file.endswith(".py") for file in pure["files"].values())


def test_the_compiled_build_is_what_gateway_imports(compiled: dict[str, Any]) -> None:
    assert compiled["active"] == "compiled (mypyc): " + ", ".join(hotpath.COMPILED_MODULES)
    assert sorted(compiled["files"]) == sorted(hotpath.COMPILED_MODULES)
    for module, file in compiled["files"].items():
        assert Path(file).parent == hotpath.COMPILED_DIR.joinpath(*module.split(".")[:-1])
        assert file.endswith(".so")


def test_both_paths_give_the_same_bytes_hashes_rows_and_errors(
    pure: dict[str, Any], compiled: dict[str, Any]
) -> None:
    assert len(compiled["cases"]) == len(pure["cases"])
    for n, (ours, theirs) in enumerate(zip(compiled["cases"], pure["cases"], strict=True)):
        assert ours == theirs, f"case {n}"
    # The odd values are refused or kept exactly as Python does: a bool is not a size.
    assert pure["cases"][len(VALID) + 3]["checked"]["error"] == "TypeError"


def test_a_log_written_by_either_path_verifies_under_both(
    compiled: dict[str, Any], tmp_path: Path
) -> None:
    logs = {"compiled": tmp_path / "compiled.sqlite", "pure": tmp_path / "pure.sqlite"}
    for writer, db in logs.items():
        assert probe(writer == "pure", "write", str(db))["active"].startswith(
            "pure" if writer == "pure" else "compiled"
        )
    verdicts = {
        (writer, reader): probe(reader == "pure", "verify", str(db))
        for writer, db in logs.items()
        for reader in ("compiled", "pure")
    }
    for verdict in verdicts.values():
        assert verdict["ok"] is True
        assert verdict["records"] == len(VALID)
    # The same records chain to the very same hashes whichever path wrote them.
    assert verdicts[("compiled", "pure")]["hashes"] == verdicts[("pure", "pure")]["hashes"]


def test_both_paths_decide_run_and_audit_calls_alike(tmp_path: Path) -> None:
    # The handler, the pipeline and the servicer are compiled too: a real
    # agent, given the same calls on each path, must answer, record and run alike.
    pure_calls = probe(True, "calls", str(tmp_path))
    reasons = [answer[1] if len(answer) == 4 else "OK" for answer in pure_calls["answers"]]
    assert reasons == [
        "OK",
        "REPLAYED_REQUEST",
        "CAPABILITY_NOT_GRANTED",
        "CAPABILITY_NOT_GRANTED",
        "VERSION_NOT_AVAILABLE",
        "INVALID_REQUEST",
        "INVALID_INPUT",
        "INVALID_INPUT",
        "INVALID_REQUEST",
        "INVALID_REQUEST",
        "UNAUTHENTICATED",
        "DEADLINE_EXCEEDED",
        "OK",
        "OK",
        "IDEMPOTENCY_CONFLICT",
        "OK",
        "CAPABILITY_TIMEOUT",
    ]
    assert pure_calls["answers"][13][2] is True  # the idempotent replay
    assert pure_calls["writes"] == 3  # the replay and the conflict ran nothing (one over gRPC)
    # One record per call, plus the write-ahead ADMITTED of each admitted write.
    # Over gRPC: the servicer (compiled too) turns the same outcomes into the
    # same statuses; the corrupt message and Describe go through it as well.
    grpc_codes = [answer[0] if isinstance(answer, list) else "OK" for answer in pure_calls["grpc"]]
    assert grpc_codes == [
        "OK",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "INVALID_ARGUMENT",
        "OK",
        "INVALID_ARGUMENT",
        "OK",
    ]
    # One record per call, plus the write-ahead ADMITTED of each admitted write
    # (Describe leaves none).
    assert len(pure_calls["records"]) == len(reasons) + 4 + 6 + 1
    compiled_calls = probe(False, "calls", str(tmp_path))
    if not compiled_calls["active"].startswith("compiled"):
        pytest.skip(f"no compiled hot path here ({compiled_calls['active']})")
    assert compiled_calls["answers"] == pure_calls["answers"]
    assert compiled_calls["grpc"] == pure_calls["grpc"]
    assert compiled_calls["records"] == pure_calls["records"]
    assert compiled_calls["writes"] == pure_calls["writes"]


def _fake_build(base: Path, manifest: dict[str, Any] | None, with_files: bool) -> Path:
    out = base / "_compiled"
    out.mkdir()
    if manifest is not None:
        (out / hotpath.MANIFEST).write_text(json.dumps(manifest))
    if with_files:
        for module in hotpath.COMPILED_MODULES:
            base_name = out.joinpath(*module.split("."))
            target = base_name.with_name(base_name.name + EXTENSION_SUFFIXES[0])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"not really an extension")
    return out


@pytest.mark.parametrize(
    ("manifest", "with_files", "why"),
    [
        (None, False, "pure Python (no compiled build: python scripts/build_hotpath.py)"),
        (
            {"sources": {m: "0" * 64 for m in hotpath.COMPILED_MODULES}},
            True,
            "pure Python (compiled build is stale or incomplete: gateway.audit.chain)",
        ),
        (
            {"sources": {m: hotpath.source_digest(m) for m in hotpath.COMPILED_MODULES}},
            False,
            "pure Python (compiled build is stale or incomplete: gateway.audit.chain)",
        ),
    ],
)
def test_a_missing_stale_or_partial_build_runs_python(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    manifest: dict[str, Any] | None,
    with_files: bool,
    why: str,
) -> None:
    monkeypatch.delenv(hotpath.PURE_PYTHON_ENV, raising=False)
    monkeypatch.setattr(hotpath, "COMPILED_DIR", _fake_build(tmp_path, manifest, with_files))
    assert hotpath._compiled_files() == ({}, why)


async def test_an_agent_names_the_path_it_runs_when_it_starts(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.runtime.agent")
    policy = write_policy(tmp_path / "policy.toml", [grant("bob", ["text.echo"])])
    agent = await started(agent_config(pki, tmp_path, "alice", policy))
    try:
        lines = [r.getMessage() for r in caplog.records if "per-call hot path" in r.getMessage()]
        assert lines == [f"serving on port {agent.port}; per-call hot path: {hotpath.ACTIVE}"]
        compiled = sys.modules["gateway.audit.chain"].__file__ != str(
            REPO / "gateway" / "audit" / "chain.py"
        )
        assert hotpath.is_compiled() is compiled
    finally:
        await agent.stop()
