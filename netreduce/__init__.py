"""NetReduce: allreduce for numpy arrays and CPU torch tensors over RDMA (RoCEv2 RC queue pairs): in-network
aggregation by a switch transparent to RDMA, or a host ring.

    import netreduce
    comm = netreduce.init()          # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; switch at
                                     # $NR_CONTROLLER (or init(switch="HOST:PORT"))
    netreduce.allreduce(x)           # in place, op="sum", algo="auto"
    comm.last_algo                   # "switch" when the ring is registered with one, or "ring"
    netreduce.allreduce(x, out=y, algo="ring")
    work = netreduce.allreduce(t, async_op=True); work.wait()   # t: a CPU torch.Tensor
    netreduce.finalize()

PyTorch (DDP comm hook, torchrun, the torch.distributed backend): `netreduce.torch`.

Run one process per lab host with `python -m netreduce.tools.launch --hosts N -- CMD`.
`netreduce.__version__` is the installed distribution's (nr_contract.distribution).
The library only logs, to the "netreduce" logger, which has a NullHandler (the library
convention): a program that configures no logging sees nothing of it, one that does sees
it through its own handlers; `netreduce.log_to_stderr()` shows it on stderr.
"""
import logging

from flowctl.plan import FlowConfig
from flowctl.stream import FlowError
from netreduce.algorithms.switch import AllreduceOverflow, NotQuantizable
from netreduce.api import allreduce, finalize, get_communicator, init, log_to_stderr
from netreduce.comm import Communicator
from netreduce.errors import CommunicatorError, PeerFailure, SwitchFailure, TransportFault
from netreduce.meta import AllreduceMismatch, CallRejected
from netreduce.progress import Work
from netreduce.registration import SwitchRegistrationError, SwitchStatus
from netreduce.routing import SwitchUnavailable
from netreduce.shards import ShardedCommunicator
from nr_contract.distribution import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())
from ring_setup.device import DeviceError
from ring_setup.store_protocol import RendezvousError, RendezvousTimeout

__all__ = ["AllreduceMismatch", "AllreduceOverflow", "CallRejected", "Communicator",
           "CommunicatorError", "DeviceError", "FlowConfig", "FlowError", "NotQuantizable",
           "PeerFailure", "RendezvousError", "RendezvousTimeout", "ShardedCommunicator",
           "SwitchFailure",
           "SwitchRegistrationError", "SwitchStatus", "SwitchUnavailable", "TransportFault", "Work",
           "__version__", "allreduce", "finalize", "get_communicator", "init", "log_to_stderr"]
