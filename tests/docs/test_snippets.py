"""Every shell and Python snippet of the docs runs, in order, one scratch folder per page.

A page whose snippet stops working fails here, naming the page and line. Background
processes a page starts (``a2a-gateway serve ... &``) are stopped when the page ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.snippets import Snippet, SnippetSyntaxError, Use, external_runner, snippets

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")],
    key=lambda page: str(page),
)
RUNNER = Path(__file__).parents[1] / "helpers" / "run_python_snippet.py"
BLOCK_TIMEOUT_S = 180.0


def _runnable_pages() -> list[Path]:
    # A page that names its own runner needs what that test provides (a served
    # agent, its SVIDs in the environment); run here, it could only fail.
    return [
        page
        for page in PAGES
        if page.exists()
        and external_runner(page) is None
        and any(s.use is not Use.SHOW for s in snippets(page))
    ]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _Page:
    """One page's scratch folder and the process groups its blocks started."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.groups: list[int] = []

    def run(self, snippet: Snippet) -> None:
        if snippet.use is Use.WRITE_FILE:
            target = self.folder / snippet.file_name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(snippet.text, encoding="utf-8")
            return
        if snippet.language == "python":
            script = self.folder / f".snippet-{snippet.line}.py"
            script.write_text(snippet.text, encoding="utf-8")
            argv = [sys.executable, str(RUNNER), str(script)]
        else:
            argv = ["bash", "-euo", "pipefail", "-c", snippet.text]
        process = subprocess.Popen(
            argv,
            cwd=self.folder,
            env=_environment(),
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
            pytest.fail(f"{snippet.where}: still running after {BLOCK_TIMEOUT_S} s\n{output}")
        if process.returncode != 0:
            pytest.fail(f"{snippet.where}: exit {process.returncode}\n{output[-4000:]}")

    def stop_background(self) -> None:
        for group in self.groups:
            _signal_group(group, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(g) for g in self.groups):
            time.sleep(0.1)
        for group in self.groups:
            _signal_group(group, signal.SIGKILL)


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture()
def page_folder(tmp_path: Path) -> Iterator[_Page]:
    page = _Page(tmp_path)
    try:
        yield page
    finally:
        page.stop_background()


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_snippets_run(page: Path, page_folder: _Page) -> None:
    ran = 0
    for snippet in snippets(page):
        if snippet.use is not Use.SHOW:
            page_folder.run(snippet)
            ran += 1
    assert ran > 0


def test_every_page_parses_and_marks_what_it_does_not_run() -> None:
    problems = []
    for page in PAGES:
        if not page.exists():
            continue
        try:
            for snippet in snippets(page):
                assert snippet.use in set(Use)
        except SnippetSyntaxError as err:
            problems.append(str(err))
    assert problems == []


def test_pages_run_elsewhere_name_a_test_that_exists() -> None:
    named = {page.name: external_runner(page) for page in PAGES if page.exists()}
    elsewhere = {name: path for name, path in named.items() if path is not None}
    assert all((ROOT / path).is_file() for path in elsewhere.values()), elsewhere


def test_marker_grammar_is_strict(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- snippet: not-runnable -->\n```sh\nfalse\n```\n")
    with pytest.raises(SnippetSyntaxError, match="needs ': why'"):
        snippets(page)
    page.write_text("<!-- snippet: file ../escape.toml -->\n```toml\nx = 1\n```\n")
    with pytest.raises(SnippetSyntaxError, match="relative NAME"):
        snippets(page)
    page.write_text("```sh\necho open\n")
    with pytest.raises(SnippetSyntaxError, match="never closed"):
        snippets(page)


def test_uses_follow_the_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\necho run\n```\n"
        "<!-- snippet: not-runnable: a synopsis -->\n```sh\nx [--y]\n```\n"
        "<!-- snippet: file a.toml -->\n```toml\nx = 1\n```\n"
        "```toml\ny = 2\n```\n"
        "<!-- snippet: hidden\n```python\nprint(1)\n```\n-->\n"
    )
    assert [(s.language, s.use, s.file_name) for s in snippets(page)] == [
        ("sh", Use.RUN, ""),
        ("sh", Use.SHOW, ""),
        ("toml", Use.WRITE_FILE, "a.toml"),
        ("toml", Use.SHOW, ""),
        ("python", Use.RUN, ""),
    ]
