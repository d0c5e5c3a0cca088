"""The BMv2 target without BMv2: RingSpec -> table entries and groups, the Target's
bookkeeping over a fake P4Runtime session, and the clear errors when tools are missing."""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from labswitches import bmv2_lab
from nr_contract.client import ControllerClient
from nr_contract.spec import CONN_COUNTERS, RING_COUNTERS
from switch.control.bmv2 import Bmv2Target, McGroup, ShellSession, TableEntry, plan_ring
from switch.control.bmv2_registers import ThriftRegisters
from switch.control.config import ControllerConfig
from switch.control.service import serve
from switch.control.target import SoftwareTarget
from switch.dataplane.pipeline import AggregationPipeline
from switch.dataplane.ports import format_port_table
from switch.p4 import program as p4program
from switch.p4.program import build_paths, contract
from tests.fake_p4runtime import FakeSession
from tests.processes import free_port
from tests.roce_layers import mac_ports, make_ring

C = contract()
PORTS = {p: f"nrtap{p - 1}" for p in range(1, 6)}


@pytest.fixture
def session() -> FakeSession:
    return FakeSession()


@pytest.fixture
def target(session: FakeSession) -> Bmv2Target:
    return Bmv2Target(session, PORTS, {**mac_ports(4), "02:4E:52:00:00:FE": 5})


def entries_of(session: FakeSession, table: str) -> list[TableEntry]:
    return [e for e in session.entries.values() if e.table == table]


def test_plan_ring_translates_the_spec() -> None:
    spec = make_ring(3, psn0=[10, 20, 30])
    plan = plan_ring(spec, {"10.77.0.1": 1, "10.77.0.2": 2, "10.77.0.3": 3}, 256, 2, 7, C)
    assert plan.ring == TableEntry("NrIngress.ring_table", (("ring", 2),), "NrIngress.set_ring",
                                   (("epoch", 7), ("slot_mask", 255), ("full", 0b111)))
    assert plan.conns[2] == TableEntry(
        "NrIngress.conn_table", (("src_ip", "10.77.0.3"), ("dst_ip", "10.77.0.1"),
                                 ("dest_qp", spec.connections[2].dst_qpn)),
        "NrIngress.set_conn", (("ring", 2), ("rank", 2), ("psn0", 30), ("in_port", 3),
                               ("out_port", 1)))
    assert plan.replicas[1] == TableEntry(
        "NrEgress.replica_table", (("ring", 2), ("rank", 1)), "NrEgress.set_replica",
        (("src_ip", "10.77.0.2"), ("dst_ip", "10.77.0.3"),
         ("dest_qp", spec.connections[1].dst_qpn), ("psn0", 20)))
    # rank r's result leaves by its responder's port; the continuation copy rides along
    assert plan.group == McGroup(C.ring_group_base + 2, ((2, 0), (3, 1), (1, 2), (2, C.cont_rid)))
    # rank 2's responder (10.77.0.1, port 1) answers rank 2's QP: only from port 1 (rule 2r)
    assert plan.responses[2] == TableEntry(
        "NrIngress.response_table", (("src_ip", "10.77.0.1"), ("dst_ip", "10.77.0.3"),
                                     ("dest_qp", spec.connections[2].src_qpn)),
        "NrIngress.set_response", (("ring", 2), ("rank", 2), ("port", 1)))
    assert plan.install_order == (plan.ring, *plan.replicas, *plan.conns, *plan.responses)


def test_target_installs_the_flood_group_and_static_macs(target: Bmv2Target,
                                                         session: FakeSession) -> None:
    assert session.groups == {C.flood_group: McGroup(C.flood_group,
                                                     tuple((p, 0) for p in range(1, 6)))}
    l2 = {e.match[0][1]: e.params[0][1] for e in entries_of(session, "NrIngress.l2")}
    assert l2 == {**mac_ports(4), "02:4e:52:00:00:fe": 5}
    assert target.port_of_mac("02:4E:52:00:00:03") == 3
    assert target.port_of_mac("02:4e:52:00:00:09") is None


def test_static_macs_must_name_known_ports(session: FakeSession) -> None:
    with pytest.raises(ValueError, match=r"unknown ports \[9\]"):
        Bmv2Target(session, PORTS, {"02:4e:52:00:00:01": 9})


