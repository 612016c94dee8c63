#!/usr/bin/env bash
# Regenerates the TubeMQ protobuf modules (src/streamledger/protocol/tubemq/_pb/) from our own
# .proto files with the protoc bundled in grpcio-tools, so no system protoc is needed.
# grpcio-tools is pinned to 1.62.3 (libprotoc 25.1): the last protoc whose Python gencode carries no
# runtime version check, so the committed modules import on protobuf 4.25 through 7.x (Dagster and
# Airflow resolve different majors). It needs protobuf 4.x next to it, so it is installed into a
# scratch --target directory instead of the venv (see docs/tubemq.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
GRPCIO_TOOLS=${GRPCIO_TOOLS:-1.62.3}
TOOLS=${TMPDIR:-/tmp}/streamledger-grpcio-tools-$GRPCIO_TOOLS
PKG=src/streamledger/protocol/tubemq
OUT=$PKG/_pb
if [ ! -d "$TOOLS/grpc_tools" ]; then
  "$VENV/bin/pip" install -q --target "$TOOLS" "grpcio-tools==$GRPCIO_TOOLS"
fi
mkdir -p "$OUT"
PYTHONPATH="$TOOLS" "$VENV/bin/python" -m grpc_tools.protoc \
  --proto_path="$PKG/proto" \
  --python_out="$OUT" \
  --pyi_out="$OUT" \
  "$PKG/proto/tubemq_rpc.proto" "$PKG/proto/tubemq_master.proto"
if [ ! -f "$OUT/__init__.py" ]; then
  printf '"""Generated protobuf modules; regenerate with scripts/gen_tubemq_proto.sh, never edit."""\n' \
    > "$OUT/__init__.py"
fi
echo "generated with $(PYTHONPATH="$TOOLS" "$VENV/bin/python" -m grpc_tools.protoc --version): $(ls "$OUT")"
