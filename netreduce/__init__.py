"""NetReduce: allreduce for numpy arrays over RDMA (RoCEv2 RC queue pairs), with a host
ring algorithm and, later, in-network aggregation by a switch transparent to RDMA.

    import netreduce
    comm = netreduce.init()                  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    netreduce.allreduce(x)                   # in place, op="sum", algo="ring"
    netreduce.allreduce(x, out=y, algo="auto"); comm.last_algo   # -> "ring"
    netreduce.finalize()

Run one process per lab host with `python -m netreduce.launch --hosts N -- CMD`.
"""
from flowctl.plan import FlowConfig
from flowctl.stream import FlowError
from netreduce.api import allreduce, finalize, get_communicator, init
from netreduce.comm import Communicator, CommunicatorError
from netreduce.meta import AllreduceMismatch
from ring_setup.device import DeviceError
from ring_setup.rendezvous import RendezvousError, RendezvousTimeout

__all__ = ["AllreduceMismatch", "Communicator", "CommunicatorError", "DeviceError",
           "FlowConfig", "FlowError", "RendezvousError", "RendezvousTimeout", "allreduce",
           "finalize", "get_communicator", "init"]
