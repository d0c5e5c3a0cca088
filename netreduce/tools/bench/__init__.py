"""Allreduce throughput in the lab, in the style of SwitchML's allreduce_benchmark.

    scripts/lab.sh --hosts 4 -- netreduce bench --workers 4 --sizes 1M,16M
        --algos switch,ring --json .lab/bench.json --plot .lab/bench.png    (one line)

Run in the lab's root namespace: it launches one worker per host (netreduce.tools.launch). At
every size it measures, in one run through the same switch:
  link    every rank RDMA-WRITEs M bytes to its successor at once over the host "ring" QPs,
          which the switch only forwards: the per-rank rate B, the in-network ceiling
          (time >= M/B; a ring allreduce needs >= 2(n-1)/n * M/B);
  ALGO    allreduce of M bytes with each --algos algorithm (`switch-call`, float32 only:
          the switch with one quantization scale per call, the quantizer before per-block
          scales, so that one run compares the two: ratio switch/per_call),
each --warmup untimed then --jobs timed jobs, every job started by a barrier, timed as the
slowest rank, and verified against numpy. Output: one "Job(s) #i# finished. Duration: #ns#
ns Goodput: #x# Gbps." line per job, Min/Max/Median/Mean/Std dev per size and algorithm,
then a table of algbw = M/median time, busbw = algbw * 2(n-1)/n, and the ratios
switch/ring and switch/link; --json and --plot write them (netreduce.tools.bench.report says the
JSON schema). `--tenants T` runs T such jobs at once on disjoint shares of the hosts, each
under its own principal, and adds each one's share of the aggregate (netreduce.tools.bench.tenants).
Exit code: 0, 1 if a result did not match numpy, 2 on bad options, else the
failing worker's.
"""
