"""torch without importing it: what `allreduce` accepts (numpy arrays, and contiguous CPU
torch tensors as views), and whether torch owns the job's MASTER_PORT.

A torch tensor is reduced through `tensor.detach().numpy()`, which shares the tensor's
memory: the result lands in the tensor itself, with no copy beyond what a numpy array costs
(bfloat16, which torch does not hand to numpy: the same memory viewed as int16, then as
ml_dtypes' bfloat16). This module never imports torch: a tensor can only exist once the
caller imported torch, so `sys.modules` tells whether there is any to recognise.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping

import numpy as np

from netreduce.dtypes import BFLOAT16, SUPPORTED_DTYPES


def torch_tensor_type() -> type | None:
    """torch.Tensor if torch is imported in this process, else None."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def is_tensor(obj: Any) -> bool:
    tensor = torch_tensor_type()
    return tensor is not None and isinstance(obj, tensor)


def as_ndarray(obj: Any, what: str = "array") -> np.ndarray:
    """`obj` itself if it is a numpy array; a numpy view sharing the memory of a
    contiguous, strided CPU torch tensor of a supported dtype; else TypeError/ValueError
    naming `what` (the argument) and what is wrong with it."""
    if isinstance(obj, np.ndarray):
        return obj
    if not is_tensor(obj):
        raise TypeError(f"allreduce: expected a numpy array or a CPU torch.Tensor as {what}, got "
                        f"{type(obj).__name__}")
    if obj.device.type != "cpu":
        raise TypeError(f"allreduce: {what} is a tensor on device {obj.device}: netreduce "
                        f"reduces CPU tensors only (copy it with .cpu() and back)")
    if obj.layout is not sys.modules["torch"].strided:
        raise TypeError(f"allreduce: {what} is a {obj.layout} tensor: only dense (strided) "
                        f"tensors are supported")
    if not obj.is_contiguous():
        raise ValueError(f"allreduce: {what} is a non-contiguous tensor (shape "
                         f"{tuple(obj.shape)}, strides {obj.stride()}): reducing it in place "
                         f"needs contiguous memory (.contiguous() makes a copy to reduce)")
    names = {d.name for d in SUPPORTED_DTYPES}
    name = str(obj.dtype).removeprefix("torch.")
    if name not in names:
        raise TypeError(f"allreduce: {what} has dtype {obj.dtype}, which is not supported "
                        f"(supported: {', '.join('torch.' + d.name for d in SUPPORTED_DTYPES)})")
    if name == BFLOAT16.name:
        return obj.detach().view(sys.modules["torch"].int16).numpy().view(BFLOAT16)
    return obj.detach().numpy()


def torch_store_in_use(env: Mapping[str, str] = os.environ) -> bool:
    """Does torch own MASTER_PORT in this job: a torch.distributed process group is
    initialised in this process (its store serves there on rank 0), or torchrun started it
    (TORCHELASTIC_RUN_ID: torchrun's agent serves its store there)?"""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return True
    return "TORCHELASTIC_RUN_ID" in env
