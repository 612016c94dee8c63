#!/usr/bin/env bash
# Regenerates the TubeMQ protobuf modules (src/streamledger/protocol/tubemq/_pb/) from our own
# .proto files with grpcio-tools' bundled protoc, so no system protoc is needed.
# The generated code embeds a protobuf runtime version check: keep grpcio-tools' bundled
# protobuf major/minor <= the runtime installed next to it (see docs/tubemq.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PKG=src/streamledger/protocol/tubemq
OUT=$PKG/_pb
mkdir -p "$OUT"
"$VENV/bin/python" -m grpc_tools.protoc \
  --proto_path="$PKG/proto" \
  --python_out="$OUT" \
  --pyi_out="$OUT" \
  "$PKG/proto/tubemq_rpc.proto" "$PKG/proto/tubemq_master.proto"
if [ ! -f "$OUT/__init__.py" ]; then
  printf '"""Generated protobuf modules; regenerate with scripts/gen_tubemq_proto.sh, never edit."""\n' \
    > "$OUT/__init__.py"
fi
echo "generated: $(ls "$OUT")"
