"""One rank of a lab PyTorch test, run by `python -m netreduce.launch` (one per host).

    torch_worker.py nan           a NaN in rank 1's batch: DDP with netreduce's hook vs gloo
    torch_worker.py die --victim R   rank R SIGKILLs itself during backward

Prints "OK ..." lines the tests look for; a failed check exits non-zero with the reason.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import netreduce
import netreduce.torch as nrtorch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_mlp import batch, mlp  # noqa: E402


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
    print(f"OK nan: {len(warned)} warning(s): {warned[0]}", flush=True)


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
        print(f"OK error: {type(exc).__name__}: {exc}", flush=True)
        return
    sys.exit("FAIL die: backward completed although a rank died")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("nan", "die"))
    p.add_argument("--victim", type=int, default=1)
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    comm = netreduce.init()
    if args.what == "nan":
        nan(comm)
        netreduce.finalize()
    else:
        die(comm, args.victim)
        os._exit(0)     # the communicator is broken and gloo's peer is gone: no teardown


if __name__ == "__main__":
    main()
