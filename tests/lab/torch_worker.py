"""The lab PyTorch checks, run by the one torch launch of tests/lab/test_torch.py (its ranks
fork from a server that imported torch and torch._dynamo, which DDP needs: minutes of
emulated CPU per import). That launch runs a script composed of the README's DDP snippet
(verbatim: it makes `comm` and a DDP model with netreduce's hook), one step of that model,
then `run(comm, ARGS)`:

    ARGS: [--steps K] [--restart-at S1,S2 [--flap-at S3,S4] [--survive-steps M]] [--victim R]
  1. K steps of examples/train_mlp.py from the same parameters on the same data: DDP with
     netreduce's hook (switch, ring) and over the netreduce process group end within 1e-5
     of DDP over gloo (parameters ~0.1; a wrong contribution would move them ~1e-3; the
     float32 quantization error is ~1e-8 per step);
  2. one step's gradients with the bf16 hook through the switch: bfloat16 values, each
     within the two hooks' roundings of torch's bf16_compress_hook over gloo (element by
     element: stricter than training a few steps with it, and ~3x cheaper in the lab;
     training with both bf16 hooks is examples/train_mlp.py's, docs/torch.md);
  3. a NaN in rank 1's batch: the hook warns and gives gloo's gradients (NaN included);
  4. with --restart-at: M steps of DDP with netreduce's hook beside DDP over gloo while
     rank 0 restarts the lab's switch at those steps, and rank FLAPPER's link is dark for
     FLAP_S s (tc netem 100 % loss: a transport fault) at the --flap-at steps: no
     exception, within 1e-5 of gloo, a fallback per restart, a transport fault per flap;
  5. with --victim R: rank R SIGKILLs itself during backward; the others print the error.

Prints "OK ..." lines (each with the seconds since `run` began) the test looks for; a failed
check exits non-zero with the reason.
"""
from __future__ import annotations

import argparse
import types
import os
import signal
import threading
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import netreduce
import netreduce.torch as nrtorch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_mlp import batch, gloo_bf16_hook, global_max, local_hook, mlp, train  # noqa: E402


STARTED = time.monotonic()     # after the README snippet and its check
FLAPPER = 1                    # the rank whose link flaps (its host's nr0)
FLAP_S = 3.0                   # s dark: 6 retry budgets of the default (7 x 67 ms)


def say(line: str) -> None:
    """An "OK ..." line for the test, with the seconds since the checks began."""
    print(f"{line} [{time.monotonic() - STARTED:.0f} s]", flush=True)


def grads_after_one_step(comm: netreduce.Communicator, hook: bool, poison: bool
                         ) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp(64), bucket_cap_mb=0.01)
    if hook:
        model.register_comm_hook(nrtorch.HookState(comm), nrtorch.allreduce_hook)
    x, y = batch(0, comm.rank, 0, 16)
    if poison and comm.rank == 1:
        x[3, 7] = float("nan")
    nn.CrossEntropyLoss()(model(x), y).backward()
    return [p.grad.clone() for p in model.module.parameters()]


def one_step(comm: netreduce.Communicator, hook: object, state: object) -> list[torch.Tensor]:
    """Gradients after one backward pass of DDP with `hook` (and its `state`)."""
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp(64), bucket_cap_mb=0.01)
    model.register_comm_hook(state, hook)
    x, y = batch(0, comm.rank, 0, 16)
    nn.CrossEntropyLoss()(model(x), y).backward()
    return [p.grad.clone() for p in model.module.parameters()]


