"""Train a small MLP with DistributedDataParallel: over gloo alone, then with netreduce's
comm hook (in the network, over the host ring, and synchronously), from the same initial
parameters on the same data, and compare losses, parameters and step times.

    scripts/lab.sh --hosts 4 -- netreduce launch \
        --hosts 4 -- python examples/train_mlp.py --steps 300

(or under torchrun: `torchrun --nnodes 4 --nproc-per-node 1 ... examples/train_mlp.py`).
Data: synthetic (no download): 64 features, 10 classes given by a fixed random linear
teacher; rank r draws its own batches from (seed, rank, step). Modes (`--modes`):
  gloo        DDP's own allreduce over the gloo process group (the reference)
  switch      netreduce.torch.allreduce_hook, algo="auto" (in the network when the ring is
              registered with a switch)
  ring        the same hook, algo="ring" (the host ring over RDMA)
  switch-sync allreduce_hook_sync: the same reduction, done before the hook returns
  nocomm      a hook that returns the local gradient (no communication: compute time)
  backend     no hook: DDP over a `dist.new_group(backend="netreduce")` process group
              (netreduce.torch.ProcessGroupNetreduce; not in the default modes)
  gloo-bf16   DDP over gloo with torch's own bf16_compress_hook: buckets rounded to
              bfloat16 before the reduction (not in the default modes)
  switch-bf16 netreduce.torch.bf16_allreduce_hook, algo="auto": the same numerics, reduced
              by netreduce (not in the default modes)
The modes run interleaved (step s of every mode, then step s + 1), so that step times
compare within one run. Rank 0 prints the loss every `--log-every` steps and a summary: median step time per mode,
max |loss - gloo's loss| over all steps and ranks, max |parameter - gloo's| at the end (the
bf16 modes also against gloo-bf16, when it ran), and
how much of the communication the asynchronous hook hides:
(sync - async) / (sync - nocomm). `--max-param-diff D` exits 1 if a netreduce mode ends
more than D from gloo's parameters (lab tests).
"""
import argparse
import statistics
import sys
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import netreduce
import netreduce.torch as nrtorch

FEATURES, CLASSES = 64, 10
MODES = ("gloo", "switch", "ring", "switch-sync", "nocomm")
EXTRA_MODES = ("backend", "gloo-bf16", "switch-bf16")
BF16_REFERENCE = "gloo-bf16"     # what the bf16 modes are also compared with


def mlp(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, CLASSES))


