"""Allreduce throughput in the lab, in the style of SwitchML's allreduce_benchmark.

    scripts/lab.sh --hosts 4 -- netreduce bench --workers 4 --sizes 1M,16M
        --algos switch,ring --json .lab/bench.json --plot .lab/bench.png    (one line)
    scripts/lab.sh --hosts 4 -- netreduce bench --sweep --json .lab/sweep.json   (latency)

Run in the lab's root namespace: it launches one worker per host (netreduce.tools.launch). At
every size it measures, in one run through the same switch:
  link    every rank RDMA-WRITEs M bytes to its successor at once over the host "ring" QPs,
          which the switch only forwards: the per-rank rate B, the in-network ceiling
          (time >= M/B; a ring allreduce needs >= 2(n-1)/n * M/B);
  ALGO    allreduce of M bytes with each --algos algorithm (`switch-call`, float32 only:
          the switch with one quantization scale per call, the quantizer before per-block
          scales, so that one run compares the two: ratio switch/per_call),
  rtt     (--rtt) the lab's RC round trip: ranks 0 and 1 ping-pong an 8-byte RDMA WRITE
          WITH IMMEDIATE on a QP pair of their own, through the switch (which forwards it);
          whatever M, it is the unit small calls are judged in,
each --warmup untimed then --jobs timed jobs, every job started by a barrier, timed as the
slowest rank, and verified against numpy. A job makes --iters calls back to back and counts
its time per call ("auto": up to 16 calls at small sizes, ~256 KiB per job; the rtt column
at least 8 round trips). Output: one "Job(s) #i# finished. Duration: #ns# ns Goodput: #x#
Gbps." line per job (time per call), Min/Max/Median/Mean/Std dev per size and algorithm,
a table of algbw = M/median time per call, busbw = algbw * 2(n-1)/n (Gbit/s), and the
ratios switch/ring and switch/link, then, nccl-tests style, per size the count, type and
redop, every column's time per call in us with algbw and busbw in GB/s (Gbit/s / 8) and
#wrong (elements outside the algorithm's bound, all ranks and jobs), the round trip and
each algorithm's time in round trips; --json and --plot write them
(netreduce.tools.bench.results says the JSON schema; the plot has algbw and time per call
against size). `--sweep` is the latency sweep: sizes 4 B .. 16 MiB by
powers of 4 (unless --sizes says otherwise; sizes also take MIN:MAX:FACTOR ranges as
nccl-tests' -b/-e/-f), --iters auto and --rtt. `--tenants T` runs T such jobs at once on
disjoint shares of the hosts, each under its own principal, and adds each one's share of
the aggregate (netreduce.tools.bench.tenants). `--in-flight K` keeps K asynchronous calls
outstanding in every allreduce job (nccl-tests' aggregated iterations; --iters 8 K): the
times are then the stream's per call and each result adds a call's mean latency
(tests/rcmodel/inflight.py gives the same curves in the RC model).
Exit code: 0, 1 if a result did not match numpy, 2 on bad options, else the
failing worker's.
"""
