#!/usr/bin/env bash
# The one way protobuf code is generated. Output lives only in gateway/wire/
# and is committed; .ci/run re-runs this and fails on any diff.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=gateway/wire
rm -rf "$out/v1"
mkdir -p "$out/v1"
# Map proto/a2agw onto gateway/wire so generated imports are package-absolute
# (gateway.wire.v1.gateway_pb2) without post-processing.
python -m grpc_tools.protoc \
  -Igateway/wire=proto/a2agw \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  proto/a2agw/v1/gateway.proto
touch "$out/v1/__init__.py"
