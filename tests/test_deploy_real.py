"""Real capacities and links of ``deploy-local`` (issue 40): CPU groups with quotas, the
rate-limited link proxy, and their command-line flags.

Nothing here needs root or makes a real CPU group unless asked: the groups' files are
checked on fake hierarchies in a temporary folder, the link's pacing with an injected
clock, its forwarding over loopback sockets without any timing. The tests that make real
groups (and start a federation in them) run only with ``FL_LBBSP_REAL_GROUPS=1`` as root
(``make test-real``), and skip with the reason otherwise: ``make test`` never makes a
group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from fl_lbbsp.cli_parser import build_parser
from fl_lbbsp.runs.deploy import LocalFederation
from fl_lbbsp.runs.deploy.cpu_groups import (
    CFS_PERIOD_US,
    CpuGroups,
    Hierarchy,
    cpu_groups_problem,
    detect_hierarchy,
    quota_us,
)
from fl_lbbsp.runs.deploy.link import LinkPacer, serve_link
from fl_lbbsp.runs.deploy.processes import ProcessGroup
from fl_lbbsp.runs.deploy.silos import silo_nodes

REAL = os.environ.get("FL_LBBSP_REAL_GROUPS") == "1"
REAL_PROBLEM = (
    "set FL_LBBSP_REAL_GROUPS=1 (as root: it makes CPU groups; `make test-real`)"
    if not REAL
    else cpu_groups_problem()
)
needs_groups = pytest.mark.skipif(REAL_PROBLEM is not None, reason=str(REAL_PROBLEM))


def _fake(root: Path, version: int, *, controllers: str = "cpu memory") -> Path:
    """A fake cgroup mount point of ``version``'s layout."""
    if version == 1:
        (root / "cpu").mkdir(parents=True)
        (root / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    else:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text(controllers)
    return root


# ------------------------------------------------------------------ CPU groups
@pytest.mark.parametrize("version", [1, 2])
def test_the_hierarchy_is_detected_in_both_layouts(tmp_path: Path, version: int) -> None:
    # Prepare
    root = _fake(tmp_path, version)

    # Execute
    found = detect_hierarchy(root)

    # Assert
    assert isinstance(found, Hierarchy)
    assert found.version == version
    assert found.root == (root / "cpu" if version == 1 else root)
    assert cpu_groups_problem(root) is None  # a trial group can be made (and is removed)
    assert [p.name for p in found.root.iterdir() if p.is_dir()] == []


@pytest.mark.parametrize(
    ("layout", "reason"),
    [("none", "no cgroup cpu controller"), ("v2-without-cpu", "cpu controller is not available")],
)
def test_without_a_cpu_controller_groups_are_refused_with_a_reason(
    tmp_path: Path, layout: str, reason: str
) -> None:
    # Prepare
    root = tmp_path if layout == "none" else _fake(tmp_path, 2, controllers="memory io")

    # Execute
    problem = cpu_groups_problem(root)

    # Assert: one line that says why
    assert problem is not None and reason in problem
    assert "\n" not in problem


def test_a_federation_with_quotas_refuses_where_groups_cannot_be_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CPU quotas need CPU groups: no cgroup cpu controller"):
        LocalFederation(tmp_path / "w", cpu_quotas=[1, 0.5, 0.25], cgroup_root=tmp_path / "none")


@pytest.mark.parametrize(
    ("fraction", "expected"), [(1.0, 100_000), (0.5, 50_000), (0.25, 25_000), (2.0, 200_000)]
)
def test_a_quota_is_a_fraction_of_the_period(fraction: float, expected: int) -> None:
    assert quota_us(fraction) == expected


@pytest.mark.parametrize("fraction", [0.0, -0.5, float("inf"), float("nan"), 0.005])
def test_an_unusable_quota_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="CPU quota"):
        quota_us(fraction)


