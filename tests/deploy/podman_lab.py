"""Rootful podman for the deployment tests: whether it runs here, the agent's image, containers.

The image is built by ``scripts/build_image.sh`` (``.ci/run`` runs it first, so here it only
reuses cached layers). Containers started here are removed by name, each wait is bounded.
Containers join only a network namespace their test made (``--network ns:PATH``) or none.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_BUILD_TIMEOUT_S = 2400.0
_WAIT_S = 90.0


@cache
def podman_unavailable_reason() -> str | None:
    """Why the image cannot be built and run here, else None."""
    if os.geteuid() != 0:
        return "needs root: the image is built and run with rootful podman"
    for tool in ("podman", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman buildah debootstrap runc)"
    return None


@cache
def podman_env() -> dict[str, str]:
    """The environment for podman: with ``CONTAINERS_CONF`` when its defaults fail here."""
    env = dict(os.environ)
    conf = _run_script("podman_conf.sh", build_base_image(), env=env)
    if conf:
        env["CONTAINERS_CONF"] = conf
    return env


@cache
def agent_image() -> str:
    """The image of this checkout (built, or its cached layers reused); skips without podman."""
    reason = podman_unavailable_reason()
    if reason:
        pytest.skip(reason)
    return _run_script("build_image.sh", env=podman_env())


@cache
def build_base_image() -> str:
    """The runtime base image's name (the build base is this name with ``-build``)."""
    return _run_script("build_base_image.sh")


def _run_script(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=_BUILD_TIMEOUT_S,
        env=env,
        check=False,
    )
    assert result.returncode == 0, f"scripts/{name}: {result.stderr[-4000:]}"
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def podman(
    *args: str, timeout: float = 120.0, check: bool = True, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` with :func:`podman_env`; asserts success unless ``check`` is false."""
    result = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=podman_env(),
        cwd=cwd,
        check=False,
    )
    if check:
        assert result.returncode == 0, f"podman {' '.join(args)}: {result.stderr[-3000:]}"
    return result


def unique_name(prefix: str) -> str:
    """A container or volume name no concurrent run uses."""
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class Container:
    """One container started by :func:`running`."""

    name: str

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def exec(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *args, timeout=timeout, check=False)

    def wait_until(self, ready: object, what: str) -> None:
        """Poll ``ready()`` until true; fails with the container's logs after a bound."""
        deadline = time.monotonic() + _WAIT_S
        while time.monotonic() < deadline:
            if ready():  # type: ignore[operator]
                return
            state = podman("inspect", "--format", "{{.State.Status}}", self.name, check=False)
            if state.stdout.strip() in ("exited", "stopped"):
                break
            time.sleep(0.5)
        pytest.fail(f"{what}: not so within {_WAIT_S} s\n{self.logs()[-4000:]}")


@contextmanager
def running(run_args: list[str], name: str, cwd: Path | None = None) -> Iterator[Container]:
    """``podman run -d RUN_ARGS`` (which names the container ``name``), in ``cwd``; the
    container is removed afterwards."""
    podman("run", "-d", *run_args, timeout=180, cwd=cwd)
    try:
        yield Container(name)
    finally:
        podman("rm", "--force", "--time", "5", name, timeout=60, check=False)


def image_layers(image: str, folder: Path) -> Iterator[tuple[int, str, bytes]]:
    """(layer index, path, content) of every entry in every layer of ``image``, base first
    (``podman image save``; content is empty for anything but a regular file)."""
    archive = folder / "image.tar"
    podman("image", "save", "--format", "docker-archive", "-o", str(archive), image, timeout=600)
    with tarfile.open(archive) as outer:
        manifest = outer.extractfile("manifest.json")
        assert manifest is not None
        [entry] = json.load(manifest)
        for index, layer_name in enumerate(entry["Layers"]):
            layer = outer.extractfile(layer_name)
            assert layer is not None
            with tarfile.open(fileobj=layer) as inner:
                for member in inner.getmembers():
                    data = inner.extractfile(member) if member.isfile() else None
                    yield index, member.name, data.read() if data is not None else b""


def layer_count(image: str) -> int:
    """How many layers ``image`` has."""
    layers = podman("image", "inspect", "--format", "{{len .RootFS.Layers}}", image)
    return int(layers.stdout.strip())
