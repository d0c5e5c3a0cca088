# lab_aggregators.sh — scripts/lab.sh --aggregators K: K one-armed aggregation servers on the
# hosts' plain L2 network (docs/lab.md, "Aggregators"). Sourced by lab.sh; reads its ROOT, PY,
# LABDIR, SWNS, mtu, aggregators, agg_target and calls its say and lab_switch.sh's wait_ready and
# stop_group (sourced first).
#
# The hosts' ports are joined by a kernel bridge (nrbr in $SWNS, an ordinary L2 network).
# Aggregator J is namespace ${SWNS}aJ with one veth, nraggJ (address 10.77.0.(200+J)/24, MAC
# 02:4e:52:00:01:(J+1), IPv4 forwarding off), whose peer nraggpJ is a bridge port; it runs
# `python -m switch --one-armed --port 1=nraggJ` with its controller on 10.77.0.(200+J):50051
# (the lab's token file, hosts policy and TLS certificate). The hosts route 10.78.J.0/24 via
# it (scripts/setup_rxe.sh --aggregators). With agg_target native (lab.sh's default
# --switch) the aggregator runs on the C data plane (--target native, switch/native/router.h),
# with soft in Python. Pid in $LABDIR/aggJ.pid, log in $LABDIR/aggJ.log.
AGG_BASE=200
agg_ip() { echo "10.77.0.$((AGG_BASE + $1))"; }
agg_ns() { echo "${SWNS}a$1"; }
agg_error=""

aggregators_up() {  # the bridge of the hosts' ports ($@: lab.sh's --port arguments) and K namespaces
  local i j ns
  ip -n "$SWNS" link add nrbr type bridge
  ip -n "$SWNS" link set nrbr mtu "$mtu" up
  for ((i = 1; i < $#; i += 2)); do
    [ "${!i}" = --port ] || continue
    j=$((i + 1)); ip -n "$SWNS" link set "${!j#*=}" master nrbr
  done
  for ((j = 0; j < aggregators; j++)); do
    ns=$(agg_ns "$j")
    ip netns del "$ns" 2>/dev/null || true
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add "nragg$j" type veth peer name "nraggp$j" netns "$SWNS"
    ip -n "$ns" link set "nragg$j" address "$(printf '02:4e:52:00:01:%02x' $((j + 1)))" mtu "$mtu" up
    ip -n "$SWNS" link set "nraggp$j" mtu "$mtu" master nrbr up
    ip -n "$ns" addr add "$(agg_ip "$j")/24" dev "nragg$j"
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=0 "net.ipv4.conf.nragg$j.forwarding=0" \
      net.ipv6.conf.all.disable_ipv6=1
    for d in "nragg$j"; do ip netns exec "$ns" ethtool -K "$d" tx off tso off gso off gro off >/dev/null 2>&1 || true; done
    ip netns exec "$SWNS" ethtool -K "nraggp$j" tx off tso off gso off gro off >/dev/null 2>&1 || true
  done
}

aggregator_start() {  # J: start aggregator J and wait until it is ready; else 1 with $agg_error
  local j=$1 ns pid
  ns=$(agg_ns "$j")
  rm -f "$LABDIR/agg$j.ready"
  echo "---- $(date -u +%T) starting aggregator $j" >> "$LABDIR/agg$j.log"
  setsid ip netns exec "$ns" env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" -m switch --one-armed --port "1=nragg$j" $([ "${agg_target:-soft}" = native ] && echo --target native) \
    --controller "$(agg_ip "$j"):50051" --token-file "$LABDIR/controller.token" \
    --hosts-policy "$LABDIR/hosts.policy" \
    --tls-cert "$LABDIR/controller.pem" --tls-key "$LABDIR/controller.key" \
    --ready-file "$LABDIR/agg$j.ready" --stats-file "$LABDIR/agg$j-stats.json" \
    >>"$LABDIR/agg$j.log" 2>&1 &
  pid=$!
  echo "$pid" > "$LABDIR/agg$j.pid"
  if wait_ready "$pid" "$LABDIR/agg$j.ready" 60; then
    say "aggregator $j up (pid $pid) on $(agg_ip "$j")"; return 0
  elif [ $? = 1 ]; then
    agg_error="aggregator $j exited at start: $(tail -3 "$LABDIR/agg$j.log" | tr '\n' ' ')"
    rm -f "$LABDIR/agg$j.pid"; return 1
  fi
  aggregator_stop "$j"
  agg_error="aggregator $j did not become ready in 60 s (see $LABDIR/agg$j.log)"
  return 1
}

aggregator_stop() { stop_group "$LABDIR/agg$1.pid"; }  # J (lab_switch.sh's stop_group)

aggregators_down() {  # stop every aggregator, print its log, remove its namespace
  local j
  for ((j = 0; j < aggregators; j++)); do
    aggregator_stop "$j"
    if [ -s "$LABDIR/agg$j.log" ]; then sed "s/^/[agg$j] /" "$LABDIR/agg$j.log" >&2; fi
    ip netns del "$(agg_ns "$j")" 2>/dev/null || true
  done
}