def test_register_and_unregister_in_order(target: Bmv2Target, session: FakeSession) -> None:
    session.log.clear()
    got = target.register_ring(make_ring(3), 256)
    assert got == {"ring_id": "ring", "slots": 256,
                   "ports": {"10.77.0.1": 1, "10.77.0.2": 2, "10.77.0.3": 3}}
    assert session.log == [("insert", f"group {C.ring_group_base}"),
                           ("insert", "NrIngress.ring_table")] \
        + [("insert", "NrEgress.replica_table")] * 3 + [("insert", "NrIngress.conn_table")] * 3 \
        + [("insert", "NrIngress.response_table")] * 3
    assert target.register_ring(make_ring(3), 256) == got          # the same again: no-op
    with pytest.raises(ValueError, match="already registered differently"):
        target.register_ring(make_ring(3), 128)
    session.log.clear()
    target.unregister_ring("ring")
    assert session.log == [("delete", "NrIngress.response_table")] * 3 \
        + [("delete", "NrIngress.conn_table")] * 3 \
        + [("delete", "NrEgress.replica_table")] * 3 \
        + [("delete", "NrIngress.ring_table"), ("delete", f"group {C.ring_group_base}")]
    assert len(session.entries) == 5 and set(session.groups) == {C.flood_group}
    with pytest.raises(KeyError):
        target.unregister_ring("ring")


def test_a_connection_belongs_to_one_ring(target: Bmv2Target) -> None:
    target.register_ring(make_ring(2, ring_id="a"), 256)
    with pytest.raises(ValueError, match="already registered by ring a"):
        target.register_ring(make_ring(2, ring_id="b"), 256)


def test_ring_indices_are_reused_with_a_new_epoch(target: Bmv2Target,
                                                  session: FakeSession) -> None:
    for i in range(C.max_rings):
        target.register_ring(make_ring(2, ring_id=f"r{i}", qpn_base=0x100 * (i + 1)), 256)
    with pytest.raises(ValueError, match=f"holds {C.max_rings} rings"):
        target.register_ring(make_ring(2, ring_id="extra", qpn_base=0x900), 256)
    target.unregister_ring("r1")
    target.register_ring(make_ring(2, ring_id="again", qpn_base=0x900), 256)
    ring_entries = {e.match: dict(e.params) for e in entries_of(session, "NrIngress.ring_table")}
    assert ring_entries[(("ring", 1),)]["epoch"] == 2
    assert ring_entries[(("ring", 0),)]["epoch"] == 1


@pytest.mark.parametrize("kw,slots,message", [
    ({"mtu": 1024}, 256, "must use path MTU 256"),
    ({}, 512, "512 slots, the BMv2 program has 256 per ring"),
    ({}, 3, "power of two"),                                        # the software rules too
])
def test_rings_beyond_the_program_limits_are_refused(target: Bmv2Target, kw: dict, slots: int,
                                                     message: str) -> None:
    with pytest.raises(ValueError, match=message):
        target.register_ring(make_ring(2, **kw), slots)


def test_a_failed_install_leaves_nothing_behind(target: Bmv2Target,
                                                session: FakeSession) -> None:
    before = (dict(session.entries), dict(session.groups))
    session.fail_table = "NrIngress.conn_table"
    with pytest.raises(RuntimeError, match="table full"):
        target.register_ring(make_ring(2), 256)
    assert (session.entries, session.groups) == before
    session.fail_table = None
    target.register_ring(make_ring(2), 256)                          # index 0 is free again


