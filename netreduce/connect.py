"""How a communicator is made: the rendezvous, this rank's RDMA device, both rings of RC QPs
and the "inc" ring's registration with the switch (`create`, from arguments or the
environment; `connect`, from a rendezvous and a host already open: the tests' fake fabric
uses it). A rank that fails here tells the others through the rendezvous, and everything it
opened is closed again: no half-made communicator is ever returned."""
from __future__ import annotations

import logging
import os
from dataclasses import replace

from flowctl.plan import FlowConfig
from netreduce.comm import FAILED_LEAVE_TIMEOUT, Communicator
from netreduce.meta import control_bytes
from netreduce.registration import (LEASE_RANKS, Controller, controller_client, fit_inc_ring,
                                    register_inc_ring, switch_address, unregister)
from netreduce.rings import INC_ADDR_ENV, Host, connect_rings, inc_ring_spec
from netreduce.tensors import torch_store_in_use
from ring_setup.device import source_ipv4_towards
from ring_setup.rendezvous import PortExchange, Rendezvous, RendezvousConfig
from ring_setup.store_protocol import DEFAULT_TIMEOUT, RendezvousError

logger = logging.getLogger(__name__)


def create(rank: int | None = None, world_size: int | None = None,
           master_addr: str | None = None, master_port: int | None = None, *,
           device: str | None = None, local_addr: str | None = None,
           inc_addr: str | None = None,
           config: FlowConfig = FlowConfig(), pinned: frozenset[str] = frozenset(),
           switch: str | None = None, timeout: float = DEFAULT_TIMEOUT,
           port_exchange: PortExchange | None = None,
           in_flight: int | None = None) -> Communicator:
    """Rendezvous with the other ranks (arguments, else RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT; when torch owns MASTER_PORT, `torch_store_in_use`, rank 0 serves the
    store on a free port and passes it through torch's store: `netreduce.torch`; or
    through `port_exchange`, see `Rendezvous.join`), open this rank's rxe device
    (`device`, else the one holding `local_addr` as a RoCEv2 GID; `local_addr` defaults to
    the address this host reaches MASTER_ADDR from) and connect both rings. `inc_addr`
    (else $NR_INC_ADDR): another address of the same device for the "inc" ring's QPs (or a
    network: the device's one address in it), e.g. one routed through a one-armed
    aggregator (docs/switch.md); the host ring keeps `local_addr`. `switch` is the switch
    controller's HOST:PORT (None: $NR_CONTROLLER; "" or unset: no switch; rank 0's
    decides): the "inc" ring is fitted to its target (the knobs named in `pinned` were
    set by the user and are never changed) and registered with it; a refusal is an
    error naming the controller. Rank 0 prints one line on stderr saying whether a switch is used.
    A rank that fails on its own tells the others through the rendezvous; `timeout`
    bounds every wait for peers; the controller gets min(10 s, timeout / 2) per call
    (min(30 s, timeout / 2) to register, unregister or read counters: a fabric programs
    several switches), so that a silent controller is reported before the other ranks
    stop waiting. `in_flight`: asynchronous calls in flight (`in_flight_setting`)."""
    from ring_setup.verbs.host import RdmaHost   # pyverbs: only where a real device is opened
    rdzv = RendezvousConfig.resolve(rank, world_size, master_addr, master_port, timeout)
    ip = local_addr or source_ipv4_towards(rdzv.master_addr)
    addr = switch_address(switch)
    if port_exchange is None and master_port is None and torch_store_in_use():
        from netreduce.torch_store import store_port_exchange
        port_exchange = store_port_exchange(rdzv)
    rendezvous = Rendezvous(rdzv).join(port_exchange)
    host: RdmaHost | None = None
    controller: Controller | None = None
    try:
        if rdzv.rank in LEASE_RANKS and addr is not None:
            controller = controller_client(addr, min(10.0, timeout / 2),
                                           min(30.0, timeout / 2), rdzv.rank)
        inc_addr = inc_addr or os.environ.get(INC_ADDR_ENV) or None
        host = RdmaHost(ip, device, config, {"inc": inc_addr} if inc_addr else {})
        comm = connect(rendezvous, host, config, controller, pinned, in_flight)
    except BaseException as exc:
        if not isinstance(exc, RendezvousError):    # the others could not know: tell them
            rendezvous.abort(f"{type(exc).__name__}: {exc}")
        if host is not None:
            host.close()
        if controller is not None:
            controller.close()
        rendezvous.close(timeout=FAILED_LEAVE_TIMEOUT)
        raise
    if comm.rank == 0:
        logger.info("netreduce: %d rank(s); %s", comm.world_size, comm.switch.describe())
    return comm

def connect(rendezvous: Rendezvous, host: Host, config: FlowConfig,
            controller: Controller | None = None,
            pinned: frozenset[str] = frozenset(),
            in_flight: int | None = None) -> Communicator:
    """Build both QP rings with the other ranks: rank 0 fits the "inc" ring's knobs to
    `controller`'s target (`netreduce.registration.fit_inc_ring`; "ring" keeps
    `config` but for the ACK timeout: its packets cross the same switch, at the same
    pace); create the QPs, exchange endpoints through the rendezvous, connect and wait
    until every rank is ready (`netreduce.rings.connect_rings`). Then rank 0 registers
    the "inc" ring with `controller` (if any; on ranks `LEASE_RANKS` other than 0 it
    only renews the lease) and every rank learns the outcome
    (`netreduce.registration.register_inc_ring`). The communicator owns `controller`
    from then on."""
    rank = rendezvous.rank
    fit = fit_inc_ring(rendezvous, config, pinned, controller)
    config = replace(config, ack_timeout=fit.config.ack_timeout)
    control = host.register(control_bytes(rendezvous.world_size))
    endpoints, streams, rings = connect_rings(rendezvous, host,
                                              {"ring": config, "inc": fit.config}, control)
    switch = register_inc_ring(rendezvous, inc_ring_spec(endpoints, fit.config,
                                                         rendezvous.job_key),
                               controller if rank == 0 else None, fit.choice)
    try:
        rendezvous.watch()
    except BaseException:
        if rank == 0 and controller is not None and switch.ring_id is not None:
            unregister(controller, switch.ring_id)
        raise
    return Communicator(rendezvous=rendezvous, host=host, config=config, inc_config=fit.config,
               endpoints=endpoints, streams=streams, control=control, switch=switch,
               controller=controller, rings=rings, in_flight=in_flight)
