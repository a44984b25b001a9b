"""`procdelta top --threads`: a group's threads read over a proc tree of plain files and
guarded like the collector's cache; `top`'s own passes, and threads from a server."""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from pathlib import Path

import pytest

from collector import top
from collector.processes import ProcessTable
from collector.procfs import ProcFS
from tests.integration.test_serve import CountingEngine
from tests.integration.test_top_remote import answering, hostile

# --- the threads' guard, over a proc tree of plain files ----------------------------------


def write_thread(root: Path, pid: int, tid: int, comm: str, start: int, counters) -> None:
    on_cpu, run_delay, voluntary, nonvoluntary = counters
    task = root / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    rest = " ".join(["S", *["0"] * 16, "1", "0", str(start), "0", "0"])
    (task / "stat").write_text(f"{tid} ({comm}) {rest}\n")
    (task / "schedstat").write_text(f"{on_cpu} {run_delay} 1\n")
    (task / "status").write_text(
        f"Name:\t{comm}\nvoluntary_ctxt_switches:\t{voluntary}\n"
        f"nonvoluntary_ctxt_switches:\t{nonvoluntary}\n"
    )


def test_threads_are_guarded_like_the_collectors_cache(tmp_path):
    clock = iter(range(0, 10**12, 10**9))
    watch = top.ThreadWatch(ProcFS(str(tmp_path)), clock=lambda: next(clock))
    write_thread(tmp_path, 10, 10, "main", 100, (1000, 10, 1, 1))
    write_thread(tmp_path, 10, 11, "worker one", 100, (5000, 900, 5, 5))
    write_thread(tmp_path, 10, 12, "worker) (x", 100, (7000, 90, 7, 7))
    assert watch.read([10, 99]) == []  # first sight; PID 99 does not exist
    assert watch.interval_ns is None
    write_thread(tmp_path, 10, 10, "main", 100, (1500, 20, 2, 1))
    write_thread(tmp_path, 10, 11, "worker one", 200, (10, 1, 1, 1))  # TID reused
    write_thread(tmp_path, 10, 12, "worker) (x", 100, (6000, 95, 8, 8))  # a counter fell
    write_thread(tmp_path, 10, 13, "new", 150, (10, 1, 1, 1))  # first sight
    rows = watch.read([10])
    assert rows == [top.ThreadRow(10, 10, "main", 500, 10, 1, 0)]
    assert watch.interval_ns == 10**9
    write_thread(tmp_path, 10, 11, "worker one", 200, (30, 4, 1, 3))
    write_thread(tmp_path, 10, 13, "new", 150, (20, 3, 2, 1))
    (tmp_path / "10" / "task" / "12" / "schedstat").unlink()  # vanished mid-read
    rows = sorted(watch.read([10]))
    assert rows == [
        top.ThreadRow(10, 10, "main", 0, 0, 0, 0),
        top.ThreadRow(10, 11, "worker one", 20, 3, 0, 2),
        top.ThreadRow(10, 13, "new", 10, 2, 1, 0),
    ]


def test_a_reused_tid_gives_no_delta_even_where_its_counters_grew(tmp_path):
    """A TID reused by a thread of the same process whose counters are above the old
    thread's: only its start time tells the two apart (the fallen-counter guard cannot)."""
    clock = iter(range(0, 10**12, 10**9))
    watch = top.ThreadWatch(ProcFS(str(tmp_path)), clock=lambda: next(clock))
    write_thread(tmp_path, 10, 11, "worker", 100, (10, 1, 1, 1))
    assert watch.read([10]) == []
    write_thread(tmp_path, 10, 11, "worker", 300, (9000, 800, 9, 9))  # another thread
    assert watch.read([10]) == []
    write_thread(tmp_path, 10, 11, "worker", 300, (9500, 900, 9, 10))
    assert watch.read([10]) == [top.ThreadRow(10, 11, "worker", 500, 100, 0, 1)]


def test_threads_are_read_for_each_pid_and_their_interval_is_between_readings(tmp_path):
    """A PID gone does not hide the threads of the PIDs after it; the interval is the
    time between the two readings, whatever the clock read at the first."""
    clock = iter(range(5 * 10**9, 10**12, 10**9))
    watch = top.ThreadWatch(ProcFS(str(tmp_path)), clock=lambda: next(clock))
    write_thread(tmp_path, 10, 10, "main", 100, (1000, 10, 1, 1))
    assert watch.read([99, 10]) == []
    write_thread(tmp_path, 10, 10, "main", 100, (1500, 20, 2, 1))
    assert watch.read([99, 10]) == [top.ThreadRow(10, 10, "main", 500, 10, 1, 0)]
    assert watch.interval_ns == 10**9