def bf16_gradients(comm: netreduce.Communicator) -> None:
    """netreduce's bf16 hook through the switch against torch's bf16_compress_hook over
    gloo, element by element. With b_r each rank's gradient rounded to bfloat16 and
    A = sum |b_r| / n: gloo's n - 1 additions in bfloat16 (each rank's b_r / n is exact for
    n = 4) each round by at most u * A (u = 2^-8, bfloat16's unit roundoff), netreduce's one
    rounding of the average by u * A plus the switch's quantization, below 2^-29 of the
    largest |b_r| <= n * A, and the float32 step of its rounding: so
    |ours - torch's| <= n * u * A + 2^-22 * max(A) (the second term with room to spare)."""
    start = time.monotonic()
    local = one_step(comm, local_hook, None)
    theirs = one_step(comm, gloo_bf16_hook, None)
    ours = one_step(comm, nrtorch.bf16_allreduce_hook, nrtorch.HookState(comm))
    if comm.last_algo != "switch":
        sys.exit(f"FAIL bf16: the bf16 hook ran {comm.last_algo}, not the switch")
    worst = 0.0
    for g, o, t in zip(local, ours, theirs):
        mean_abs = g.bfloat16().float().abs()
        dist.all_reduce(mean_abs)
        mean_abs /= comm.world_size
        if not torch.equal(o.bfloat16().float(), o):
            sys.exit("FAIL bf16: the bf16 hook's gradients are not bfloat16 values")
        bound = comm.world_size * 2.0**-8 * mean_abs + 2.0**-22 * float(mean_abs.max())
        if not torch.all((o - t).abs() <= bound):
            sys.exit(f"FAIL bf16: gradients {float((o - t).abs().max()):.3g} from torch's "
                     f"bf16_compress_hook over gloo, beyond the roundings' bound")
        worst = max(worst, float(((o - t).abs() / mean_abs.clamp_min(1e-30)).max()))
    say(f"OK bf16 gradients: switch, within the bound of torch's bf16_compress_hook over "
        f"gloo (largest difference {worst:.3g} of the mean |gradient|; "
        f"{time.monotonic() - start:.1f} s)")


