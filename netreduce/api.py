"""The module-level API: one default communicator per process."""
from __future__ import annotations

import atexit

import numpy as np

from flowctl.plan import FlowConfig
from netreduce.comm import Communicator, CommunicatorError
from ring_setup.rendezvous import DEFAULT_TIMEOUT

_default: Communicator | None = None


def init(rank: int | None = None, world_size: int | None = None,
         master_addr: str | None = None, master_port: int | None = None, *,
         device: str | None = None, local_addr: str | None = None, mtu: int | None = None,
         msg_size: int | None = None, window: int | None = None, recv_depth: int = 1024,
         stall_timeout: float = 30.0, switch: str | None = None,
         timeout: float = DEFAULT_TIMEOUT) -> Communicator:
    """Create this process's default communicator (see `Communicator.create`); it is
    closed by `finalize()` or at exit. `mtu` (RoCE path MTU, default 4096), `msg_size` (a
    multiple of `mtu`, default 256 KiB) and `window` (messages in flight per connection,
    default 2) are the flow-control knobs; the switch's aggregator pool (256 slots by
    default) must hold 2 x min(`window` x `msg_size`/`mtu`, 129) packets (2 x 128 with the
    defaults; rxe keeps up to 129 PSNs unacknowledged per QP), rounded up to a power of
    two, which its controller checks at registration. With a switch, the "inc" ring's knobs
    left unset are fitted to what the switch's target aggregates (through BMv2: path MTU
    256, and 16 KiB messages so that its 256 slots suffice), and the registration line says
    what was chosen; a knob given here that the target cannot take is an error naming both.
    `switch`: the switch controller's HOST:PORT (None: $NR_CONTROLLER, which the lab sets;
    "": no switch)."""
    global _default
    if _default is not None:
        raise CommunicatorError("netreduce.init: already initialised (netreduce.finalize() "
                                "first)")
    knobs = {k: v for k, v in (("mtu", mtu), ("msg_size", msg_size), ("window", window))
             if v is not None}
    config = FlowConfig(**knobs, recv_depth=recv_depth, stall_timeout=stall_timeout)
    _default = Communicator.create(rank, world_size, master_addr, master_port, device=device,
                                   local_addr=local_addr, config=config,
                                   pinned=frozenset(knobs), switch=switch, timeout=timeout)
    return _default


def get_communicator() -> Communicator:
    if _default is None:
        raise CommunicatorError("netreduce: no communicator: call netreduce.init() first")
    return _default


def allreduce(array: np.ndarray, op: str = "sum", algo: str = "auto",
              out: np.ndarray | None = None) -> np.ndarray:
    """`Communicator.allreduce` on the default communicator."""
    return get_communicator().allreduce(array, op=op, algo=algo, out=out)


@atexit.register
def finalize() -> None:
    """Close the default communicator (collective: every rank waits for the others)."""
    global _default
    if _default is not None:
        comm, _default = _default, None
        comm.close()
