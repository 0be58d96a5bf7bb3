#!/usr/bin/env bash
# Prints the path of a containers.conf that podman needs on this machine, or nothing when its
# defaults work. Use: conf=$(bash scripts/podman_conf.sh IMAGE); [ -z "$conf" ] || export
# CONTAINERS_CONF="$conf". IMAGE is any local image with /bin/true (a base image).
#
# Seen in the sandboxes this project's CI runs in: crun 1.8 refuses cgroups in hybrid mode
# (v1 controllers with an empty v2 tree), where runc runs; and raising RLIMIT_NOFILE to
# podman's default 1048576 (or RLIMIT_NPROC above 32768) is not permitted.
set -euo pipefail
IMAGE="$1"
CONF="${A2AGW_IMAGES:-/var/cache/a2agw/images}/containers.conf"

if podman run --rm --network=none "$IMAGE" true 2>/dev/null; then
  exit 0
fi
mkdir -p "$(dirname "$CONF")"
cat >"$CONF" <<CONF
# Written by scripts/podman_conf.sh: podman's defaults failed here (see that script).
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
if ! CONTAINERS_CONF="$CONF" podman run --rm --network=none "$IMAGE" true; then
  echo "podman_conf.sh: podman cannot run a container here, even with $CONF" >&2
  exit 1
fi
echo "podman_conf.sh: podman runs here with $CONF (runc, ulimits)" >&2
echo "$CONF"
