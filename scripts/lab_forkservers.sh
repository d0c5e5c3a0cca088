#!/usr/bin/env bash
# lab_forkservers.sh start HOSTS | stop — the lab's fork server (netreduce.tools.forkserver):
# one process for every host, with numpy, pyverbs and grpc imported once, listening on
# $NR_FORKSERVERS/hosts.sock (a directory only root may enter) and linked there as hI.sock,
# where `netreduce launch` looks for host hI's. It runs in the VM's own network namespace
# with --enter-netns: each command it forks enters its host's namespace as `ip netns exec`
# does (a warm rank starts in well under a second where a cold one imports for ~12 s under
# TCG). One server, not one per host: each preload costs ~12 s of emulated CPU, and a
# server outside the hosts' namespaces outlives `setup_rxe.sh down` / `up` (it opens a
# host's namespace per command). `start` returns once it listens (bounded: 600 s), printing
# how long that took; `stop` ends it. Run by scripts/lab.sh's command side (VM or native)
# with $LABDIR/env sourced; its log is $NR_FORKSERVERS/hosts.log. $NR_LAB_PRELOAD
# (lab.sh --preload) names more modules it imports (e.g. torch).
set -euo pipefail
: "${NR_FORKSERVERS:?lab_forkservers.sh: NR_FORKSERVERS is not set (scripts/lab.sh sets it)}"
say() { echo "[lab-forkservers] $*" >&2; }
case "${1:-}" in
  start)
    hosts=$2
    rm -rf "$NR_FORKSERVERS"
    mkdir -m 700 -p "$NR_FORKSERVERS"
    t0=$(date +%s)
    setsid python -m netreduce.tools.forkserver "$NR_FORKSERVERS/hosts.sock" --enter-netns \
      --also "${NR_LAB_PRELOAD:-}" > "$NR_FORKSERVERS/hosts.log" 2>&1 < /dev/null &
    echo $! > "$NR_FORKSERVERS/hosts.pid"
    until [ -S "$NR_FORKSERVERS/hosts.sock" ]; do
      if ! kill -0 "$(cat "$NR_FORKSERVERS/hosts.pid")" 2>/dev/null; then
        say "error: the fork server died:"; sed 's/^/  /' "$NR_FORKSERVERS/hosts.log" >&2; exit 1
      fi
      (( $(date +%s) - t0 < 600 )) || { say "error: the fork server did not listen within 600 s"; exit 1; }
      sleep 0.5
    done
    for ((i = 0; i < hosts; i++)); do ln -s hosts.sock "$NR_FORKSERVERS/h$i.sock"; done
    say "a fork server for $hosts hosts listening in $(( $(date +%s) - t0 )) s ($NR_FORKSERVERS)"
    ;;
  stop)
    [ -e "$NR_FORKSERVERS/hosts.pid" ] && kill "$(cat "$NR_FORKSERVERS/hosts.pid")" 2>/dev/null || true
    ;;
  *) echo "usage: lab_forkservers.sh start HOSTS | stop" >&2; exit 2 ;;
esac