def batch(seed: int, rank: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    teacher = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(hash((seed, rank, step)) & 0x7FFFFFFF)
    x = torch.randn(size, FEATURES, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def local_hook(state: None, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """No communication: each rank keeps its own gradient (annotations as DDP checks them)."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def gloo_bf16_hook(state, bucket):  # type: ignore[no-untyped-def]
    """torch's own bf16_compress_hook over the default (gloo) group, under another name:
    DDP refuses a hook named bf16_compress_hook unless torch has CUDA and NCCL (it checks
    the hook's __name__), although gloo reduces bfloat16."""
    return default_hooks.bf16_compress_hook(state, bucket)


def hook_for(mode: str, comm: netreduce.Communicator) -> tuple[Any, Any] | None:
    return {"gloo": None,
            "switch": (nrtorch.HookState(comm, "auto"), nrtorch.allreduce_hook),
            "ring": (nrtorch.HookState(comm, "ring"), nrtorch.allreduce_hook),
            "switch-sync": (nrtorch.HookState(comm, "auto"), nrtorch.allreduce_hook_sync),
            "nocomm": (None, local_hook),
            "gloo-bf16": (None, gloo_bf16_hook),
            "switch-bf16": (nrtorch.HookState(comm, "auto"), nrtorch.bf16_allreduce_hook)}[mode]


class Run:
    """One mode's DDP model, optimiser and record; every mode starts from the same parameters
    (seed) and sees the same batches, so any difference between modes is the reduction's."""

    def __init__(self, mode: str, comm: netreduce.Communicator, args: argparse.Namespace):
        torch.manual_seed(args.seed)
        self.mode, self.comm, self.args = mode, comm, args
        self.group = dist.new_group(backend="netreduce") if mode == "backend" else None
        self.model = DistributedDataParallel(mlp(args.hidden), bucket_cap_mb=args.bucket_cap_mb,
                                             process_group=self.group)
        hook = None if mode == "backend" else hook_for(mode, comm)
        if hook is not None:
            self.model.register_comm_hook(*hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        self.losses: list[float] = []
        self.times: list[float] = []      # s per step

    def step(self, step: int) -> None:
        x, y = batch(self.args.seed, self.comm.rank, step, self.args.batch)
        t0 = time.perf_counter()
        self.opt.zero_grad()
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.times.append(time.perf_counter() - t0)
        self.losses.append(loss.item())
        if self.comm.rank == 0 and (step % self.args.log_every == 0
                                    or step == self.args.steps - 1):
            print(f"{self.mode:11s} step {step:4d} loss {self.losses[-1]:.6f} "
                  f"{self.times[-1] * 1e3:8.1f} ms/step ({ran(self.mode, self.comm, self.group)})",
                  flush=True)

    def params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model.module.parameters()])


def train(modes: list[str], comm: netreduce.Communicator, args: argparse.Namespace,
          before: Callable[[int], None] | None = None
          ) -> dict[str, tuple[list[float], list[float], torch.Tensor]]:
    """`args.steps` SGD steps per mode, interleaved: step s of every mode, then step s + 1,
    so a slow patch of the lab slows every mode alike and step times compare within a run
    (`before(s)` runs first, if given). Per mode: (losses, step times in s, final
    parameters)."""
    runs = [Run(mode, comm, args) for mode in modes]
    dist.barrier()
    for step in range(args.steps):
        if before is not None:
            before(step)
        for run in runs:
            run.step(step)
    return {run.mode: (run.losses, run.times, run.params()) for run in runs}


def ran(mode: str, comm: netreduce.Communicator, group: Any) -> str:
    """What reduced the last bucket."""
    if mode == "backend":
        return f"backend: {getattr(group, 'comm', comm).last_algo}"
    return {"gloo": "gloo", "gloo-bf16": "gloo", "nocomm": "none"}.get(mode,
                                                                       str(comm.last_algo))


def differences(run: tuple[list[float], list[float], torch.Tensor],
                reference: tuple[list[float], list[float], torch.Tensor]) -> tuple[float, float]:
    """(max |loss - reference's| over all steps and ranks, max |parameter - reference's| at
    the end over all ranks) of two modes' results (collective: every rank calls it)."""
    losses, _, params = run
    ref_losses, _, ref_params = reference
    return (global_max(max(abs(a - b) for a, b in zip(losses, ref_losses))),
            global_max(float((params - ref_params).abs().max())))


def global_max(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--bucket-cap-mb", type=float, default=0.1,
                   help="DDP's bucket size (small: several buckets to overlap)")
    p.add_argument("--in-flight", type=int, default=None, metavar="K",
                   help="the hooks' buckets in flight (netreduce.init(in_flight=K); default "
                        "$NR_IN_FLIGHT, else 1: each bucket's call after the previous one's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-param-diff", type=float, default=None)
    args = p.parse_args()
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES + EXTRA_MODES):
        p.error(f"unknown mode(s) {sorted(unknown)}: choose from "
                f"{', '.join(MODES + EXTRA_MODES)}")

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    netreduce.log_to_stderr()
    comm = netreduce.init(in_flight=args.in_flight)  # its store's port via torch's store
    results = train(modes, comm, args)
    failed = False
    if "gloo" in results:
        if comm.rank == 0:
            print(f"summary over {comm.world_size} ranks, {args.steps} steps "
                  f"(step times: median after the first 5 steps):", flush=True)
        for mode, (losses, times, params) in results.items():
            loss_diff, param_diff = differences(results[mode], results["gloo"])
            median = statistics.median(times[5:] or times)
            line = (f"  {mode:11s} {median * 1e3:8.1f} ms/step  final loss {losses[-1]:.6f}  "
                    f"max |loss - gloo| {loss_diff:.3g}  max |param - gloo| {param_diff:.3g}")
            if mode.endswith("-bf16") and mode != BF16_REFERENCE and BF16_REFERENCE in results:
                loss_bf16, param_bf16 = differences(results[mode], results[BF16_REFERENCE])
                line += (f"  max |loss - {BF16_REFERENCE}| {loss_bf16:.3g}  "
                         f"max |param - {BF16_REFERENCE}| {param_bf16:.3g}")
            if comm.rank == 0:
                print(line, flush=True)
            if mode not in ("gloo", "nocomm", "gloo-bf16") and args.max_param_diff is not None \
                    and param_diff > args.max_param_diff:
                print(f"FAIL {mode}: parameters {param_diff:.3g} from gloo's "
                      f"(> {args.max_param_diff:g})", flush=True)
                failed = True
    if comm.rank == 0 and {"switch", "switch-sync", "nocomm"} <= set(results):
        step = {m: statistics.median(results[m][1][5:] or results[m][1])
                for m in ("switch", "switch-sync", "nocomm")}
        comm_time = step["switch-sync"] - step["nocomm"]
        hidden = (step["switch-sync"] - step["switch"]) / comm_time if comm_time > 0 else 0.0
        print(f"async hook hides {hidden:.0%} of the communication time "
              f"(sync {step['switch-sync'] * 1e3:.1f}, async {step['switch'] * 1e3:.1f}, "
              f"no communication {step['nocomm'] * 1e3:.1f} ms/step)", flush=True)
    if comm.rank == 0 and not failed:
        print("OK train_mlp", flush=True)
    netreduce.finalize()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
