"""Build the compiled hot path: mypyc copies of ``gateway.hotpath.COMPILED_MODULES``.

Usage::

    python scripts/build_hotpath.py                 # build into gateway/_compiled/
    python scripts/build_hotpath.py --cache DIR     # reuse DIR/<key>/ when sources match
    python scripts/build_hotpath.py --clean         # remove the build (pure Python again)

Needs mypy (its mypyc, a dev dependency) and a C compiler; about a minute on
two cores. Nothing else changes: without this build, or with
``A2AGW_PURE_PYTHON=1``, the same modules run as Python. The manifest records
the SHA-256 of every compiled source, so an edited source falls back to
Python until the next build (see ``gateway/hotpath.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ["A2AGW_PURE_PYTHON"] = "1"  # never load an old build while making a new one
sys.path.insert(0, str(REPO))

from gateway.hotpath import (  # noqa: E402
    COMPILED_DIR,
    COMPILED_MODULES,
    MANIFEST,
    source_digest,
)


def cache_key() -> str:
    """The sources, mypy's version and the interpreter: what the build's bytes depend on."""
    import mypy.version

    parts = [f"{m}={source_digest(m)}" for m in COMPILED_MODULES]
    parts += [f"mypy={mypy.version.__version__}", f"python={sys.version}", sys.platform]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def build(out: Path) -> None:
    """Compile the modules with mypyc and lay the extensions and manifest out in ``out``."""
    from mypyc.build import mypycify
    from setuptools import setup

    sources = [str(Path(*m.split(".")).with_suffix(".py")) for m in COMPILED_MODULES]
    digests = {m: source_digest(m) for m in COMPILED_MODULES}  # of what is compiled
    with tempfile.TemporaryDirectory(prefix="a2agw-mypyc-") as tmp:
        here = Path.cwd()
        os.chdir(REPO)  # mypyc names modules by their path from here
        try:
            extensions = mypycify(sources, opt_level="3", target_dir=f"{tmp}/c")
            setup(
                name="a2agw-hotpath",
                ext_modules=extensions,
                script_args=["build_ext", "--build-lib", f"{tmp}/lib", "--build-temp", tmp, "-q"],
            )
        finally:
            os.chdir(here)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(f"{tmp}/lib", out)
    support = sorted(p.name.split(".")[0] for p in out.glob("*__mypyc*"))
    manifest = {"sources": digests, "support": support}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def main() -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help="keep and reuse builds under this folder")
    parser.add_argument("--clean", action="store_true", help="remove the build")
    args = parser.parse_args()
    if args.clean:
        shutil.rmtree(COMPILED_DIR, ignore_errors=True)
        print(f"removed {COMPILED_DIR}")
        return 0
    if args.cache is not None:
        cached = args.cache / cache_key()
        if not (cached / MANIFEST).is_file():
            build(cached)
            print(f"built into the cache: {cached}")
        shutil.rmtree(COMPILED_DIR, ignore_errors=True)
        shutil.copytree(cached, COMPILED_DIR)
    else:
        build(COMPILED_DIR)
    print(f"compiled hot path in {COMPILED_DIR}: {', '.join(COMPILED_MODULES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
