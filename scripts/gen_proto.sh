#!/usr/bin/env bash
# gen_proto.sh — regenerate nr_contract/control_pb2.py and control_pb2_grpc.py from
# nr_contract/control.proto (the generated modules are committed; run this after any change).
#
# The generator is pinned: grpcio-tools 1.49.1 (protoc 3.21.6). Its _pb2 code runs on the
# protobuf runtime the venv is pinned to (3.20.x, by p4runtime-shell) and on newer ones
# (4.x, 5.x, 6.x), which newer generators' code does not (it demands protobuf >= 5). It is
# installed into a throwaway venv ($NR_PROTOC_VENV, default /tmp/netreduce-protoc), never
# into the project's.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GEN=${NR_PROTOC_VENV:-/tmp/netreduce-protoc}
TOOLS=grpcio-tools==1.49.1
if ! "$GEN/bin/python" -c 'import grpc_tools' 2>/dev/null; then
  python3 -m venv "$GEN"
  "$GEN/bin/pip" install -q "$TOOLS"
fi
cd "$ROOT"
"$GEN/bin/python" -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. \
  nr_contract/control.proto
echo "gen_proto: regenerated nr_contract/control_pb2.py, nr_contract/control_pb2_grpc.py ($TOOLS)"
