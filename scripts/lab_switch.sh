# lab_switch.sh — scripts/lab.sh's switch: compile its P4 programs, start it, wait until it
# is ready, stop it, and serve the hosts' side's restarts. Sourced by lab.sh (and by
# tests/test_lab_switch.py, with stubs); it reads lab.sh's ROOT, PY, LABDIR, SWNS, hosts,
# ports, CTL_IP, CTL_PORT and switch, and calls its say.
#
# The switch (soft: python -m switch; native: python -m switch --target native; bmv2: python -m labswitches.bmv2_lab) runs in a session of its
# own (its pid is its process group: stopping it also ends simple_switch_grpc); its pid is in
# $LABDIR/switch.pid, its kind in $LABDIR/switch.kind. The supervisor lets the hosts' side
# restart it (tests/lab/labswitch.py): the guest writes "ID KIND" to $LABDIR/switch.request;
# the supervisor stops the switch, starts KIND on the same ports with the same controller
# address and token (fresh state) and, once it is ready, answers "ID ok KIND PID" in
# $LABDIR/switch.reply, or "ID error WHY" (both files are replaced by a rename).
# A BMv2 switch needs switch/p4 compiled, which p4c takes minutes for on a fresh clone
# (tor.p4 ~4 min here, then spine.p4): p4_build compiles what the kind runs before its
# readiness clock starts, showing p4c's progress, and later starts find build/p4* fresh
# (switch/p4/program.py: inputs digest, one compile per build directory at a time).
SWITCH_START_TIMEOUT=300    # s from the switch's start to its ready file (compiles before)
switch_error=""
p4_build() {  # PROGRAM... (switch, spine, tor): compile them for BMv2; else 1 with $switch_error
  local program flag
  for program in "$@"; do
    case $program in switch) flag=() ;; spine) flag=(--spine) ;; tor) flag=(--tor) ;; esac
    if ! env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m switch.p4.program \
         "${flag[@]}" --progress 2> >(sed -u 's/^/[lab] /' >&2) >/dev/null; then
      switch_error="p4c could not compile switch/p4 for the $program (build/p4*/p4c.log)"
      return 1
    fi
  done
}
switch_start() {  # KIND: start it and wait until it is ready; else 1 with $switch_error set
  local kind=$1 module extra=() programs=() pid
  case $kind in
    soft) module=switch ;;
    native) module=switch extra=(--target native) ;;  # the C data plane (switch/native), same ports
    bmv2) module=labswitches.bmv2_lab extra=(--bmv2-log "$LABDIR/bmv2.log") programs=(switch) ;;  # rings: RoCE path MTU 256
    racks:*)   # racks:R[:PCT[:SPINE[:TORS]]]: the two-tier fabric, PCT % loss on its
               # ToR-spine links, the spine and the ToRs soft (default) or bmv2 (spine.p4, tor.p4)
      local r loss spine tors
      IFS=: read -r r loss spine tors <<< "${kind#racks:}"
      loss=${loss:-0} spine=${spine:-soft} tors=${tors:-soft}
      if ! [[ $r =~ ^[0-9]+$ && $r -ge 2 && $r -le $hosts && $loss =~ ^[0-9]+(\.[0-9]+)?$ \
              && $spine =~ ^(soft|bmv2)$ && $tors =~ ^(soft|bmv2)$ ]]; then
        switch_error="switch kind '$kind': racks:R[:PCT[:soft|bmv2[:soft|bmv2]]] with R in 2..$hosts"; return 1
      fi
      module=labswitches.fabric_lab
      extra=(--racks "$r" --link-loss "$loss" --spine-target "$spine" --tor-target "$tors"
             --spine-port "$((hosts + 1))" --workdir "$LABDIR")
      if [ "$tors" = bmv2 ]; then programs+=(tor); fi
      if [ "$spine" = bmv2 ]; then programs+=(spine); fi ;;
    *) switch_error="unknown switch kind '$kind' (soft, native, bmv2 or racks:R[:PCT[:SPINE[:TORS]]])"; return 1 ;;
  esac
  p4_build "${programs[@]}" || { switch_error="the $kind switch: $switch_error"; return 1; }
  rm -f "$LABDIR/switch.ready"
  echo "---- $(date -u +%T) starting the $kind switch" >> "$LABDIR/switch.log"
  # labswitches/ is not an installed package: python -m labswitches.NAME finds it through the root
  setsid ip netns exec "$SWNS" env PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" -m "$module" "${ports[@]}" "${extra[@]}" \
    --controller "$CTL_IP:$CTL_PORT" --token-file "$LABDIR/controller.token" \
    --hosts-policy "$LABDIR/hosts.policy" \
    --tls-cert "$LABDIR/controller.pem" --tls-key "$LABDIR/controller.key" \
    --ready-file "$LABDIR/switch.ready" --stats-file "$LABDIR/switch-stats.json" \
    >>"$LABDIR/switch.log" 2>&1 &
  pid=$!
  echo "$pid" > "$LABDIR/switch.pid"
  echo "$kind" > "$LABDIR/switch.kind"
  if wait_ready "$pid" "$LABDIR/switch.ready" "$SWITCH_START_TIMEOUT"; then
    say "switch $kind up (pid $pid): ${ports[*]}"; return 0
  elif [ $? = 1 ]; then
    switch_error="the $kind switch exited at start: $(tail -3 "$LABDIR/switch.log" | tr '\n' ' ')"
    rm -f "$LABDIR/switch.pid"; return 1
  fi
  switch_stop
  switch_error="the $kind switch did not become ready in $SWITCH_START_TIMEOUT s (see $LABDIR/switch.log)"
  return 1
}
wait_ready() {  # PID FILE SECONDS: 0 once FILE exists, 1 if PID exited first, 2 after SECONDS
  local _
  for _ in $(seq $(($3 * 10))); do
    [ -f "$2" ] && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.1
  done
  return 2
}
stop_group() {  # PIDFILE: TERM its process (it writes its counters), up to 10 s, then KILL its group
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$1"
}
switch_stop() { stop_group "$LABDIR/switch.pid"; }
switch_supervise() {  # serves $LABDIR/switch.request until TERM
  trap - EXIT
  trap 'exit 0' TERM INT
  local id kind reply
  while :; do
    if [ -f "$LABDIR/switch.request" ]; then
      read -r id kind < "$LABDIR/switch.request" || true
      rm -f "$LABDIR/switch.request"
      say "switch: restart as '$kind' asked by the hosts' side (request $id)"
      if [[ $kind == agg:* ]]; then
        local j=${kind#agg:}
        if [[ $j =~ ^[0-9]$ ]] && [ "$j" -lt "${aggregators:-0}" ]; then
          aggregator_stop "$j"
          if aggregator_start "$j"; then reply="$id ok $kind $(cat "$LABDIR/agg$j.pid")"
          else reply="$id error $agg_error"; fi
        else
          reply="$id error no aggregator '$j' in this lab (--aggregators ${aggregators:-0})"
        fi
      elif [ "$switch" = bridge ] || [ "$switch" = aggregators ]; then
        reply="$id error the lab runs --switch $switch: no switch process to restart"
      else
        switch_stop
        if switch_start "$kind"; then reply="$id ok $kind $(cat "$LABDIR/switch.pid")"
        else reply="$id error $switch_error"; fi
      fi
      echo "$reply" > "$LABDIR/switch.reply.tmp"
      mv -f "$LABDIR/switch.reply.tmp" "$LABDIR/switch.reply"
    fi
    sleep 0.2
  done
}