def test_counters_are_relative_to_registration(target: Bmv2Target,
                                               session: FakeSession) -> None:
    ring_idx = C.ring_counter_index(0, "completed")
    conn_idx = C.conn_counter_index(0, 1, "aggregated")
    session.values["ring_ctr"][ring_idx] = (5, 0)                    # left by an earlier ring
    session.values["conn_ctr"][conn_idx] = (9, 0)
    target.register_ring(make_ring(2), 256)
    session.values["ring_ctr"][ring_idx] = (8, 0)
    session.values["conn_ctr"][conn_idx] = (10, 0)
    session.values["port_rx"][2] = (4, 1024)
    session.values["port_roce"][2] = (3, 0)
    got = target.counters()
    ring = got["rings"]["ring"]
    assert ring["counters"] == {**dict.fromkeys(RING_COUNTERS, 0), "completed": 3}
    assert ring["next_emit"] == 3
    assert ring["connections"][1]["counters"] == {**dict.fromkeys(CONN_COUNTERS, 0),
                                                  "aggregated": 1}
    assert got["ports"]["2"] == {"ifname": "nrtap1", "rx_packets": 4, "rx_bytes": 1024,
                                 "tx_packets": 0, "tx_bytes": 0, "roce_packets": 3,
                                 "flooded": 0, "tx_errors": 0}


def test_limits_are_the_programs(target: Bmv2Target) -> None:
    """limits.p4's numbers: path MTU 256 only (64 int32 per packet), its slots, ranks, rings."""
    assert target.limits() == {"path_mtus": [4 * C.max_elems], "max_slots": C.slots,
                               "max_ranks": C.max_ranks, "max_rings": C.max_rings} \
        == {"path_mtus": [256], "max_slots": 256, "max_ranks": 32, "max_rings": 4}


def test_bmv2_port_counters_format_without_rx_dropped(target: Bmv2Target) -> None:
    """BMv2 keeps no rx_dropped: the table shows "-" there (was KeyError 'rx_dropped')."""
    table = format_port_table(target.counters()["ports"]).splitlines()
    head = table[0].split()
    assert len(table) == 1 + len(PORTS)
    for kept_only_by_software in ("rx_dropped", "interswitch_packets", "tx_lost"):
        col = head.index(kept_only_by_software)
        assert all(row.split()[col] == "-" for row in table[1:])


def test_counters_have_the_software_targets_shape(target: Bmv2Target) -> None:
    software = SoftwareTarget(AggregationPipeline(), mac_ports(4).get)
    for t in (target, software):
        t.register_ring(make_ring(3), 256)
    ours, theirs = target.counters(), software.counters()
    assert ours["target"] == "bmv2" and ours.keys() == theirs.keys()
    assert ours["rings"]["ring"].keys() == theirs["rings"]["ring"].keys()
    assert ours["rings"]["ring"]["connections"] == [
        {**c, "reth": None} for c in theirs["rings"]["ring"]["connections"]]


def test_reth_comes_from_the_register_reader(session: FakeSession) -> None:
    reads = []

    def reader(name: str, index: int) -> Optional[int]:
        reads.append((name, index))
        return (0x7F00 << 64 | 0x2A << 32 | 640) if index == C.max_ranks + 1 else 0

    target = Bmv2Target(session, PORTS, mac_ports(4), reader)
    target.register_ring(make_ring(2, ring_id="a"), 256)
    target.register_ring(make_ring(2, ring_id="b", qpn_base=0x50), 256)
    conns = target.counters()["rings"]["b"]["connections"]
    assert conns[1]["reth"] == {"va": 0x7F00, "rkey": 0x2A, "dma_len": 640}
    assert conns[0]["reth"] is None
    assert ("conn_reth", C.max_ranks + 1) in reads


def test_the_controller_serves_a_bmv2_target(target: Bmv2Target, session: FakeSession) -> None:
    server, port = serve(target, "127.0.0.1:0", config=ControllerConfig(insecure=True))
    try:
        with ControllerClient(f"127.0.0.1:{port}", timeout=5) as client:
            limits = client.ping()["limits"]
            assert (client.ping()["target"], limits["path_mtus"]) == ("bmv2", [256])
            assert client.register_ring(make_ring(2))["slots"] == 256
            assert client.ping()["limits"]["free_rings"] == limits["free_rings"] - 1
            assert client.counters()["rings"]["ring"]["world_size"] == 2
            client.unregister_ring("ring")
    finally:
        server.stop(None)
    assert not entries_of(session, "NrIngress.conn_table")


def fake_tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