@pytest.mark.parametrize("version", [1, 2])
def test_groups_get_their_quota_and_a_fair_weight(tmp_path: Path, version: int) -> None:
    # Prepare: a fake hierarchy (the kernel's files are written as plain files)
    found = detect_hierarchy(_fake(tmp_path, version))
    assert isinstance(found, Hierarchy)
    groups = CpuGroups([("silo-0", 1.0), ("silo-1", 0.25)], hierarchy=found, name="g", weight=2)

    # Execute
    groups.create()

    # Assert: one group per silo under the parent, each with its quota; the parent weighs
    # like 2 processes per silo
    assert groups.made == [
        found.root / "g",
        found.root / "g" / "silo-0",
        found.root / "g" / "silo-1",
    ]
    assert groups.quota_of("silo-0") == 1.0
    assert groups.quota_of("silo-1") == 0.25
    if version == 1:
        assert (found.root / "g" / "cpu.shares").read_text() == str(2 * 1024 * 2)
        assert (found.root / "g" / "silo-1" / "cpu.cfs_period_us").read_text() == str(CFS_PERIOD_US)
    else:
        assert (found.root / "g" / "cpu.weight").read_text() == str(2 * 100 * 2)
        assert (found.root / "g" / "cgroup.subtree_control").read_text() == "+cpu"
        assert (found.root / "g" / "silo-1" / "cpu.max").read_text() == f"25000 {CFS_PERIOD_US}"


def test_joining_writes_the_process_id_to_the_silos_group(tmp_path: Path) -> None:
    # Prepare
    found = detect_hierarchy(_fake(tmp_path, 1))
    assert isinstance(found, Hierarchy)
    groups = CpuGroups([("silo-0", 0.5)], hierarchy=found, name="g")
    groups.create()
    (found.root / "g" / "silo-0" / "cgroup.procs").write_text("")  # the kernel's, made at mkdir
    enter = groups.join("silo-0")

    # Execute: what a child runs before exec, run here
    assert enter is not None
    enter()

    # Assert
    assert (found.root / "g" / "silo-0" / "cgroup.procs").read_text() == str(os.getpid())
    assert groups.join("silo-9") is None
    assert groups.join(None) is None