def nan(comm: netreduce.Communicator) -> None:
    want = grads_after_one_step(comm, hook=False, poison=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = grads_after_one_step(comm, hook=True, poison=True)
    warned = [str(w.message) for w in caught if w.category is nrtorch.NonFiniteGradientWarning]
    if not warned:
        sys.exit("FAIL nan: no NonFiniteGradientWarning")
    for g, w in zip(got, want):
        if not torch.equal(g.isnan(), w.isnan()):
            sys.exit("FAIL nan: NaN positions differ from gloo's")
        if not torch.allclose(g[~g.isnan()], w[~w.isnan()], rtol=1e-5, atol=1e-7):
            sys.exit("FAIL nan: finite gradients differ from gloo's")
    clean = grads_after_one_step(comm, hook=True, poison=False)
    if comm.last_algo != "switch" or not all(bool(g.isfinite().all()) for g in clean):
        sys.exit(f"FAIL nan: the next clean step ran {comm.last_algo}")
    say(f"OK nan: {len(warned)} warning(s): {warned[0]}")


def die(comm: netreduce.Communicator, victim: int) -> None:
    torch.manual_seed(0)
    model = DistributedDataParallel(mlp(64), bucket_cap_mb=0.01)
    model.register_comm_hook(None, nrtorch.allreduce_hook)
    first = next(model.module.parameters())
    if comm.rank == victim:
        first.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
    x, y = batch(0, comm.rank, 0, 16)
    try:
        nn.CrossEntropyLoss()(model(x), y).backward()
    except Exception as exc:            # noqa: BLE001 - the message is what is checked
        say(f"OK error: {type(exc).__name__}: {exc}")
        return
    sys.exit("FAIL die: backward completed although a rank died")


def like_gloo(comm: netreduce.Communicator, steps: int) -> None:
    args = types.SimpleNamespace(steps=steps, seed=0, hidden=64, batch=64, lr=0.05,
                                 bucket_cap_mb=0.1, log_every=1)
    results = train(["gloo", "switch", "ring", "backend"], comm, args)
    want = results["gloo"][2]
    for mode in ("switch", "ring", "backend"):
        got = results[mode][2]
        diff = global_max(float((got - want).abs().max()))
        if diff > 1e-5:
            sys.exit(f"FAIL {mode}: parameters {diff:.3g} from gloo's after {steps} steps")
        say(f"OK {mode}: max |param - gloo| {diff:.3g} after {steps} steps")


def started(target: Callable[[], object]) -> threading.Thread:
    """`target` running on a daemon thread of its own."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def flap(seconds: float) -> threading.Thread:
    """This host's link dark for `seconds` from now: every frame it sends dropped (data and
    ACKs). Darkened before it returns (the next step's first frame is lost), lit again by
    the thread it returns."""
    import subprocess
    subprocess.run(["tc", "qdisc", "add", "dev", "nr0", "root", "netem", "loss", "100%"],
                   check=True)

    def light() -> None:
        time.sleep(seconds)
        subprocess.run(["tc", "qdisc", "del", "dev", "nr0", "root"], check=False)
    return started(light)


def survive(comm: netreduce.Communicator, steps: int, restarts: list[int],
            flaps: list[int]) -> None:
    """`steps` steps of DDP with netreduce's hook (algo="auto") next to DDP over gloo, the
    lab's switch restarted (by rank 0, in the background) at each step of `restarts`, rank
    FLAPPER's link dark for FLAP_S s at each step of `flaps`: no exception, the parameters
    within 1e-5 of gloo's, a fallback per restart and a transport fault per flap at least
    (counted from the communicator's stats before the first step)."""
    from tests.lab.labswitch import restart_switch
    running: list[threading.Thread] = []
    before_stats = comm.stats()
    pending = {"restart": sorted(restarts) if comm.rank == 0 else [],
               "flap": sorted(flaps) if comm.rank == FLAPPER else []}
    actions = {"restart": lambda: started(restart_switch), "flap": lambda: flap(FLAP_S)}

    def before(step: int) -> None:
        # a restart (rank 0) at the first step >= the next of its steps at which the job
        # runs through the switch again (one while it is away goes unseen); a flap
        # (FLAPPER) at its step, on whichever ring the job runs
        for what, left in pending.items():
            if left and step >= left[0] and (what == "flap" or comm.last_algo == "switch") \
                    and not any(t.is_alive() for t in running):
                left.pop(0)
                print(f"{what.upper()} at step {step}", flush=True)
                running.append(actions[what]())
    args = types.SimpleNamespace(steps=steps, seed=0, hidden=64, batch=64, lr=0.05,
                                 bucket_cap_mb=0.1, log_every=10)
    # the hook's step first: a flap starts with it, not with gloo's, whose TCP would
    # retransmit past the flap's end (RTO back-off) and keep every rank's step off the link
    # while it is dark (the flap then unseen by the communicator: no fault to count)
    results = train(["switch", "gloo"], comm, args, before)
    for t in running:
        t.join(300)
    diff = global_max(float((results["switch"][2] - results["gloo"][2]).abs().max()))
    stats = comm.stats()
    late = [f"{what} at {left}" for what, left in pending.items() if left]
    if late:
        sys.exit(f"FAIL survive: the switch was not back in time for the {late}")
    fallbacks = stats["switch"]["fallbacks"] - before_stats["switch"]["fallbacks"]
    faults = stats["transport"]["faults"] - before_stats["transport"]["faults"]
    # a restart is a fallback, or a transport fault on "inc" when its QPs failed before
    # a probe heard the switch gone ("inc" then rebuilt at once); a flap is a fault
    if diff > 1e-5 or fallbacks + faults < len(restarts) + len(flaps) or faults < len(flaps):
        sys.exit(f"FAIL survive: parameters {diff:.3g} from gloo's, {fallbacks} fallbacks, "
                 f"{faults} transport faults; stats {stats}")
    say(f"OK survive: max |param - gloo| {diff:.3g} after {steps} steps, "
        f"{sum(results['switch'][1]):.1f} s of steps, {fallbacks} fallbacks, {faults} "
        f"transport faults; stats {stats}")


def run(comm: netreduce.Communicator, argv: list[str]) -> None:
    """Checks 1-5 on `comm` (the README snippet's, over gloo's default process group)."""
    p = argparse.ArgumentParser(prog="torch_worker.run")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--victim", type=int, default=None)
    p.add_argument("--restart-at", default="", help="restart the lab's switch at these steps "
                   "(comma-separated) of a DDP run of --survive-steps steps")
    p.add_argument("--flap-at", default="", help="and rank FLAPPER's link dark for FLAP_S s "
                   "at these steps")
    p.add_argument("--survive-steps", type=int, default=200)
    args = p.parse_args(argv)
    netreduce.log_to_stderr()
    like_gloo(comm, args.steps)
    bf16_gradients(comm)
    nan(comm)
    if args.restart_at:
        survive(comm, args.survive_steps, [int(s) for s in args.restart_at.split(",")],
                [int(s) for s in args.flap_at.split(",") if s])
    if args.victim is None:
        netreduce.finalize()
    else:
        die(comm, args.victim)
        os._exit(0)     # the communicator is broken and gloo's peer is gone: no teardown
