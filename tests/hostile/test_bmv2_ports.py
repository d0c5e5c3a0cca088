"""BMv2's own servers against a host (issue 39): `python -m labswitches.bmv2_lab` in the rig's
switch namespace, whose control link gives that namespace an address the hosts reach
(10.99.0.254, as 10.77.0.254 in the lab). Before, BMv2's Thrift server (the runtime CLI's:
every table and register, other tenants' R_Keys among them) listened there too."""
from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

from tests.hostile.netns import CONTROL_IP, HOSTS_NS, SWITCH_NS, SwitchRig, in_netns
from tests.p4tools import P4_TOOLS, require_tools, unavailable

THRIFT_PORT, GRPC_PORT = 9391, 9659


def connects(ns: str, addr: str, port: int) -> bool:
    """Does a TCP connection from namespace `ns` to addr:port succeed?"""
    def attempt() -> bool:
        with socket.socket() as s:
            s.settimeout(3)
            return s.connect_ex((addr, port)) == 0
    return in_netns(ns, attempt)


def test_bmv2_listens_on_loopback_only(tmp_path: Path) -> None:
    require_tools(*P4_TOOLS)
    if importlib.util.find_spec("p4runtime_sh") is None:
        unavailable("p4runtime-shell missing (pip install 'netreduce[bmv2]')")
    rig = SwitchRig(tmp_path, module="labswitches.bmv2_lab", control_link=True,
                    extra_args=["--thrift-port", str(THRIFT_PORT), "--grpc-port", str(GRPC_PORT)])
    try:
        assert connects(SWITCH_NS, "127.0.0.1", THRIFT_PORT)
        assert connects(SWITCH_NS, "127.0.0.1", GRPC_PORT)
        for port in (THRIFT_PORT, GRPC_PORT):
            assert not connects(HOSTS_NS, CONTROL_IP, port), f"a host reaches BMv2's {port}"
            assert not connects(SWITCH_NS, CONTROL_IP, port)
    finally:
        rig.close()
