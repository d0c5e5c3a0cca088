#!/usr/bin/env bash
# ib_write_bw_pair.sh [SRC DST [SIZE ITERS]] — inside the lab: perftest RC RDMA WRITE from host
# SRC to host DST (default 0 -> 1, 64 KiB x 500); prints "ib_write_bw hSRC->hDST: X Gbit/s".
set -euo pipefail
src=${1:-0} dst=${2:-1} size=${3:-65536} iters=${4:-500}
args=(ib_write_bw -x 1 -F --report_gbits -s "$size" -n "$iters")
ip netns exec "h$dst" "${args[@]}" -d "rxe$dst" >/dev/null &
server=$!
sleep 2
out=$(ip netns exec "h$src" "${args[@]}" -d "rxe$src" "10.77.0.$((dst + 1))")
wait "$server"
bw=$(awk -v s="$size" '$1 == s {print $4}' <<<"$out")
echo "ib_write_bw h$src->h$dst: ${bw:?no result in: $out} Gbit/s (RC, $size B x $iters)"
