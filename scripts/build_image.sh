#!/usr/bin/env bash
# Build the agent's container image from this checkout with podman (Containerfile):
# the base images from Debian's packages (build_base_image.sh), the dependencies' wheels
# (build_wheelhouse.sh), then `podman build` with the network off. Every step reuses what
# an earlier run made and says so; podman reuses unchanged layers.
#
# Prints the image name (${A2AGW_IMAGE:-localhost/a2a-gateway:latest}) on stdout; sizes,
# times and what was reused go to stderr. Needs root (rootful podman), podman, buildah's
# runtime (runc or crun) and debootstrap.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${A2AGW_IMAGE:-localhost/a2a-gateway:latest}"
started=$(date +%s)
BASE="$(bash scripts/build_base_image.sh)"
WHEELS="$(bash scripts/build_wheelhouse.sh)"
CONF="$(bash scripts/podman_conf.sh "$BASE")"
[ -z "$CONF" ] || export CONTAINERS_CONF="$CONF"
prepared=$(date +%s)
podman build --quiet --network=none --format docker --layers \
  --build-context wheels="$WHEELS" --build-arg BASE="$BASE" \
  -t "$IMAGE" -f Containerfile . >/dev/null
finished=$(date +%s)
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "build_image.sh: $IMAGE: $((size / 1000000)) MB; base and wheels $((prepared - started)) s," \
  "podman build $((finished - prepared)) s" >&2
echo "$IMAGE"