def write_process(root: Path, pid: int, comm: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    rest = " ".join(["S", *["0"] * 16, "1", "0", "100", "0", "0"])
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {rest}\n")


def test_threads_are_read_only_where_the_served_pids_name_this_nodes_processes(tmp_path):
    """--threads from a server reads here the threads of the served PIDs whose process
    here has the served name; a PID gone here is passed over. Where more PIDs name
    another process here than the served one, or none the served one, top is not on the
    served node (or not with the host's /proc): one line says so."""
    for pid, comm in ((10, "main"), (11, "worker"), (12, "sshd"), (13, "bash")):
        write_process(tmp_path, pid, comm)
    procfs = ProcFS(str(tmp_path))
    same = top.check_same_node
    assert same(procfs, {10: "main", 11: "worker", 99: "gone"}, "S") == [10, 11]
    assert same(procfs, {10: "main", 12: "other"}, "S") == [10]  # as many alike as not
    assert same(procfs, {}, "S") == []
    for served, alike in (({10: "main", 12: "x", 13: "y"}, 1), ({98: "a", 99: "b"}, 0),
                          ({12: "x"}, 0)):  # fmt: skip
        with pytest.raises(top.TopError) as raised:
            same(procfs, served, "http://node-a:9101")
        message = str(raised.value)
        assert "\n" not in message
        assert "http://node-a:9101" in message and str(tmp_path) in message
        assert f"({alike} of {len(served)} with the same name here)" in message


class FirstPassEngine(CountingEngine):
    """A counting engine whose first pass has no interval yet, and whose passes keep two
    processes of /g0 and one of /g1 for the view."""

    def run_pass(self):
        result = super().run_pass()
        groups = {10: self.groups[0], 11: self.groups[0], 12: self.groups[1]}
        table = ProcessTable(group_of_pid=groups)
        interval = None if self.passes == 1 else result.interval_ns
        return dataclasses.replace(result, interval_ns=interval, processes=table)


def test_tops_own_passes_give_the_groups_pids_then_its_document():
    """A first pass has no interval: an empty view, with the group's PIDs for --threads'
    first reading; later passes give the processes view's document."""
    selection = top.Selection(cgroup="/g0", threads=True)
    source = top.LocalFeed(FirstPassEngine(groups=2), selection)
    assert source.origin == ""
    first = source.fetch()
    assert first.document == {} and first.pids == {10: "", 11: ""}
    second = source.fetch()
    assert second.pids == {10: "", 11: ""}
    assert second.document["interval_seconds"] == 1e-9
    assert [g["group"] for g in second.document["groups"]] == [{"cgroup": "/g0"}]
    assert "cgroup_cpu_nanos" in second.document["groups"][0]
    without = top.LocalFeed(FirstPassEngine(groups=2), top.Selection(cgroup="/g0"), False)
    without.fetch()
    view = without.fetch()
    assert view.pids == {} and "cgroup_cpu_nanos" not in view.document["groups"][0]


def test_threads_from_a_server_are_read_for_the_served_pids_alike_here(tmp_path):
    for pid, comm in ((10, "main"), (11, "worker")):
        write_process(tmp_path, pid, comm)
    rows = [{"pid": pid, "comm": comm, "group": {}} for pid, comm in
            ((10, "main"), (11, "worker"), (99, "gone"))]  # fmt: skip
    body = json.dumps({"processes": rows}).encode()
    with hostile(answering(b"200 OK", body)) as (port, _):
        selection = top.Selection(cgroup="/x", threads=True)
        remote = top.Remote(f"http://127.0.0.1:{port}")
        view = top.RemoteFeed(remote, selection, ProcFS(str(tmp_path))).fetch()
    assert view.pids == {10: "main", 11: "worker"}


def test_threads_from_another_nodes_server_name_the_server_and_what_to_do(tmp_path):
    """Where the served PIDs name other processes here, the one line names the server
    (its origin), the proc filesystem read and how to run top where they are alike."""
    write_process(tmp_path, 10, "sshd")
    body = json.dumps({"processes": [{"pid": 10, "comm": "main", "group": {}}]}).encode()
    with hostile(answering(b"200 OK", body)) as (port, _):
        selection = top.Selection(cgroup="/x", threads=True)
        remote = top.Remote(f"http://127.0.0.1:{port}")
        source = top.RemoteFeed(remote, selection, ProcFS(str(tmp_path)))
        with pytest.raises(top.TopError) as raised:
            source.fetch()
    assert str(raised.value) == (
        f"--threads: the PIDs http://127.0.0.1:{port} serves are not this node's processes "
        f"under {tmp_path} (0 of 1 with the same name here); run top on that node with the "
        "host's /proc (in procdelta's pod: PROCDELTA_PATH_PROCFS)"
    )


def test_from_asks_the_server_for_the_pod_in_its_namespace_and_the_sort():
    """--from asks /processes for exactly what was selected: a pod by namespace and name
    (a name alone matches its namesakes in other namespaces) and the sort (the server cuts
    to the limit by it: top cannot sort what it was not sent)."""
    pod = top.Selection(pod=("prod", "web-0"), sort="on_cpu_nanos", limit=5)
    source = top.RemoteFeed(top.Remote("http://127.0.0.1:9746"), pod)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(source.url).query))
    assert query == {"namespace": "prod", "pod": "web-0", "sort": "on_cpu_nanos", "limit": "5"}
    node = top.RemoteFeed(top.Remote("127.0.0.1:9746/"), top.Selection(limit=None))
    assert node.url == "http://127.0.0.1:9746/processes?sort=run_delay_nanos&limit=0"