@pytest.mark.parametrize(
    ("quotas", "links", "message"),
    [
        ([1.0, 0.5], None, "2 CPU quotas given for 3 silos"),
        ([1.0, 0.0, 1.0], None, "CPU quotas must be finite and positive"),
        (None, [None, -1.0, None], "link rates must be finite and positive"),
        (None, [5.0], "1 link rates given for 3 silos"),
    ],
)
def test_bad_quotas_and_link_rates_are_refused(
    quotas: list[float] | None, links: list[float | None] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        silo_nodes(3, None, None, cpu_quotas=quotas, link_mbps=links)


# ------------------------------------------------------------------ the link
def test_the_pacer_queues_chunks_at_the_link_rate() -> None:
    # Prepare: a 1 Mbit/s link (125,000 bytes/s) and a clock the test moves
    now = [10.0]
    pacer = LinkPacer(mbps=1.0, clock=lambda: now[0])

    # Execute: two chunks queued at once, then one after the link went idle
    first, second = pacer.delay(125_000), pacer.delay(62_500)
    now[0] = 20.0
    third = pacer.delay(12_500)

    # Assert: 1 s, then 0.5 s behind it, then 0.1 s on an idle link (no credit saved)
    assert first == pytest.approx(1.0)
    assert second == pytest.approx(1.5)
    assert third == pytest.approx(0.1)


@pytest.mark.parametrize("mbps", [0.0, -1.0, float("inf"), float("nan")])
def test_a_link_rate_that_is_not_finite_and_positive_is_refused(mbps: float) -> None:
    with pytest.raises(ValueError, match="link rate"):
        LinkPacer(mbps=mbps)


def test_the_link_proxy_only_uses_loopback_addresses() -> None:
    with pytest.raises(ValueError, match="loopback"):
        asyncio.run(serve_link(("0.0.0.0", 0), ("127.0.0.1", 1), mbps=1.0))


def _echo_server() -> tuple[socket.socket, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data[::-1])  # an answer that differs from the request

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_the_link_proxy_forwards_both_directions_unchanged() -> None:
    # Prepare: an echo server that reverses each chunk, and the proxy in front of it
    server, _ = _echo_server()
    target = ("127.0.0.1", int(server.getsockname()[1]))
    port: list[int] = []
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    def on_ready(p: int) -> None:
        port.append(p)
        ready.set()

    task = loop.create_task(serve_link(("127.0.0.1", 0), target, mbps=1000.0, ready=on_ready))

    def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    payload = bytes(range(256)) * 64  # 16 KiB, one chunk

    # Execute
    with socket.create_connection(("127.0.0.1", port[0]), timeout=30) as client:
        client.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += client.recv(65536)

    # Assert
    assert got == payload[::-1]
    loop.call_soon_threadsafe(task.cancel)
    thread.join(30)
    server.close()


# ------------------------------------------------------------------ the CLI
def test_the_cli_takes_quotas_and_link_rates() -> None:
    args = build_parser().parse_args(
        ["deploy-local", "--cpu-quota", "1,0.5,0.25", "--link-mbps", "none,none,5"]
    )
    assert args.cpu_quota == [1.0, 0.5, 0.25]
    assert args.link_mbps == [None, None, 5.0]


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--cpu-quota", "1,x"), ("--cpu-quota", "1,0"), ("--cpu-quota", "1,-1"),
     ("--link-mbps", "5,fast"), ("--link-mbps", "0,1"), ("--link-mbps", "inf")],
)  # fmt: skip
def test_the_cli_refuses_bad_quotas_and_rates_in_one_line(flag: str, value: str) -> None:
    # Execute
    proc = subprocess.run(
        [sys.executable, "-m", "fl_lbbsp.cli", "deploy-local", f"{flag}={value}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    # Assert
    assert proc.returncode == 2
    assert f"invalid {flag}" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ real groups (root)
def _cpu_group_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or controllers == "":
            return path
    return ""


@needs_groups
def test_real_groups_hold_a_process_and_its_children_and_are_removed(tmp_path: Path) -> None:
    # Prepare: a group of a quarter core, and a process that starts a busy child
    groups = CpuGroups([("silo-0", 0.25)])
    groups.create()
    (tmp_path / "logs").mkdir()
    procs = ProcessGroup(tmp_path, lambda: dict(os.environ))
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
    try:
        proc = procs.spawn(
            "busy", [sys.executable, "-c", code], "busy", enter=groups.join("silo-0")
        )
        deadline = time.monotonic() + 60
        while len(groups.members()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)

        # Execute: what the group holds
        members = set(groups.members())
        child = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    finally:
        procs.stop(grace=2)
        left = groups.remove()

    # Assert: the process and its child were in it, with the quota; nothing is left
    assert proc.pid in members and child <= members and child
    assert left == []
    assert not groups.parent.exists()


@needs_groups
@pytest.mark.slow
def test_deploy_with_quotas_and_a_slow_link_leaves_nothing_behind(tmp_path: Path) -> None:
    # Prepare
    fed = LocalFederation(tmp_path / "w", cpu_quotas=[1.0, 0.5, 0.25], link_mbps=[None, None, 5.0])
    assert fed.cpu_groups is not None
    parent = fed.cpu_groups.parent

    # Execute: start (every node registers: the slow link's through its proxy), look, stop
    with fed:
        tree = fed.process_tree()
        groups = {
            silo.silo_id: {_cpu_group_of(p.pid) for p in (node, worker)}
            for silo, node, worker in zip(fed.silos, fed.supernodes, fed.workers, strict=True)
        }
        quotas = {s.silo_id: fed.cpu_groups.quota_of(s.silo_id) for s in fed.silos}
        via = fed.superlink_for("silo-2")
        registered = dict(fed.node_ids)

    # Assert: each silo's SuperNode and worker in its own group with its quota; silo-2
    # behind its proxy; after the block no group, no process of the federation
    for silo, found in groups.items():
        assert found == {f"/{parent.name}/{silo}"}
    assert quotas == {"silo-0": 1.0, "silo-1": 0.5, "silo-2": 0.25}
    assert via != fed.address and "silo-2" in registered
    assert not parent.exists()
    assert not [p for p in tree if psutil.pid_exists(p) and _alive(p)]
    assert fed.leftovers() == []


def _alive(pid: int) -> Any:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
