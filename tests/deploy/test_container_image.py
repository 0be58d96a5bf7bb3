"""The container image, built from this checkout's Containerfile and run as docs/deploy.md says.

The image is run with the page's exact ``podman run`` line, except that a network namespace of
this test's own replaces the published port (the test talks to nothing else). A peer on the
host then calls it over mTLS in that namespace. Every layer of the image is searched for keys,
state and build leftovers, and ``.containerignore`` is shown to keep them out of the build.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.podman_lab import (
    REPO,
    agent_image,
    build_base_image,
    image_layers,
    layer_count,
    podman,
    podman_unavailable_reason,
    running,
    unique_name,
)
from tests.netns import NetLab, netns_unavailable_reason
from tests.support import Pki, audit_rows, spiffe

DEPLOY_PAGE = REPO / "docs" / "deploy.md"
IMAGE_UID = 10001

pytestmark = pytest.mark.skipif(
    podman_unavailable_reason() is not None, reason=podman_unavailable_reason() or ""
)


def _page_block(starting: str) -> str:
    text = DEPLOY_PAGE.read_text()
    blocks = re.findall(r"^```(?:sh|toml)\n(.*?)^```", text, re.M | re.S)
    [block] = [b for b in blocks if b.startswith(starting)]
    return block


def _page_run_command() -> list[str]:
    """The page's ``podman run`` line, as words."""
    block = _page_block("podman run")
    first = block.split("\n\n")[0].replace("\\\n", " ").splitlines()[0]
    return shlex.split(first)


def _agent_folder(pki: Pki, folder: Path) -> Path:
    """What the page mounts at /etc/a2a-gateway: its agent.toml with the container's key path,
    a policy granting bob text.echo, and alice's certificate and key, readable by the image's
    group and nobody else."""
    etc = folder / "etc"
    (etc / "pki").mkdir(parents=True)
    agent_toml = _page_block('id = "spiffe://example.org/agent/alice"')
    key_line = 'key = "/run/credentials/a2a-gateway.service/tls.key"'
    assert key_line in agent_toml
    (etc / "agent.toml").write_text(agent_toml.replace(key_line, 'key = "pki/agent.key"'))
    (etc / "alice-policy.toml").write_text(
        "version = 1\n\n[[grants]]\n"
        f'peer = "{spiffe("bob")}"\ncapabilities = ["text.echo"]\n'
        'max_payload_bytes = 4096\nexpires_at = "2030-01-01T00:00:00Z"\n'
    )
    shutil.copy(pki.dir / "ca.pem", etc / "pki" / "ca.pem")
    shutil.copy(pki.dir / "alice.pem", etc / "pki" / "agent.pem")
    shutil.copy(pki.dir / "alice.key", etc / "pki" / "agent.key")
    # The page's `chgrp -R 10001 etc && chmod -R g+rX etc`, and no access for others.
    for path in [etc, *etc.rglob("*")]:
        shutil.chown(path, group=IMAGE_UID)
        path.chmod(0o750 if path.is_dir() else 0o640)
    return etc


def _bob_config(pki: Pki, folder: Path) -> Path:
    config = folder / "bob.toml"
    config.write_text(
        f'id = "{spiffe("bob")}"\nlisten = "127.0.0.1:0"\npolicy = "bob-policy.toml"\n'
        f'audit_db = "bob-audit.sqlite"\nstate_dir = "bob-state"\n\n[tls]\n'
        f'ca = "{pki.dir / "ca.pem"}"\ncert = "{pki.dir / "bob.pem"}"\n'
        f'key = "{pki.dir / "bob.key"}"\n\n'
        f'[[peers]]\nid = "{spiffe("alice")}"\naddress = "127.0.0.1:7001"\n'
    )
    (folder / "bob-policy.toml").write_text("version = 1\n")
    return config


@pytest.fixture(scope="module")
def image() -> str:
    return agent_image()


@pytest.fixture
def volume() -> Iterator[str]:
    name = unique_name("a2agw-state")
    try:
        yield name
    finally:
        podman("volume", "rm", "--force", name, check=False)


