"""`procdelta top` against real processes in real cgroups: its JSON of a throttled pod, a
cgroup and the node, the threads that wait, a server on this node with basic auth and TLS."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cgroups import Workload, cgroup, cgroups, weighed
from tests.fixturetree import PASS1
from tests.integration.test_cli import assert_one_line_error, procdelta
from tests.integration.test_top_terminal import interruptible
from tests.net import free_port, start_serve, wait_until
from tests.webconfigs import PASSWORD, users_block, write_config

THROTTLED_UID = str(uuid.uuid4())
LEADER = Path(sys.executable).name[:15]  # a workload's comm, its threads' unless named

# --- real processes in real cgroups ------------------------------------------------------


@pytest.fixture(scope="module")
def workloads(tmp_path_factory) -> Iterator[dict]:
    """A throttled pod (one busy thread under a 20% quota, kubelet's cgroupfs layout on
    the v1 cpu controllers and the v2 tree), and a cgroup whose two busy threads share
    one CPU beside an idle one (each thread named for what it does)."""
    logs = tmp_path_factory.mktemp("logs")
    cid = uuid.uuid4().hex * 2
    (logs / "pods" / f"top_throttled-pod_{THROTTLED_UID}").mkdir(parents=True)
    (logs / "containers").mkdir()
    (logs / "containers" / f"throttled-pod_top_main-{cid}.log").touch()
    name = f"procdelta-test-top-{uuid.uuid4().hex[:12]}"
    with contextlib.ExitStack() as stack:
        pod = stack.enter_context(
            cgroups(("cpu", "cpuacct", "v2"), f"kubepods/burstable/pod{THROTTLED_UID}/{cid}")
        )
        with open(Path(pod["cpu"]) / "cpu.cfs_quota_us", "w") as quota:
            quota.write("20000")
        # a requested pod's weight beside BestEffort neighbours, on every level of its path
        # (as tests/kernel/test_end_to_end.py sets it): once its quota refills it runs at once, so
        # its wait is its quota's
        stack.enter_context(weighed(pod["cpu"], 1024 * 204 // 2))
        throttled = stack.enter_context(
            Workload(list(pod.values()), "--busy", "1", "--name-threads")
        )
        contended = stack.enter_context(cgroup("v2", name))
        shared = stack.enter_context(
            Workload(contended, "--busy", "2", "--idle", "1", "--cpu", "0", "--name-threads")
        )
        yield {
            "logs": ["--path.pod-logs", str(logs / "pods"),
                     "--path.container-logs", str(logs / "containers")],
            "throttled": throttled.pid,
            "cgroup": "/" + name,
            "shared": shared.pid,
        }  # fmt: skip


def run_json(*args: str) -> dict:
    result = procdelta("top", "--format", "json", "--interval", "1", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.kernel
def test_json_of_a_throttled_pod_reads_as_its_own_limit(workloads):
    document = run_json("--pod", "top/throttled-pod", *workloads["logs"])
    assert 0.5 < document["interval_seconds"] < 5
    assert abs(document["timestamp"] - time.time()) < 30
    (process,) = document["processes"]
    assert process["pid"] == workloads["throttled"] and process["comm"] == LEADER
    assert process["group"] == {"namespace": "top", "pod": "throttled-pod",
                                "uid": THROTTLED_UID, "qos": "burstable"}  # fmt: skip
    assert process["on_cpu_nanos"] > 0 and process["run_delay_nanos"] > 0
    (group,) = document["groups"]
    assert group["group"] == process["group"]
    assert group["processes"] == 1 and group["run_delay_nanos"] == process["run_delay_nanos"]
    assert group["cgroup_cpu_nanos"] > 0
    assert group["cpu_throttled_periods"] > 0.5 * group["cpu_periods"]
    # its wait is mostly its own quota's, moment by moment (this host has cgroup pressure)
    assert group["run_delay_throttled_nanos"] is None  # one basis, never both
    assert group["cpu_stalled_throttled_nanos"] > 0.5 * group["cpu_pressure_waiting_nanos"]


@pytest.mark.kernel
def test_json_of_a_cgroup_and_the_node(workloads):
    document = run_json("--cgroup", workloads["cgroup"], "--sort", "on_cpu_nanos")
    (process,) = document["processes"]
    assert process["pid"] == workloads["shared"] and process["threads"] == 4
    assert process["group"] == {"cgroup": workloads["cgroup"]}
    assert [g["group"] for g in document["groups"]] == [{"cgroup": workloads["cgroup"]}]
    node = run_json("--limit", "0", "--sort", "on_cpu_nanos")
    pids = [p["pid"] for p in node["processes"]]
    assert workloads["shared"] in pids and workloads["throttled"] in pids
    cpu = [p["on_cpu_nanos"] for p in node["processes"]]
    assert cpu == sorted(cpu, reverse=True)
    assert {json.dumps(g["group"], sort_keys=True) for g in node["groups"]} == {
        json.dumps(p["group"], sort_keys=True) for p in node["processes"]
    }


def assert_the_busy_threads_wait(document: dict, pid: int) -> None:
    threads = document["threads"]
    assert set(threads[0]) == {"pid", "tid", "comm", "on_cpu_nanos", "run_delay_nanos",
                               "voluntary_switches", "nonvoluntary_switches"}  # fmt: skip
    names = [t["comm"] for t in threads]
    # two busy threads on one CPU: each waits for the other; the idle one and the
    # leader (blocked reading its orders) never wait
    assert sorted(names[:2]) == ["busy-0", "busy-1"], threads
    assert {"idle-0", LEADER} <= set(names)
    interval = document["threads_interval_seconds"] * 1e9
    assert 0.5e9 < interval < 5e9
    for thread in threads:
        assert thread["pid"] == pid
        if thread["comm"].startswith("busy"):
            assert thread["run_delay_nanos"] > 0.2 * interval, thread
            assert thread["on_cpu_nanos"] > 0.1 * interval, thread
        else:
            assert thread["run_delay_nanos"] < 0.01 * interval, thread
    delays = [t["run_delay_nanos"] for t in threads]
    assert delays == sorted(delays, reverse=True)


@pytest.mark.kernel
def test_threads_name_the_thread_that_waits(workloads):
    document = run_json("--cgroup", workloads["cgroup"], "--threads")
    assert [p["pid"] for p in document["processes"]] == [workloads["shared"]]
    assert_the_busy_threads_wait(document, workloads["shared"])


@contextlib.contextmanager
def served(*extra: str) -> Iterator[int]:
    """A real `procdelta serve` on 127.0.0.1, a pass every second: its port."""
    port = free_port()
    process = start_serve(port, *extra)
    try:
        yield port
    finally:
        process.terminate()
        process.communicate(timeout=10)


@pytest.mark.kernel
def test_threads_from_a_server_on_this_node(workloads):
    with served() as port:
        url = f"http://127.0.0.1:{port}"

        def listed():
            asked = ("top", "--format", "json", "--from", url, "--cgroup", workloads["cgroup"])
            result = procdelta(*asked)
            return result.returncode == 0 and json.loads(result.stdout)["processes"] and result

        document = json.loads(wait_until(listed, 30, "the cgroup's process served").stdout)
        assert document["processes"][0]["pid"] == workloads["shared"]
        document = run_json("--from", url, "--cgroup", workloads["cgroup"], "--threads")
        assert_the_busy_threads_wait(document, workloads["shared"])
        # the same PIDs under another proc filesystem: not this node's processes
        elsewhere = ("--path.procfs", str(PASS1))
        result = procdelta("top", "--format", "json", "--from", url, "--cgroup",
                           workloads["cgroup"], "--threads", *elsewhere)  # fmt: skip
    assert_one_line_error(result, "not this node's processes", "PROCDELTA_PATH_PROCFS", status=1)


def test_basic_auth_and_tls_of_the_server(pki, tmp_path):
    config = write_config(
        pki,
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n" + users_block(),
    )
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    with served("--web.config.file", str(config)) as port:
        url = f"https://127.0.0.1:{port}"
        asked = ("top", "--format", "json", "--from", url)
        ca = ("--from.ca-file", str(pki / "ca.crt"))
        alice = ("--from.username", "alice", "--from.password-file", str(password))

        def second_pass() -> bool:
            result = procdelta(*asked, *ca, *alice)
            return result.returncode == 0 and json.loads(result.stdout)["processes"] != []

        wait_until(second_pass, 30, "the server's first interval")
        anonymous = procdelta(*asked, *ca)
        assert_one_line_error(anonymous, "401", "--from.username", "--from.password-file", status=1)
        wrong = tmp_path / "wrong"
        wrong.write_text("not it\n")
        refused = procdelta(*asked, *ca, "--from.username", "alice",
                            "--from.password-file", str(wrong))  # fmt: skip
        assert_one_line_error(refused, "401", "'alice'", status=1)
        untrusted = procdelta(*asked, "--from.username", "alice",
                              "--from.password-file", str(password))  # fmt: skip
        assert_one_line_error(untrusted, "TLS", "--from.ca-file", status=1)
        for trust in (ca, ("--from.insecure-skip-verify",)):
            result = procdelta(*asked, *trust, "--from.username", "alice",
                               "--from.password-file", str(password), "--limit", "3")  # fmt: skip
            assert result.returncode == 0, result.stderr
            document = json.loads(result.stdout)
            assert len(document["processes"]) == 3
            assert document["interval_seconds"] == pytest.approx(1, abs=0.5)
        # the same by environment variables
        environment = {"PROCDELTA_FROM": url, "PROCDELTA_FROM_CA_FILE": str(pki / "ca.crt"),
                       "PROCDELTA_FROM_USERNAME": "alice",
                       "PROCDELTA_FROM_PASSWORD_FILE": str(password)}  # fmt: skip
        assert procdelta("top", "--format", "json", env=environment).returncode == 0


def test_client_certificates(pki):
    config = write_config(pki, "tls_server_config:\n  cert_file: server.crt\n"
                          "  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n"
                          "  client_ca_file: ca.crt\n")  # fmt: skip
    with served("--web.config.file", str(config)) as port:
        asked = ("top", "--format", "json", "--from", f"https://127.0.0.1:{port}",
                 "--from.ca-file", str(pki / "ca.crt"))  # fmt: skip
        certified = ("--from.cert-file", str(pki / "client.crt"),
                     "--from.key-file", str(pki / "client.key"))  # fmt: skip
        wait_until(lambda: procdelta(*asked, *certified).returncode == 0, 30, "the server up")
        assert_one_line_error(procdelta(*asked), "--from", "TLS", status=1)


# --- plain text off a terminal, of real processes ---------------------------------------


def first_blocks(args: list[str], blocks: int = 2, timeout: float = 60) -> str:
    """The first `blocks` blocks `top` prints into a pipe (each whole: the next one has
    begun); then it is stopped by SIGINT, and exits 0."""
    process = subprocess.Popen(
        [sys.executable, "-m", "collector", "top", "--interval", "0.5", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=interruptible,
    )  # fmt: skip
    header = b"procdelta top "
    try:
        out = b""
        deadline = time.time() + timeout
        while out.count(header) <= blocks and time.time() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(process.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
        assert out.count(header) > blocks, (out, process.stderr)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=10)
    assert process.returncode == 0, process.stderr.read()
    starts = [m.start() for m in re.finditer(re.escape(header), out)]
    return out[: starts[blocks]].decode()


@pytest.mark.kernel
def test_plain_text_off_a_terminal_fits_80_columns(workloads):
    text = first_blocks(["--limit", "40"])
    lines = text.splitlines()
    assert "\x1b" not in text
    assert max(len(line) for line in lines) <= 80
    assert [line for line in lines if line != line.rstrip()] == []
    assert len(re.findall(r"^procdelta top  node  by run delay  interval", text, re.M)) == 2
    # each process with its group in the last column: (in a test run) the root or a cgroup
    rows = re.findall(r"^ *\d+ .{15} +\d+ .* (/\S*|\S+/\S+)$", text, re.M)
    assert 2 <= len(rows) <= 80
    pod = first_blocks(["--pod", "top/throttled-pod", *workloads["logs"]], blocks=1)
    assert max(len(line) for line in pod.splitlines()) <= 80
    assert "pod top/throttled-pod  burstable  1 process with a delta" in pod
    # this host has cgroup CPU pressure: why it waited, moment by moment, its limit first
    assert re.search(r"wall wait \S+: (9\d|100)% own limit \(throttled\) · \d+% own threads", pod)
    assert re.search(rf"^ *{workloads['throttled']} {LEADER} +2 ", pod, re.M)
