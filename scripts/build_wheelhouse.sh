#!/usr/bin/env bash
# Download the wheels of the project's dependencies (and of setuptools, which builds its own
# wheel) for the container image's Python: CPython 3.11 on glibc x86_64 (Debian bookworm).
# The Containerfile installs from this folder with the network off, so one wheelhouse always
# gives the same packages.
#
# Folder: ${A2AGW_WHEELS:-/var/cache/a2agw/wheels}/KEY, outside the clone; KEY is the hash of
# pyproject.toml and of this script, so a clean CI clone reuses it until a dependency changes.
# It prints the folder on stdout; what it did goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

KEY="$(cat pyproject.toml "scripts/build_wheelhouse.sh" | sha256sum | cut -c1-12)"
DEST="${A2AGW_WHEELS:-/var/cache/a2agw/wheels}/$KEY"
if [ -f "$DEST/requirements.txt" ]; then
  echo "build_wheelhouse.sh: reused $DEST ($(ls "$DEST"/*.whl | wc -l) wheels)" >&2
  echo "$DEST"
  exit 0
fi
mkdir -p "$DEST.part"
# [project] dependencies and [build-system] requires, as pyproject.toml names them.
python3 - >"$DEST.part/requirements.in" <<'PY'
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(project["build-system"]["requires"] + project["project"]["dependencies"]))
PY
# Binary wheels only, for the image's interpreter, whatever Python runs this script: every
# manylinux tag that glibc 2.36 runs (pip does not widen --platform by itself).
platforms=()
for minor in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform linux_x86_64 --platform any)
python3 -m pip download --quiet --disable-pip-version-check --dest "$DEST.part" \
  --only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 --abi abi3 \
  --abi none "${platforms[@]}" -r "$DEST.part/requirements.in" >&2
# What was resolved, one pinned line per wheel: the record of what the image holds.
ls "$DEST.part" | sed -n 's/^\([^-]*\)-\([^-]*\)-.*\.whl$/\1==\2/p' | sort >"$DEST.part/requirements.txt"
rm -rf "$DEST" && mv "$DEST.part" "$DEST"
echo "build_wheelhouse.sh: downloaded $(wc -l <"$DEST/requirements.txt") wheels into $DEST" >&2
echo "$DEST"
