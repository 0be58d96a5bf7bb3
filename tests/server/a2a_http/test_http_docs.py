"""The snippets of docs/a2a-http.md, a2a-jsonrpc.md, a2a-rest.md and a2a-v0_3.md, run served.

Every Python and JavaScript block is run as its own process (Python with this
interpreter, JavaScript with Node from tests/interop/node-a2a, where the SDK is
installed) with ``A2A_URL`` etc. pointing at alice and carol's SVID; each must
exit 0 (the snippets assert what they show). Any shell or Python block not run
must be marked ``<!-- snippet: not-runnable -->``.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gateway.runtime.agent import Agent
from tests.helpers.agent_process import REPO
from tests.helpers.agents import Pki, spiffe

pytestmark = pytest.mark.slow

DOCS = ("docs/a2a-http.md", "docs/a2a-jsonrpc.md", "docs/a2a-rest.md", "docs/a2a-v0_3.md")
# Pages whose shell and Python blocks tests/docs/test_snippets.py runs (against the tour's
# agent); only their JavaScript blocks run here, pointed at the served agent by the environment.
JS_ONLY = ("docs/a2a.md",)
NODE_DIR = REPO / "tests" / "interop" / "node-a2a"
NOT_RUNNABLE = re.compile(r"<!-- snippet: not-runnable(?:: [^>]*)? -->\Z")
"""The marker, with or without its reason (the form tests/helpers/snippets.py asks for)."""
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
RUN = {"python": "python", "js": "js"}
SHELL_OR_PYTHON = {"python", "py", "sh", "bash", "shell", "console"}


def blocks() -> list[tuple[str, int, str, str, bool]]:
    """(doc, number, language, code, marked not-runnable) of every fenced block."""
    found = []
    for doc in DOCS + JS_ONLY:
        text = (REPO / doc).read_text()
        for number, match in enumerate(FENCE.finditer(text)):
            marked = NOT_RUNNABLE.search(text[: match.start()].rstrip()) is not None
            found.append((doc, number, match.group(1), match.group(2), marked))
    return found


RUNNABLE = [
    b for b in blocks() if b[2] in RUN and not b[4] and (b[0] not in JS_ONLY or b[2] == "js")
]


def test_every_shell_or_python_snippet_is_run_or_marked() -> None:
    assert RUNNABLE
    unrun = [
        (doc, n, lang)
        for doc, n, lang, _, marked in blocks()
        if lang in SHELL_OR_PYTHON and lang not in RUN and not marked and doc not in JS_ONLY
    ]
    assert not unrun


@pytest.mark.parametrize(
    ("doc", "number", "language", "code"),
    [pytest.param(d, n, lang, code, id=f"{d}#{n}-{lang}") for d, n, lang, code, _ in RUNNABLE],
)
async def test_the_snippet_runs_against_a_served_agent(
    pki: Pki, alice: Agent, tmp_path: Path, doc: str, number: int, language: str, code: str
) -> None:
    pki_copy = tmp_path / "pki"
    shutil.copytree(pki.dir, pki_copy)
    env = {
        **os.environ,
        "A2A_URL": alice.https_url,
        "A2A_GRPC_ADDRESS": alice.address,
        "A2A_AGENT_ID": spiffe("alice"),
        "A2A_CA": str(pki.dir / "ca.pem"),
        "A2A_CERT": str(pki.dir / "carol.pem"),
        "A2A_KEY": str(pki.dir / "carol.key"),
        "A2A_PKI_DIR": str(pki_copy),
    }
    if language == "python":
        script = tmp_path / "snippet.py"
        command = [sys.executable, str(script)]
    else:
        if shutil.which("node") is None or not (NODE_DIR / "node_modules" / "@a2a-js").is_dir():
            pytest.skip(
                "node or tests/interop/node-a2a/node_modules missing (.ci/run installs them)"
            )
        script = NODE_DIR / f"doc-snippet-{uuid.uuid4().hex}.mjs"  # beside node_modules
        command = ["node", str(script)]
    script.write_text(code)
    try:
        # Asynchronously: the agent serves from this very event loop.
        process = await asyncio.create_subprocess_exec(
            *command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(process.communicate(), 120)
    finally:
        if language == "js":
            script.unlink()
    assert process.returncode == 0, (doc, number, out.decode()[-2000:], err.decode()[-3000:])
    assert out.strip()
