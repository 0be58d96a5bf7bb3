#!/usr/bin/env bash
# Build spire-server and spire-agent (the SPIRE reference implementation of the SPIFFE
# Workload API) from their Go module, for the integration tests in tests/spire/.
#
# The binaries go to a cache outside the clone, so a clean CI clone reuses them:
#   ${A2AGW_TOOLS:-/var/cache/a2agw/tools}/spire-1.13.3/bin/{spire-server,spire-agent}
# When both are present the script does nothing. It prints the bin directory on stdout.
set -euo pipefail

SPIRE_VERSION=1.13.3
TOOLS="${A2AGW_TOOLS:-/var/cache/a2agw/tools}"
DEST="$TOOLS/spire-$SPIRE_VERSION/bin"
GO="${GO:-/usr/local/go/bin/go}"

if [ -x "$DEST/spire-server" ] && [ -x "$DEST/spire-agent" ]; then
  echo "$DEST"
  exit 0
fi
if ! [ -x "$GO" ] && ! GO="$(command -v go)"; then
  echo "build_spire.sh: Go is not installed (looked for /usr/local/go/bin/go and go on PATH)" >&2
  exit 1
fi

mkdir -p "$DEST"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
# A throwaway module that pins SPIRE as a tool dependency: `go get -tool` resolves the exact
# version and its go.sum through the module proxy, `go install` then builds from that module.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED="${CGO_ENABLED:-1}"
"$GO" mod init a2agw.local/spiretools >/dev/null 2>&1
for cmd in spire-server spire-agent; do
  nice -n 10 "$GO" get -tool "github.com/spiffe/spire/cmd/$cmd@v$SPIRE_VERSION" >&2
done
# The machine is shared: nice, and at most two compile jobs at once.
GOBIN="$DEST" nice -n 10 "$GO" install -p 2 \
  github.com/spiffe/spire/cmd/spire-server github.com/spiffe/spire/cmd/spire-agent >&2
echo "$DEST"
