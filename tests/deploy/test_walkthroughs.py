"""The local walkthroughs of docs/fleet.md and docs/spire.md, run as written.

fleet.md: two replicas of one agent on one throwaway PostgreSQL. spire.md: a SPIRE server and
agent on this machine, handing SVIDs to two gateway agents. Each page's snippets run by the
rules of tests/docs/test_snippets.py: every block not marked not-runnable, in page order, in
one scratch folder per page, ``file`` blocks written there, background processes ended when the
page ends. This runner adds only what a page asks its reader to have: PostgreSQL's programs
(fleet.md), SPIRE's binaries on ``PATH`` (spire.md). Without them the test skips, saying so.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docs.snippets import Snippet, Use, external_runner, snippets
from tests.postgres import find_bin_dir
from tests.spire.spire_lab import spire_bin

REPO = Path(__file__).resolve().parents[2]
BLOCK_TIMEOUT_S = 180.0
THIS_RUNNER = "tests/deploy/test_walkthroughs.py"


@dataclass
class PageRun:
    """One page's scratch folder, the output of each block, and the groups it started."""

    folder: Path
    path: str
    outputs: list[str] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)

    def run(self, snippet: Snippet) -> None:
        if snippet.use is Use.WRITE_FILE:
            (self.folder / snippet.file_name).write_text(snippet.text, encoding="utf-8")
            return
        assert snippet.language in ("sh", "bash"), f"{snippet.where}: only shell runs here"
        env = dict(os.environ)
        env["PATH"] = self.path
        env.pop("SPIFFE_ENDPOINT_SOCKET", None)
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", snippet.text],
            cwd=self.folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
        )
        self.groups.append(process.pid)
        try:
            output, _ = process.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            pytest.fail(
                f"{snippet.where}: still running after {BLOCK_TIMEOUT_S} s\n{output}{self.logs()}"
            )
        if process.returncode != 0:
            pytest.fail(
                f"{snippet.where}: exit {process.returncode}\n{output[-4000:]}{self.logs()}"
            )
        self.outputs.append(output)

    def logs(self) -> str:
        """The end of every log file the page's background processes write."""
        return "".join(
            f"\n--- {log.name}:\n{log.read_text(errors='replace')[-1500:]}"
            for log in sorted(self.folder.glob("*.log"))
        )

    def stop(self) -> None:
        """End every process group the page's blocks started (TERM, then KILL)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in self.groups:
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(_alive(g) for g in self.groups):
                time.sleep(0.1)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def run_page(page: Path, folder: Path, extra_path: list[Path]) -> list[str]:
    """Run ``page``'s snippets in ``folder``; returns the output of each run block."""
    assert external_runner(page) == THIS_RUNNER
    path = os.pathsep.join(
        [*map(str, extra_path), str(Path(sys.executable).parent), os.environ["PATH"]]
    )
    run = PageRun(folder, path)
    try:
        for snippet in snippets(page):
            if snippet.use is not Use.SHOW:
                run.run(snippet)
    finally:
        run.stop()
        leftover = folder / "pgdata"  # fleet.md's server folder, if the page stopped early
        if leftover.is_symlink():
            shutil.rmtree(leftover.resolve(), ignore_errors=True)
    return run.outputs


def _json_objects(text: str) -> list[object]:
    return [json.loads(m) for m in re.findall(r"^\{\n.*?^\}$", text, re.M | re.S)]


def test_fleet_two_replicas_on_one_postgresql(tmp_path: Path) -> None:
    if find_bin_dir() is None:
        pytest.skip("PostgreSQL's server programs are not installed (Debian: postgresql)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root, and there is no postgres user to run the server")
    outputs = run_page(REPO / "docs" / "fleet.md", tmp_path, [])
    assert len(outputs) == 6
    assert "applied migration(s)" in outputs[0]
    calls = outputs[3]
    assert _json_objects(calls) == [
        {"key": "order-42", "revision": 1},
        {"key": "order-42", "revision": 1},
    ]
    served = re.findall(
        r"^served kv\.put@1\.0\.0 evidence sha256:\w+( \(replayed\))?$", calls, re.M
    )
    assert served == ["", " (replayed)"]
    audit = outputs[4]
    assert audit.count("spiffe://example.org/agent/alice  kv.put") == 4  # ADMITTED, OK, twice
    assert "spiffe://example.org/agent/bob: chain intact (4 records)" in audit
    assert audit.rstrip().endswith("1 chain(s), 0 broken")
    assert not (tmp_path / "pgdata").exists()  # the page removed its server's files


def test_spire_server_and_agent_on_one_machine(tmp_path: Path) -> None:
    outputs = run_page(REPO / "docs" / "spire.md", tmp_path, [spire_bin()])
    assert len(outputs) == 4
    assert outputs[0].strip() == "id-a011b38aafbe4762a0238d856808af28.svid.a2agw.invalid"
    entries = re.findall(r"^SPIFFE ID\s+: (\S+)$", outputs[2], re.M)
    assert entries == ["spiffe://example.org/agent/alice", "spiffe://example.org/agent/bob"]
    calls = outputs[3]
    assert _json_objects(calls) == [{"text": "hello over SPIRE"}]
    assert "refused: CAPABILITY_NOT_GRANTED: capability not granted to this peer" in calls
    assert "exit 1: refused, as the policy says" in calls
    assert calls.rstrip().endswith("state/alice-audit.sqlite: chain intact (2 records)")
    assert list(tmp_path.rglob("*.key")) == []  # the SVIDs' keys never touched the disk