def test_the_image_runs_as_the_page_says_and_answers_a_peer_over_mtls(
    image: str, pki: Pki, tmp_path: Path, volume: str
) -> None:
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    _agent_folder(pki, tmp_path)
    bob = _bob_config(pki, tmp_path)
    words = _page_run_command()
    assert words[:3] == ["podman", "run", "-d"] and words[-1] == "localhost/a2a-gateway:latest"
    with NetLab("a2agw-ct") as lab:
        ns = lab.namespace("alice")
        name = unique_name("a2agw-alice")
        run_args = [
            {
                "alice": name,
                "a2agw-state:/var/lib/a2a-gateway": f"{volume}:/var/lib/a2a-gateway",
            }.get(word, word)
            for word in words[3:-1]
        ]
        published = run_args.index("-p")
        run_args[published : published + 2] = ["--network", f"ns:/run/netns/{ns.name}"]
        assert "./etc:/etc/a2a-gateway:ro" in run_args
        with running([*run_args, image], name, cwd=tmp_path) as container:
            # The page's `podman healthcheck run alice`: the image's HEALTHCHECK on /readyz.
            container.wait_until(
                lambda: podman("healthcheck", "run", name, check=False).returncode == 0,
                "podman healthcheck run",
            )
            call = [sys.executable, "-m", "gateway.cli.main", "call", "--config", str(bob)]
            allowed = ns.run(
                [*call, "--peer", spiffe("alice"), "text.echo", "--input", '{"text": "hi"}'],
                cwd=tmp_path,
            )
            assert allowed.returncode == 0, allowed.stderr
            assert json.loads(allowed.stdout) == {"text": "hi"}
            refused = ns.run(
                [*call, "--peer", spiffe("alice"), "kv.get", "--input", '{"key": "x"}'],
                cwd=tmp_path,
            )
            assert (refused.returncode, refused.stderr.strip()) == (
                1,
                "refused: CAPABILITY_NOT_GRANTED: capability not granted to this peer",
            )
            podman("stop", "--time", "30", name, timeout=60)
            state = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
            assert state == "0", container.logs()  # SIGTERM: a clean stop
        mountpoint = podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume)
        audit_db = Path(mountpoint.stdout.strip()) / "alice-audit.sqlite"
        assert audit_db.stat().st_uid == IMAGE_UID and audit_db.stat().st_mode & 0o077 == 0
        decisions = [
            (r.peer_id, r.capability, r.reason) for r in audit_rows(audit_db) if r.capability
        ]
        assert (spiffe("bob"), "text.echo", "OK") in decisions
        assert (spiffe("bob"), "kv.get", "CAPABILITY_NOT_GRANTED") in decisions
        verified = subprocess.run(
            [sys.executable, "-m", "gateway.cli.main", "audit", "verify", "--db", str(audit_db)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_image_is_non_root_with_a_healthcheck_and_the_serve_entrypoint(image: str) -> None:
    [inspected] = json.loads(podman("image", "inspect", image).stdout)
    config = inspected["Config"]
    assert config["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
    assert config["Entrypoint"] == ["a2a-gateway", "--log-format", "json"]
    assert config["Cmd"] == ["serve", "--config", "/etc/a2a-gateway/agent.toml"]
    assert "http://127.0.0.1:9464/readyz" in " ".join(inspected["Healthcheck"]["Test"])
    assert config["Volumes"] == {"/var/lib/a2a-gateway": {}}


_PEM_PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/=]{40}")
_SECRET_SUFFIXES = (".key", ".sqlite", ".sqlite-wal", ".sqlite-shm", ".sqlite3", ".p12", ".jsonl")
# A working checkout's folders, wherever a careless COPY would have put them.
_CHECKOUT_FOLDERS = re.compile(r"(^|/)(\.venv|\.git|pki|state|a2a_peer_gateway\.egg-info)(/|$)")
_BUILD_FOLDERS = re.compile(r"^(\./)?(src|tmp/dist|tmp/pip|wheels|build|dist)/.")


def leftovers(image: str, keys: list[bytes], folder: Path) -> dict[str, list[str]]:
    """What ``image``'s layers hold that no image of the agent may: ``keys``, key or state
    files, PEM private keys, a checkout's or the build's folders, installers."""
    # The base layers are Debian's packages as debootstrap installed them: GnuTLS carries
    # private keys of its own self-tests, so the PEM check starts above them.
    base_layers = layer_count(build_base_image())
    found: dict[str, list[str]] = {}
    for index, path, content in image_layers(image, folder):
        name = f"layer {index}: {path.rstrip('/')}"
        if any(key in content for key in keys):
            found.setdefault("given keys", []).append(name)
        if path.endswith(_SECRET_SUFFIXES):
            found.setdefault("key or state files", []).append(name)
        if index >= base_layers and _PEM_PRIVATE_KEY.search(content):
            found.setdefault("PEM private keys", []).append(name)
        if _CHECKOUT_FOLDERS.search(path) or _BUILD_FOLDERS.search(path):
            found.setdefault("checkout or build folders", []).append(name)
        if re.search(r"site-packages/(pip|setuptools)/", path):
            found.setdefault("installers in the runtime", []).append(name)
    return found


def test_no_key_state_or_build_leftover_is_in_any_layer(
    image: str, pki: Pki, tmp_path: Path
) -> None:
    # No layer may hold a key of this session's PKI either: the other tests mount them into
    # containers of this image.
    keys = [path.read_bytes() for path in pki.dir.glob("*.key")]
    assert keys
    assert leftovers(image, keys, tmp_path) == {}


def test_the_layer_search_finds_what_the_old_recipe_left(pki: Pki, tmp_path: Path) -> None:
    # The page's old recipe: COPY . /src after the README's setup, then rm -rf /src in a
    # later layer. The search must see through that.
    context = tmp_path / "checkout"
    (context / "pki").mkdir(parents=True)
    shutil.copy(pki.dir / "alice.key", context / "pki" / "alice.key")
    (context / "state").mkdir()
    (context / "state" / "alice-audit.sqlite").write_text("")
    (context / "Containerfile").write_text(
        f"FROM {build_base_image()}\nCOPY . /src\nRUN rm -rf /src\n"
    )
    tag = f"localhost/{unique_name('a2agw-old-recipe')}"
    podman("build", "--quiet", "--network=none", "-t", tag, str(context), timeout=300)
    try:
        found = leftovers(tag, [(pki.dir / "alice.key").read_bytes()], tmp_path)
    finally:
        podman("rmi", "--force", tag, check=False)
    assert found == {
        "given keys": ["layer 1: src/pki/alice.key"],
        "key or state files": [
            "layer 1: src/pki/alice.key",
            "layer 1: src/state/alice-audit.sqlite",
        ],
        "PEM private keys": ["layer 1: src/pki/alice.key"],
        "checkout or build folders": [
            "layer 1: src/Containerfile",
            "layer 1: src/pki",
            "layer 1: src/pki/alice.key",
            "layer 1: src/state",
            "layer 1: src/state/alice-audit.sqlite",
        ],
    }


def test_the_containerignore_keeps_a_working_checkout_out_of_the_build(tmp_path: Path) -> None:
    # A checkout after the README's setup and the five-minute tour: a venv, keys, state,
    # a git folder, caches. Podman reads the repository's .containerignore for it.
    context = tmp_path / "checkout"
    for kept in ("pyproject.toml", "README.md"):
        (context / kept).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / kept, context / kept)
    shutil.copy(REPO / ".containerignore", context / ".containerignore")
    sources = {
        "gateway/__init__.py": "",
        "gateway/console/static/console.css": "",
        "capabilities/builtin/echo.py": "",
        "policies/grants.py": "",
    }
    planted = {
        ".venv/bin/python": "",
        ".git/config": "",
        "pki/alice.key": "-----BEGIN PRIVATE KEY-----",
        "state/alice-audit.sqlite": "",
        "alice-audit.sqlite-wal": "",
        "gateway/__pycache__/x.cpython-311.pyc": "",
        "gateway/dev.key": "-----BEGIN PRIVATE KEY-----",
        "capabilities/notes.sqlite": "",
        "a2a_peer_gateway.egg-info/PKG-INFO": "",
        "build/lib/gateway/__init__.py": "",
        "alice.toml": "",
    }
    for relative, text in {**sources, **planted}.items():
        (context / relative).parent.mkdir(parents=True, exist_ok=True)
        (context / relative).write_text(text)
    (context / "Containerfile").write_text(f"FROM {build_base_image()}\nCOPY . /context\n")
    tag = f"localhost/{unique_name('a2agw-context')}"
    podman("build", "--quiet", "--network=none", "-t", tag, str(context), timeout=300)
    try:
        listed = podman("run", "--rm", "--network=none", tag, "find", "/context", "-type", "f")
    finally:
        podman("rmi", "--force", tag, check=False)
    seen = {line.removeprefix("/context/") for line in listed.stdout.split()}
    assert seen == {"pyproject.toml", "README.md", *sources}
