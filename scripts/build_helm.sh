#!/usr/bin/env bash
# Build helm (the Kubernetes package manager) from its Go module, for the chart tests in
# tests/deploy/: `helm lint` and `helm template` of deploy/helm/a2a-gateway (no cluster).
# Debian bookworm has no helm package, so the machine's Go builds it.
#
# The binary goes to a cache outside the clone, so a clean CI clone reuses it:
#   ${A2AGW_TOOLS:-/var/cache/a2agw/tools}/helm-4.3.2/bin/helm
# When it is present the script does nothing. It prints the bin directory on stdout.
set -euo pipefail

HELM_VERSION=4.3.2
TOOLS="${A2AGW_TOOLS:-/var/cache/a2agw/tools}"
DEST="$TOOLS/helm-$HELM_VERSION/bin"
GO="${GO:-/usr/local/go/bin/go}"

if [ -x "$DEST/helm" ]; then
  echo "$DEST"
  exit 0
fi
if ! [ -x "$GO" ] && ! GO="$(command -v go)"; then
  echo "build_helm.sh: Go is not installed (looked for /usr/local/go/bin/go and go on PATH)" >&2
  exit 1
fi

mkdir -p "$DEST"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
# A throwaway module that pins helm as a tool dependency: `go get -tool` resolves the exact
# version and its go.sum through the module proxy, `go build` then builds from that module.
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
"$GO" mod init a2agw.local/helmtools >/dev/null 2>&1
nice -n 10 "$GO" get -tool "helm.sh/helm/v4/cmd/helm@v$HELM_VERSION" >&2
# The machine is shared: nice, and at most two compile jobs at once. The version is stamped
# as helm's own release build does, so `helm version` names it.
nice -n 10 "$GO" build -p 2 -trimpath -o "$WORK/helm" \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v$HELM_VERSION" \
  helm.sh/helm/v4/cmd/helm >&2
mv "$WORK/helm" "$DEST/helm"
echo "$DEST"
