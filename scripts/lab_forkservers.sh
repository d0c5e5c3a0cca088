#!/usr/bin/env bash
# lab_forkservers.sh start HOSTS | stop — the lab's fork servers (netreduce.tools.forkserver):
# one per host hI, in its namespace, listening on $NR_FORKSERVERS/hI.sock (a directory only
# root may enter), with numpy, pyverbs and grpc imported; `netreduce launch` forks its
# ranks from them (a warm rank starts in well under a second where a cold one imports for
# ~12 s under TCG). `start` returns once every server listens (bounded: 600 s), printing how
# long that took; `stop` ends them. Run by scripts/lab.sh's command side (VM or native)
# with $LABDIR/env sourced; each server's log is $NR_FORKSERVERS/hI.log. $NR_LAB_PRELOAD
# (lab.sh --preload) names more modules each server imports (e.g. torch).
set -euo pipefail
: "${NR_FORKSERVERS:?lab_forkservers.sh: NR_FORKSERVERS is not set (scripts/lab.sh sets it)}"
say() { echo "[lab-forkservers] $*" >&2; }
case "${1:-}" in
  start)
    hosts=$2
    rm -rf "$NR_FORKSERVERS"
    mkdir -m 700 -p "$NR_FORKSERVERS"
    t0=$(date +%s)
    for ((i = 0; i < hosts; i++)); do
      setsid ip netns exec "h$i" python -m netreduce.tools.forkserver "$NR_FORKSERVERS/h$i.sock" \
        --also "${NR_LAB_PRELOAD:-}" > "$NR_FORKSERVERS/h$i.log" 2>&1 < /dev/null &
      echo $! > "$NR_FORKSERVERS/h$i.pid"
    done
    for ((i = 0; i < hosts; i++)); do
      until [ -S "$NR_FORKSERVERS/h$i.sock" ]; do
        if ! kill -0 "$(cat "$NR_FORKSERVERS/h$i.pid")" 2>/dev/null; then
          say "error: h$i's fork server died:"; sed 's/^/  /' "$NR_FORKSERVERS/h$i.log" >&2; exit 1
        fi
        (( $(date +%s) - t0 < 600 )) || { say "error: h$i's fork server did not listen within 600 s"; exit 1; }
        sleep 0.5
      done
    done
    say "$hosts fork servers listening in $(( $(date +%s) - t0 )) s ($NR_FORKSERVERS)"
    ;;
  stop)
    for f in "$NR_FORKSERVERS"/h*.pid; do
      [ -e "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
    done
    ;;
  *) echo "usage: lab_forkservers.sh start HOSTS | stop" >&2; exit 2 ;;
esac
