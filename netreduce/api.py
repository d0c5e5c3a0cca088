"""The module-level API: one default communicator per process.

While it lives, SIGTERM exits through `finalize()` like an exception does: the communicator
tells the others and rank 0 unregisters its ring at once, instead of the process vanishing
with the ring registered. `init` installs that handler only when the process left SIGTERM at
its default action and `init(exit_on_sigterm=False)` was not asked: a program's own handler
always wins.
"""
from __future__ import annotations

import atexit
import logging
import signal
import sys
import threading
from typing import Any

from flowctl.plan import FlowConfig
from netreduce.comm import Communicator, CommunicatorError
from netreduce.shards import ShardedCommunicator, create_communicator
from ring_setup.store_protocol import DEFAULT_TIMEOUT

_default: Communicator | ShardedCommunicator | None = None
_sigterm_installed = False
logger = logging.getLogger(__name__)


def log_to_stderr(level: int = logging.INFO) -> None:
    """Show the library's log (the "netreduce" logger: rank 0's registration line, warnings)
    on stderr, one message per line as it is, at `level` and above. The library itself only
    logs (a program that configures logging its own way need not call this); its tools
    (demo, bench, launcher's workers) call it; from then on the "netreduce" records go to this
    handler only, not also to the root logger's. Idempotent."""
    root = logging.getLogger("netreduce")
    root.setLevel(level)
    root.propagate = False      # once: a root handler someone else installed would repeat it
    if not any(getattr(h, "_netreduce_stderr", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._netreduce_stderr = True     # type: ignore[attr-defined]
        root.addHandler(handler)


def init(rank: int | None = None, world_size: int | None = None,
         master_addr: str | None = None, master_port: int | None = None, *,
         device: str | None = None, local_addr: str | None = None,
         inc_addr: str | None = None, mtu: int | None = None,
         msg_size: int | None = None, window: int | None = None,
         ack_timeout: int | None = None, retry_cnt: int | None = None, recv_depth: int = 1024,
         collective_timeout: float = 1800.0, switch: str | None = None,
         timeout: float = DEFAULT_TIMEOUT, exit_on_sigterm: bool = True,
         in_flight: int | None = None) -> Communicator | ShardedCommunicator:
    """Create this process's default communicator (see `netreduce.connect.create`); it is
    closed by `finalize()` or at exit. `mtu` (RoCE path MTU, default 4096), `msg_size` (a
    multiple of `mtu`, default 256 KiB) and `window` (messages in flight per connection,
    default 2) are the flow-control knobs, `ack_timeout` the QPs' local ACK timeout
    exponent (4.096 us x 2^ack_timeout, default 14 = 67 ms: rxe's retransmit timer) and
    `retry_cnt` its RC retry budget (0..7, default $NR_RETRY_CNT, else 6; a link dark
    longer than (retry_cnt + 1) ACK timeouts fails the QPs: docs/roce.md); the
    switch's aggregator pool (256 slots by default) must hold 2 x min(`window` x `msg_size`/`mtu`, 129) packets (2 x 128 with the
    defaults; rxe keeps up to 129 PSNs unacknowledged per QP), rounded up to a power of
    two, which its controller checks at registration. With a switch, the "inc" ring's knobs
    left unset are fitted to what the switch's target aggregates (through BMv2: path MTU
    256, 4 KiB messages and a 1.07 s ACK timeout: its pace), and the registration line says
    what was chosen; a knob given here that the target cannot take is an error naming both.
    `inc_addr` (else $NR_INC_ADDR): the "inc" ring's own address on this device, or a
    network naming this device's one address in it (10.78.0.0/24: one setting for every
    rank), e.g. one routed through a one-armed aggregator (docs/switch.md; the host ring keeps `local_addr`).
    `switch`: the switch controller's HOST:PORT (None: $NR_CONTROLLER, which the lab sets;
    "": no switch). `collective_timeout`: how long a call waits without any progress while
    every peer is alive (default 30 min, as torch.distributed's default process-group
    timeout); a dead or failed peer is reported within about a second whatever this is.
    `timeout`: every wait for peers during setup. `exit_on_sigterm`: turn SIGTERM into
    SystemExit(143) while the communicator lives, if SIGTERM has its default action (see the
    module doc; False leaves SIGTERM alone). `in_flight` (else $NR_IN_FLIGHT, else 1): the
    asynchronous calls kept in flight, alike on every rank (docs/reliability.md)."""
    global _default
    if _default is not None:
        raise CommunicatorError("netreduce.init: already initialised (netreduce.finalize() "
                                "first)")
    knobs = {k: v for k, v in (("mtu", mtu), ("msg_size", msg_size), ("window", window),
                               ("ack_timeout", ack_timeout)) if v is not None}
    config = FlowConfig(**knobs, recv_depth=recv_depth, collective_timeout=collective_timeout,
                        **({} if retry_cnt is None else {"retry_cnt": retry_cnt}))
    common = dict(device=device, local_addr=local_addr, config=config,
                  pinned=frozenset(knobs), timeout=timeout, in_flight=in_flight)
    _default = create_communicator(rank, world_size, master_addr, master_port,
                                   inc_addr=inc_addr, switch=switch, **common)
    if exit_on_sigterm:
        _exit_on_sigterm()
    return _default


def _exit_on_sigterm() -> None:
    """SIGTERM -> SystemExit(143) in the main thread (see the module doc), if the process
    left SIGTERM at its default action."""
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)     # a second SIGTERM kills at once
        logger.warning("netreduce: SIGTERM: finalizing")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    _sigterm_installed = True


def get_communicator() -> Communicator | ShardedCommunicator:
    if _default is None:
        raise CommunicatorError("netreduce: no communicator: call netreduce.init() first")
    return _default


def allreduce(array: Any, op: str = "sum", algo: str = "auto", out: Any = None,
              async_op: bool = False) -> Any:
    """`Communicator.allreduce` on the default communicator: numpy arrays or contiguous
    CPU torch tensors, in place; `async_op=True` returns a `netreduce.Work` at once."""
    return get_communicator().allreduce(array, op=op, algo=algo, out=out, async_op=async_op)


@atexit.register
def finalize() -> None:
    """Close the default communicator (collective: every rank waits for the others)."""
    global _default
    if _default is not None:
        comm, _default = _default, None
        comm.close()