FAKE_CLI = """echo started >> "$(dirname "$0")/starts"
printf 'Obtaining JSON from switch...\\nDone\\nControl utility for runtime P4 table manipulation\\n'
while read -r cmd a b; do
  case "$cmd" in
    register_read) [ "$b" = 33 ] && echo "RuntimeCmd: $a[$b]= 1234"
                   [ "$b" = 35 ] && echo "RuntimeCmd: $a[34]= 99"
                   [ "$b" = 66 ] && exit 1
                   [ "$b" = 77 ] && sleep 30 ;;
    *) echo "RuntimeCmd: *** Unknown syntax: $cmd" ;;
  esac
done"""


def test_thrift_registers_read_through_one_long_lived_cli(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One CLI serves every read; a read answers only its own register; a CLI that dies or
    goes silent gives None once, then a fresh one serves (counted in `restarts`)."""
    from switch.control import bmv2_registers
    monkeypatch.setattr(bmv2_registers, "READ_TIMEOUT", 1.0)
    fake_tool(tmp_path, "cli", FAKE_CLI)
    read = ThriftRegisters(cli=str(tmp_path / "cli"))
    try:
        assert [read("conn_reth", 33), read("conn_reth", 34), read("ring_next", 33)] == \
            [1234, None, 1234]
        assert read("conn_reth", 35) is None            # another index's line is not its
        assert (tmp_path / "starts").read_text().count("started") == 1
        assert read("conn_reth", 66) is None            # the CLI exits
        assert read("conn_reth", 33) == 1234
        assert read("conn_reth", 77) is None            # silent past READ_TIMEOUT: killed
        assert read("conn_reth", 33) == 1234
        assert (tmp_path / "starts").read_text().count("started") == 3
        assert read.restarts == 2
    finally:
        read.close()
    assert ThriftRegisters(cli=str(tmp_path / "missing"))("conn_reth", 1) is None


def test_missing_tools_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="p4c is not on PATH"):
        p4program.compile_program(tmp_path / "out")
    assert bmv2_lab.main(["--port", "1=nrtap0"]) == 1
    assert "simple_switch_grpc is not on PATH" in capsys.readouterr().err


def test_compile_runs_p4c_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out"
    fake_tool(tmp_path, "p4c", f'echo "$@" >> {tmp_path}/calls\n'
                               f'touch {out}/netreduce.json {out}/netreduce.p4info.txtpb')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert p4program.compile_program(out) == build_paths(out)
    assert p4program.compile_program(out) == build_paths(out)       # up to date: no p4c
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [" ".join(p4program.compile_command(out)[1:])]
    # a build whose stamp is another input's (a copy from before a source change, whatever
    # its files' times) is compiled again
    (out / p4program.INPUTS_FILE).write_text("0" * 64 + "\n")
    os.utime(out / "netreduce.json")
    assert p4program.compile_program(out) == build_paths(out)
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    assert (out / p4program.INPUTS_FILE).read_text().strip() == p4program.inputs_digest(out)
    fake_tool(tmp_path, "p4c", 'echo "netreduce.p4(3): syntax error" >&2; exit 1')
    with pytest.raises(RuntimeError, match="syntax error"):
        p4program.compile_program(tmp_path / "other")


def test_a_second_caller_waits_for_the_compile_under_way(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What scripts/test.sh relies on: while one process compiles into a build directory
    (its background p4c), another's compile_program of that directory (a test needing the
    build) waits for it and then finds the build fresh: p4c runs once."""
    out = tmp_path / "out"
    fake_tool(tmp_path, "p4c", f'touch {tmp_path}/started; sleep 2; echo call >> {tmp_path}/calls\n'
                               f'touch {out}/netreduce.json {out}/netreduce.p4info.txtpb')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    first = subprocess.Popen([sys.executable, "-m", "switch.p4.program", "--out", str(out)],
                             stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert first.poll() is None and time.monotonic() < deadline, "p4c never started"
            time.sleep(0.05)
        said: list[str] = []
        assert p4program.compile_program(out, progress=said.append) == build_paths(out)
        assert (tmp_path / "calls").read_text() == "call\n"      # the first one's, done
        assert said == [f"netreduce.p4 -> {out}: another process compiles it: waiting for it",
                        f"netreduce.p4 -> {out}: up to date (its sources did not change)"]
    finally:
        assert first.wait(timeout=30) == 0
    assert (tmp_path / "calls").read_text() == "call\n"


def test_compile_says_what_happens_while_p4c_runs_with_a_fake_p4c(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What scripts/lab.sh shows while a fresh clone compiles (`--progress`): p4c starts,
    runs on (every PROGRESS_EVERY s), ends; a later run finds the build fresh; p4c's
    messages are in the log and, when it fails, in the error."""
    out = tmp_path / "out"
    fake_tool(tmp_path, "p4c", f'echo "p4c says hello"; sleep 1\n'
                               f'touch {out}/tor.json {out}/tor.p4info.txtpb')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(p4program, "PROGRESS_EVERY", 0.3)
    said: list[str] = []
    assert p4program.compile_program(out, p4program.TOR_MAIN, said.append) == \
        build_paths(out, p4program.TOR_MAIN)
    what = f"tor.p4 -> {out}: "
    assert said[0] == what + "compiling with p4c (a first build takes minutes; later runs " \
                             "reuse it)"
    assert 2 <= len(said[1:-1]) <= 4 and all(
        s.startswith(what + "p4c still compiling (") for s in said[1:-1]), said
    assert said[-1] in (what + "p4c done in 1 s", what + "p4c done in 2 s"), said
    assert (out / "p4c.log").read_text() == "p4c says hello\n"
    said.clear()
    p4program.compile_program(out, p4program.TOR_MAIN, said.append)
    assert said == [what + "up to date (its sources did not change)"]
    fake_tool(tmp_path, "p4c", 'echo "tor.p4(3): syntax error" >&2; exit 1')
    with pytest.raises(RuntimeError, match=r"p4c failed \(1\):\ntor.p4\(3\): syntax error"):
        p4program.compile_program(tmp_path / "other", p4program.TOR_MAIN, said.append)
    assert said[-1] == f"tor.p4 -> {tmp_path / 'other'}: p4c FAILED in 0 s"


def test_the_shell_session_names_the_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "p4runtime_sh", None)
    monkeypatch.setitem(sys.modules, "p4runtime_sh.shell", None)
    with pytest.raises(RuntimeError, match=r"netreduce\[bmv2\]"):
        ShellSession("127.0.0.1:9559", build_paths(Path("/nonexistent")))


def test_bmv2_lab_stops_the_switch_it_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """simple_switch_grpc starts and listens, the P4Runtime session fails: the process
    is stopped again and the error names what is missing."""
    out = tmp_path / "build"
    fake_tool(tmp_path, "p4c", f"touch {out}/netreduce.json {out}/netreduce.p4info.txtpb")
    (tmp_path / "simple_switch_grpc").write_text(
        f"#!{sys.executable}\nimport os, socket, sys, time\n"
        "host, port = sys.argv[sys.argv.index('--grpc-server-addr') + 1].split(':')\n"
        "s = socket.socket(); s.bind((host, int(port))); s.listen()\n"
        "thrift = int(sys.argv[sys.argv.index('--thrift-port') + 1])\n"
        "t = socket.socket(); t.bind(('', thrift)); t.listen()\n"      # every address: as BMv2
        f"open('{tmp_path}/args', 'w').write(' '.join(sys.argv[1:]))\n"
        "time.sleep(60)\n")
    (tmp_path / "simple_switch_grpc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "p4runtime_sh", None)
    monkeypatch.setitem(sys.modules, "p4runtime_sh.shell", None)
    out.mkdir()
    grpc = free_port()
    assert bmv2_lab.main(["--port", "1=nrtap0", "--port", "2=nrctlp", "--build", str(out),
                          "--grpc-port", str(grpc), "--thrift-port", "9999"]) == 1
    assert "netreduce[bmv2]" in capsys.readouterr().err
    assert (tmp_path / "args").read_text() == (
        f"--device-id 0 --thrift-port 9999 --log-level off -i 1@nrtap0 -i 2@nrctlp --no-p4 -- "
        f"--grpc-server-addr 127.0.0.1:{grpc}")
    with pytest.raises(OSError):                 # nobody listens there any more
        socket.create_connection(("127.0.0.1", grpc), timeout=1).close()
