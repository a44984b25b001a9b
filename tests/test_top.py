"""`procdelta top`: its JSON against real processes and real servers, its threads, its
plain text, and its live screen in a pseudo-terminal (q and Ctrl-C quit, the terminal's
attributes come back)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import io
import json
import logging
import os
import re
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import collector
from collector import top
from collector.exporter import PassLoop, make_server
from collector.processes import ProcessTable, Query
from collector.procfs import ProcFS
from tests.cgroups import Workload, cgroup, cgroups, weighed
from tests.fixturetree import PASS1
from tests.net import free_port, start_serve, wait_until
from tests.test_cli import assert_one_line_error, procdelta
from tests.test_serve import CountingEngine, serving
from tests.test_webconfig import PASSWORD, pki, users_block, write_config

__all__ = ["pki"]  # the module's fixture, shared with tests/test_webconfig.py

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
THROTTLED_UID = str(uuid.uuid4())
LEADER = Path(sys.executable).name[:15]  # a workload's comm, its threads' unless named


# --- the drawing, without a kernel ------------------------------------------------------


@pytest.mark.parametrize(
    "nanos",
    [0, 1, 999, 1_000, 999_999, 1_000_000, 9_999_999, 10_000_000, 999_999_999, 10**9,
     9_999_999_999, 99_999_999_999, 999_999_999_999, 10**15, 99_999 * 60 * 10**9],
)  # fmt: skip
def test_short_time_takes_at_most_five_characters(nanos):
    assert len(top.short_time(nanos)) <= 5


@pytest.mark.parametrize(
    ("nanos", "shown"),
    [(None, "-"), (0, "0"), (1, "1ns"), (999, "999ns"), (1_000, "1µs"), (999_999, "999µs"),
     (1_000_000, "1.0ms"), (9_999_999, "9.9ms"), (10_000_000, "10ms"), (999_999_999, "999ms"),
     (10**9, "1.00s"), (9_999_999_999, "9.99s"), (10**10, "10.0s"), (99_999_999_999, "99.9s"),
     (10**11, "100s"), (999_999_999_999, "999s"), (10**12, "16m"),
     (599_999_999_999_999, "9999m"), (600_000_000_000_000, "166h")],
)  # fmt: skip
def test_short_time_is_cut_never_rounded_up_past_its_unit(nanos, shown):
    assert top.short_time(nanos) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, "-"), (0, "0"), (9_999, "9999"), (10_000, "10k"), (9_999_999, "9999k"),
     (10_000_000, "10M"), (123_456_789, "123M")],
)  # fmt: skip
def test_short_count_is_cut_to_thousands_and_millions(value, shown):
    assert top.short_count(value) == shown


def test_a_wait_share_is_of_the_time_runnable_and_none_without_it():
    assert top.share(1, 3) == "25%"
    assert top.share(3, 0) == "100%"
    assert top.share(0, 0) == top.share(-1, 0) == "-"
    assert top.screen._percent(None, 4) == "-"
    assert top.screen._percent(1, 8) == "12%"


def head_lines(view, selection, **kwargs) -> list[str]:
    return [line.rstrip() for line in plain(top.render(view, selection, 80, **kwargs))]


def test_a_screen_starts_with_what_it_shows_by_what_and_when():
    """The head: the scope and the order, then the interval and its time, where the
    passes come from, a note on the view, and how to quit when live."""
    before = head_lines(None, top.Selection(), interval=2.5)
    assert before == [
        "procdelta top  node  by run delay  first pass done, the first interval in 2.5s"
    ]
    cut = head_lines(None, top.Selection(pod=("n", "p")), interval=2.5)  # 82 characters
    assert cut == [
        "procdelta top  pod n/p  by run delay  fi…t pass done, the first interval in 2.5s"
    ]
    stamp = 1.7e9
    view = top.View({"interval_seconds": 15, "timestamp": stamp, "processes": []}, note="a note")
    lines = head_lines(view, top.Selection(sort="on_cpu_nanos"), origin="http://x:1", live=True)
    clock = time.strftime("%H:%M:%S", time.localtime(stamp))
    assert lines[:4] == [
        f"procdelta top  node  by on-CPU  interval 15.00s at {clock}",
        "from http://x:1 (its passes; refreshed every 2s)",
        "a note",
        "q quits",
    ]
    unstamped = top.View({"interval_seconds": 1, "timestamp": "soon", "processes": []})
    lines = head_lines(unstamped, top.Selection(cgroup="/x", sort="read_bytes"))
    assert lines[0] == "procdelta top  cgroup /x  by read_bytes  interval 1.00s at --:--:--"
    assert head_lines(top.View({"processes": []}), top.Selection())[0] == (
        "procdelta top  node  by run delay  no interval yet"
    )


def test_a_process_row_shows_each_field_in_its_column():
    """Numbers right-aligned under their heads, the name left-aligned, the wait's share
    of the time runnable, a missing field `-`, the group last (node-wide only)."""
    process = {"pid": 12, "comm": "sh", "threads": 3, "on_cpu_nanos": 2_000_000,
               "run_delay_nanos": 6_000_000, "cpu_user_nanos": 1000, "cpu_system_nanos": None,
               "group": {"cgroup": "/a"}}  # fmt: skip
    view = top.View({"interval_seconds": 15, "timestamp": 1.7e9, "processes": [process]})
    lines = plain(top.render(view, top.Selection(), 80))
    assert lines[-2:] == [
        "    PID COMM             THR ON-CPU RUN-DELAY WAIT%  USER   SYS GROUP           ",
        "     12 sh                 3  2.0ms     6.0ms   75%   1µs     - /a              ",
    ]
    in_group = plain(top.render(view, top.Selection(cgroup="/a"), 80))
    row = "     12 sh                 3  2.0ms     6.0ms   75%   1µs     -"
    assert in_group[-1].rstrip() == row
    unnamed = top.View({"processes": [{**process, "group": {"namespace": "n"}}]})
    assert plain(top.render(unnamed, top.Selection(), 80))[-1].rstrip().endswith(" - ?")


def test_no_more_rows_than_the_screen_holds():
    processes = [{"pid": pid, "comm": "x", "group": {"cgroup": "/a"}} for pid in range(1, 6)]
    view = top.View({"interval_seconds": 1, "processes": processes})
    rows = plain(top.render(view, top.Selection(), 80, height=2))
    assert [line.split()[0] for line in rows[-3:]] == ["PID", "1", "2"]
    assert len(plain(top.render(view, top.Selection(), 80))) == len(rows) + 3


def test_the_group_column_takes_the_rest_of_the_width_and_at_least_8():
    processes = [{"pid": 1, "comm": "x", "group": {"cgroup": "/a-long-cgroup-name-here"}}]
    view = top.View({"interval_seconds": 1, "processes": processes})
    assert plain(top.render(view, top.Selection(), 80))[-1].endswith(" - /a-long-…me-here")
    for narrow in (40, 70):  # the fixed columns take 63
        assert plain(top.render(view, top.Selection(), narrow))[-1].endswith(" - /a-l…ere")


def test_a_group_without_processes_and_threads_not_yet_read_say_so():
    empty = top.View({"interval_seconds": 1, "processes": [], "groups": []})
    lines = head_lines(empty, top.Selection(pod=("n", "p")))
    assert "no process of pod n/p in this interval" in lines
    first = top.View({"interval_seconds": 1, "processes": []}, threads=[])
    lines = head_lines(first, top.Selection(cgroup="/x", threads=True))
    assert lines[-1] == "threads: first reading; their deltas from the next interval"
    row = top.ThreadRow(7, 8, "worker", 3_000_000, 1_000_000, 5, 6)
    read = top.View({"interval_seconds": 1, "processes": []}, threads=[row], threads_interval_ns=1)
    lines = head_lines(read, top.Selection(cgroup="/x", threads=True))
    assert lines[-2:] == [
        "    PID     TID THREAD          ON-CPU RUN-DELAY WAIT% VOL-CS INVOL-CS",
        "      7       8 worker           3.0ms     1.0ms   25%      5        6",
    ]


def test_a_group_line_names_a_pod_its_qos_and_its_processes():
    labels = {"namespace": "n", "pod": "p", "uid": "u", "qos": "burstable"}
    group = {"group": labels, "processes": 12_345, "run_delay_nanos": 5, "cpu_periods": 10}
    assert top.group_lines(group)[:2] == [
        "pod n/p  burstable  12k processes with a delta",
        "  cgroup CPU -  throttled -, -  CPU pressure -",
    ]
    assert top.group_lines({**group, "cpu_throttled_periods": 4, "run_delay_nanos": 0})[1] == (
        "  cgroup CPU -  throttled 4/10 periods, -  CPU pressure -"
    )
    unsplit = top.group_lines({**group, "run_delay_nanos": 1_500_000})
    assert unsplit[2] == "  run delay 1.5ms (no split by cause this interval)"
    nothing = top.group_lines({**group, **dict.fromkeys(top.screen.KERNEL_CAUSES, 0)})
    assert nothing[2:] == ["  run delay 5ns", "  wall wait 0"]
    pressure_only = top.group_lines({"group": {"cgroup": "/x"}, "cpu_pressure_waiting_nanos": 0})
    assert pressure_only[1] == "  cgroup CPU -  throttled -, -  CPU pressure 0"


def big_view() -> top.View:
    """Every cell as wide as it gets: long names, seven-digit PIDs, large counters."""
    fields = {
        "observed_nanos": 2 * 10**9,
        "on_cpu_nanos": 987_654_321_000,
        "run_delay_nanos": 123_456_789_000,
        "cpu_user_nanos": 999_990_000_000,
        "cpu_system_nanos": 10_000_000,
        "major_faults": 10**8,
        "voluntary_switches": 10**9,
        "nonvoluntary_switches": 12_345,
        "read_bytes": 0,
        "write_bytes": 0,
    }
    groups = [
        {"namespace": "a-very-long-namespace-name", "pod": "and-a-long-pod-name-7d9f8c6b5-x2x9z",
         "uid": str(uuid.uuid4()), "qos": "burstable"},
        {"cgroup": "/system.slice/some-very-long-unit-name-for-a-service.service"},
    ]  # fmt: skip
    processes = [
        {"pid": 4194303, "comm": "kube-controller", "group": group, "threads": 12_345, **fields}
        for group in groups
    ]
    group = {
        "group": groups[0],
        "processes": 12_345,
        **fields,
        "cgroup_cpu_nanos": 999_999_999_999,
        "cpu_periods": 1_000_000,
        "cpu_throttled_periods": 999_999,
        "cpu_throttled_nanos": 99_999_999_999,
        "cpu_pressure_waiting_nanos": 99_999_999_999,
        "run_delay_throttled_nanos": 100_000_000_000,
        "run_delay_own_threads_nanos": 20_000_000_000,
        "run_delay_neighbours_nanos": 3_456_789_000,
    }
    document = {
        "interval_seconds": 15.000123,
        "timestamp": 1.7e9,
        "processes": processes,
        "groups": [group],
    }
    threads = [top.ThreadRow(4194303, 4194302, "kube-controller", 10**12, 10**12, 10**9, 10**9)]
    return top.View(document, threads=threads, threads_interval_ns=10**9)


def plain(renderable) -> list[str]:
    console = top.plain_console(None)
    with console.capture() as captured:
        console.print(renderable)
    return captured.get().splitlines()


@pytest.mark.parametrize(
    "selection",
    [top.Selection(), top.Selection(pod=("ns", "p")), top.Selection(cgroup="/x", threads=True)],
    ids=["node", "pod", "threads"],
)
def test_the_widest_view_fits_80_columns(selection):
    view = big_view()
    lines = plain(top.render(view, selection, 80, "https://127.0.0.1:9746", live=True))
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    assert "\x1b" not in text
    if selection.threads:
        assert "4194302" in text and "kube-controller" in text
    else:
        assert "4194303" in text
    if selection.filters:  # the group's own cgroup line, its wait by cause
        assert "81% own limit (throttled) · 16% own threads · 3% neighbours" in text
        assert "999999/1000000 periods" in text
    else:  # each process's group, cut in its middle
        assert "a-very-l…" in text and "/system.…service" in text  # cut in the middle


def test_names_are_shown_never_acted_on():
    """A process names itself: an escape sequence, a line break or markup in its name is
    printed as `?` or as written, never sent to the terminal or read as style."""
    view = big_view()
    for process in view.document["processes"]:
        process["comm"] = "\x1b[2J[bold]x\n\x07"
    view.document["processes"][1]["group"] = {"cgroup": "/a\x1b]0;title\x07"}
    for live in (True, False):
        console = top.Console(width=80, force_terminal=True, color_system="truecolor")
        with console.capture() as captured:
            console.print(top.render(view, top.Selection(), 80, live=live))
        shown = captured.get()
        assert "\x1b[2J" not in shown and "\x1b]0" not in shown and "\x07" not in shown
        assert "?[2J[bold]x??" in shown and "/a?]0;title?" in shown


def test_a_group_line_says_what_its_cgroup_did_not_give():
    lines = top.group_lines({"group": {"cgroup": "/x"}, "processes": 1, "run_delay_nanos": 0})
    assert lines == [
        "cgroup /x  1 process with a delta",
        "  own cgroup: no reading this interval (first sight, or not read)",
        "  run delay 0",
    ]


def test_a_group_line_gives_why_it_waited_on_the_basis_it_has():
    """Moment by moment where its cgroup has CPU pressure (wall time, each moment to one
    cause), else its run delay split over the interval (thread-time)."""
    group = {
        "group": {"cgroup": "/x"},
        "processes": 1,
        "run_delay_nanos": 4_000_000_000,
        "cgroup_cpu_nanos": 200_000_000,
        "cpu_pressure_waiting_nanos": 1_000_000_000,
        "cpu_stalled_throttled_nanos": 800_000_000,
        "cpu_waiting_own_threads_nanos": 0,
        "cpu_stalled_neighbours_nanos": 200_000_000,
    }
    assert top.group_lines(group)[2:] == [
        "  run delay 4.00s",
        "  wall wait 1.00s: 80% own limit (throttled) · 0% own threads · 20% neighbours",
    ]
    interval = {**{k: v for k, v in group.items() if "stalled_" not in k and "own" not in k}}
    interval |= {
        "run_delay_throttled_nanos": 3_000_000_000,
        "run_delay_own_threads_nanos": 1_000_000_000,
        "run_delay_neighbours_nanos": 0,
    }
    assert top.group_lines(interval)[2:] == [
        "  run delay 4.00s: 75% own limit (throttled) · 25% own threads · 0% neighbours"
    ]


def test_threads_sort_by_the_sort_field_when_a_thread_has_it():
    rows = [top.ThreadRow(1, tid, "t", tid, 10 - tid, 0, 0) for tid in range(1, 6)]
    by_delay = top.View({"processes": []}, threads=list(rows))
    by_delay.cut(top.Selection(cgroup="/x", threads=True, limit=2))
    assert [r.tid for r in by_delay.threads] == [1, 2]
    by_cpu = top.View({"processes": []}, threads=list(rows))
    by_cpu.cut(top.Selection(cgroup="/x", threads=True, sort="on_cpu_nanos", limit=None))
    assert [r.tid for r in by_cpu.threads] == [5, 4, 3, 2, 1]
    by_bytes = top.View({"processes": []}, threads=list(rows))  # no such thread field
    by_bytes.cut(top.Selection(cgroup="/x", threads=True, sort="read_bytes", limit=None))
    assert [r.tid for r in by_bytes.threads] == [1, 2, 3, 4, 5]


def test_threads_and_processes_are_cut_to_the_limit_ties_by_tid():
    """The shown threads: most of the sort field first, equal ones by TID, no more than
    the limit (all of them without one), like the processes above them."""
    rows = [top.ThreadRow(1, tid, "t", 5, delay, 0, 0) for tid, delay in
            ((9, 3), (4, 7), (7, 3), (2, 3), (5, 7))]  # fmt: skip
    processes = [{"pid": pid} for pid in (1, 2, 3, 4)]
    view = top.View({"processes": list(processes)}, threads=list(rows))
    view.cut(top.Selection(cgroup="/x", threads=True, limit=4))
    assert [r.tid for r in view.threads] == [4, 5, 2, 7]
    assert view.document["processes"] == processes
    view = top.View({"processes": list(processes)}, threads=list(rows))
    view.cut(top.Selection(cgroup="/x", threads=True, limit=3))
    assert [r.tid for r in view.threads] == [4, 5, 2]
    assert view.document["processes"] == processes[:3]
    view = top.View({"processes": list(processes)}, threads=list(rows))
    view.cut(top.Selection(cgroup="/x", threads=True, sort="on_cpu_nanos", limit=None))
    assert [r.tid for r in view.threads] == [2, 4, 5, 7, 9]
    assert view.document["processes"] == processes
    view = top.View({})
    view.cut(top.Selection(limit=2))
    assert view.document == {"processes": []} and view.threads is None


@pytest.mark.parametrize(
    ("value", "pod"),
    [("ns/p", ("ns", "p")), ("p", None), ("/p", None), ("ns/", None), ("a/b/c", None)],
)
def test_a_pod_is_its_namespace_and_name(value, pod):
    assert top.parse_pod(value) == pod


def test_a_selection_says_what_it_asks_for():
    """Filters and scope by pod, cgroup or node; with --threads every process of the group
    is asked for (their threads are all read), cut afterwards; threads sort by the sort
    field where a thread has it, else by run delay."""
    pod = top.Selection(pod=("n", "p"), sort="on_cpu_nanos", limit=3)
    assert pod.filters == (("namespace", "n"), ("pod", "p")) and pod.scope == "pod n/p"
    assert pod.query() == Query((("namespace", "n"), ("pod", "p")), "on_cpu_nanos", 3)
    assert pod.thread_sort == "on_cpu_nanos"
    threads = top.Selection(cgroup="/x", sort="read_bytes", limit=3, threads=True)
    assert threads.filters == (("cgroup", "/x"),) and threads.scope == "cgroup /x"
    assert threads.query() == Query((("cgroup", "/x"),), "read_bytes", None)
    assert threads.thread_sort == "run_delay_nanos"
    node = top.Selection()
    assert node.filters == () and node.scope == "node"
    assert node.query() == Query()


def test_a_views_json_carries_its_threads_only_when_asked_for():
    document = {"interval_seconds": 1.0, "processes": []}
    assert top.View(dict(document)).as_json() == document
    row = top.ThreadRow(1, 2, "t", 3, 4, 5, 6)
    first = top.View(dict(document), threads=[row]).as_json()
    assert first == {**document, "threads_interval_seconds": None, "threads": [row.as_dict()]}
    later = top.View(dict(document), threads=[], threads_interval_ns=2_500_000_000).as_json()
    assert later == {**document, "threads_interval_seconds": 2.5, "threads": []}


class FakeSource:
    """Views handed out in turn; `origin` as a server's."""

    origin = "http://x:1"

    def __init__(self, *documents):
        self.documents = list(documents)

    def fetch(self) -> top.View:
        return top.View(self.documents.pop(0), pids={7: "x"})


class FakeThreads:
    """Reads: a row per PID asked for, the interval known from the second reading on."""

    def __init__(self):
        self.reads: list[list[int]] = []
        self.interval_ns = None

    def read(self, pids) -> list[top.ThreadRow]:
        self.reads.append(list(pids))
        self.interval_ns = None if len(self.reads) == 1 else 10**9
        return [top.ThreadRow(pid, tid, "t", tid, 0, 0, 0) for pid in pids for tid in (1, 2)]


def test_a_viewer_joins_the_threads_and_cuts_to_the_limit():
    document = {"interval_seconds": 1, "processes": [{"pid": 7}, {"pid": 8}]}
    selection = top.Selection(cgroup="/x", threads=True, sort="on_cpu_nanos", limit=1)
    threads = FakeThreads()
    viewer = top.Viewer(FakeSource({}, dict(document)), selection, threads)
    assert viewer.origin == "http://x:1"
    assert viewer.step() is None  # a first pass: the threads' first reading only
    view = viewer.step()
    assert threads.reads == [[7], [7]]
    assert view.document["processes"] == [{"pid": 7}]
    assert [r.tid for r in view.threads] == [2] and view.threads_interval_ns == 10**9


def test_one_interval_is_one_answer_or_two_passes_an_interval_apart():
    document = {"interval_seconds": 1, "processes": []}
    slept: list[float] = []
    served = top.Viewer(FakeSource(dict(document)), top.Selection())
    assert top.one_interval(served, 3, slept.append).document == document and slept == []
    threads = FakeThreads()
    selection = top.Selection(cgroup="/x", threads=True, limit=1)
    with_threads = top.Viewer(FakeSource(dict(document)), selection, threads)
    view = top.one_interval(with_threads, 3, slept.append)
    assert slept == [3] and threads.reads == [[7], [7]]
    assert view.threads_interval_ns == 10**9 and [r.tid for r in view.threads] == [1]
    own = top.Viewer(FakeSource({}, dict(document)), top.Selection())
    assert top.one_interval(own, 2, slept.append).document == document and slept == [3, 2]
    failed = top.Viewer(FakeSource({}, {}), top.Selection())
    with pytest.raises(top.TopError, match="the pass over the proc filesystem failed"):
        top.one_interval(failed, 2, slept.append)


def test_printable_text_is_kept_as_it_is():
    text = "web-0 ü"
    assert top.printable(text) is text
    assert top.printable("a\x1b[2Jb\tc") == "a?[2Jb?c"


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
    source = top.LocalSource(FirstPassEngine(groups=2), selection)
    assert source.origin == ""
    first = source.fetch()
    assert first.document == {} and first.pids == {10: "", 11: ""}
    second = source.fetch()
    assert second.pids == {10: "", 11: ""}
    assert second.document["interval_seconds"] == 1e-9
    assert [g["group"] for g in second.document["groups"]] == [{"cgroup": "/g0"}]
    assert "cgroup_cpu_nanos" in second.document["groups"][0]
    without = top.LocalSource(FirstPassEngine(groups=2), top.Selection(cgroup="/g0"), False)
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
        view = top.RemoteSource(remote, selection, ProcFS(str(tmp_path))).fetch()
    assert view.pids == {10: "main", 11: "worker"}


def test_from_asks_the_server_for_the_pod_in_its_namespace_and_the_sort():
    """--from asks /processes for exactly what was selected: a pod by namespace and name
    (a name alone matches its namesakes in other namespaces) and the sort (the server cuts
    to the limit by it: top cannot sort what it was not sent)."""
    pod = top.Selection(pod=("prod", "web-0"), sort="on_cpu_nanos", limit=5)
    source = top.RemoteSource(top.Remote("http://127.0.0.1:9746"), pod)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(source.url).query))
    assert query == {"namespace": "prod", "pod": "web-0", "sort": "on_cpu_nanos", "limit": "5"}
    node = top.RemoteSource(top.Remote("127.0.0.1:9746/"), top.Selection(limit=None))
    assert node.url == "http://127.0.0.1:9746/processes?sort=run_delay_nanos&limit=0"


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--pod", "just-a-name"], ["--pod", "NAMESPACE/NAME"]),
        (["--pod", "a/b/c"], ["--pod", "NAMESPACE/NAME"]),
        (["--pod", "/b"], ["--pod"]),
        (["--cgroup", "relative/path"], ["--cgroup"]),
        (["--pod", "a/b", "--cgroup", "/x"], ["--pod", "--cgroup"]),
        (["--threads"], ["--threads", "--pod", "--cgroup"]),
        (["--sort", "comm"], ["--sort", "comm"]),
        (["--limit", "-1"], ["--limit"]),
        (["--interval", "0"], ["--interval"]),
        (["--format", "prometheus"], ["--format"]),
        (["--from", "ftp://example.invalid"], ["--from", "http://"]),
        (["--from", "127.0.0.1:port"], ["--from", "http://"]),
        (["--from", "http://[::1"], ["--from", "http://"]),
        (["--from", "http://127.0.0.1:1", "--from.key-file", "k"], ["--from.cert-file"]),
        (["--from", "http://127.0.0.1:1", "--from.password-file", "p"], ["--from.username"]),
    ],
)
def test_bad_input_is_one_clear_line(args, words):
    assert_one_line_error(procdelta("top", "--format", "json", *args), *words)


def test_a_bad_value_from_the_environment_names_its_variable():
    result = procdelta("top", "--format", "json", env={"PROCDELTA_POD": "nope"})
    assert_one_line_error(result, "PROCDELTA_POD (for --pod)", "NAMESPACE/NAME")


def test_an_unreachable_server_is_one_line():
    port = free_port()  # nothing listens there
    result = procdelta("top", "--from", f"127.0.0.1:{port}", "--format", "json")
    assert_one_line_error(result, f"--from http://127.0.0.1:{port}", "cannot connect", status=1)


@contextlib.contextmanager
def hostile(answer) -> Iterator[tuple[int, list[bytes]]]:
    """A server on 127.0.0.1 that reads each request's head, records it and hands the
    socket to `answer(sock, port)`; (its port, the heads it read)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    heads: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                sock, _ = server.accept()
            except OSError:
                return
            with sock:
                head = b""
                while b"\r\n\r\n" not in head and (chunk := sock.recv(4096)):
                    head += chunk
                heads.append(head)
                with contextlib.suppress(OSError):
                    answer(sock, port)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port, heads
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        server.close()
        thread.join(10)


def top_from(port: int, *args: str) -> subprocess.CompletedProcess:
    return procdelta("top", "--from", f"http://127.0.0.1:{port}", "--format", "json", *args)


def fetched(port: int, scheme: str = "http", **remote) -> str:
    """The one line a RemoteSource's fetch from 127.0.0.1:`port` fails with."""
    source = top.RemoteSource(top.Remote(f"{scheme}://127.0.0.1:{port}", **remote), top.Selection())
    with pytest.raises(top.TopError) as raised:
        source.fetch()
    return str(raised.value)


def answering(status: bytes, body: bytes = b""):
    def answer(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, len(body)) + body)

    return answer


def test_an_answer_over_the_cap_is_refused_in_process(monkeypatch):
    monkeypatch.setattr(top.remote, "MAX_ANSWER_BYTES", 1 << 20)
    body = b'{"processes": []}'.ljust((1 << 20) + 1)
    with hostile(answering(b"200 OK", body)) as (port, _):
        assert fetched(port).endswith(": an answer over 1 MiB is no procdelta /processes answer")
    with hostile(answering(b"200 OK", body[: 1 << 20])) as (port, _):  # at the cap: taken
        source = top.RemoteSource(top.Remote(f"http://127.0.0.1:{port}"), top.Selection())
        assert source.fetch().document == {"processes": [], "groups": []}


@pytest.mark.parametrize(
    ("status", "body", "remote", "said"),
    [
        (b"401 Unauthorized", b"", {}, "401 Unauthorized: the server wants basic auth; give "
         "--from.username and --from.password-file"),
        (b"401 Unauthorized", b"", {"username": "bob"}, "401 Unauthorized: the server refused "
         "user 'bob' (check --from.username and --from.password-file)"),
        (b"404 Not Found", b"", {}, "404 Not Found: no /processes there (a procdelta serve "
         "started with --no-web.processes, or not procdelta; --from takes the server's base URL)"),
        (b"301 Moved", b"", {}, "301: the server redirects, which procdelta serve never does; "
         "not followed (--from takes the server's own base URL)"),
        (b"399 Odd", b"", {}, "399: the server redirects, which procdelta serve never does; "
         "not followed (--from takes the server's own base URL)"),
        (b"400 Odd", b"\n", {}, "400 Odd"),
        (b"503 Busy", b"too many\x1b[2J\nsecond line", {}, "503 too many?[2J"),
        (b"500 Oops", b"x" * 300, {}, "500 " + "x" * 200),
    ],
)  # fmt: skip
def test_a_refusal_is_said_in_one_line_of_what_to_do(status, body, remote, said):
    with hostile(answering(status, body)) as (port, _):
        line = fetched(port, **remote)
    assert line.startswith(f"--from http://127.0.0.1:{port}: {said}"), line
    assert "second line" not in line and line.endswith(said[-10:])


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"processes": []}, None),
        ({"processes": [], "groups": None}, "no list of processes and groups"),
        ({"processes": [], "interval_seconds": None}, None),
        ({"processes": [], "interval_seconds": 2}, None),
        ({"processes": [], "interval_seconds": True}, "interval_seconds is not a number"),
        ({"processes": [], "interval_seconds": float("inf")}, "interval_seconds is not a number"),
        ({"processes": [{"pid": 0, "comm": "x", "group": {}, "on_cpu_nanos": None}]}, None),
        ({"processes": [{"pid": True, "comm": "x", "group": {}}]}, "processes[0] has no pid"),
        ({"processes": [{"pid": -1, "comm": "x", "group": {}}]}, "processes[0] has no pid"),
        ({"processes": [{"pid": 1, "comm": 5, "group": {}}]}, "processes[0] has no pid and comm"),
        ({"processes": [{"pid": 1, "comm": "x", "group": {1: "a"}}]}, "processes[0].group"),
        ({"processes": [{"pid": 1, "comm": "x", "group": []}]}, "processes[0].group"),
        ({"processes": [{"pid": 1, "comm": "x", "group": {}, "x\x1b" + "y" * 50: 1.5}]},
         "processes[0].x?" + "y" * 38 + " is not a count"),
        ({"processes": [], "groups": [{"group": {"cgroup": "/"}, "pid": "no"}]},
         "groups[0].pid is not a count"),
        ({"processes": [], "groups": [{"group": {"cgroup": "/"}, "processes": 3}, 4]},
         "groups[1] is not an object"),
    ],
)  # fmt: skip
def test_the_shape_of_an_answer_is_checked_field_by_field(document, problem):
    said = top.remote._misshapen(document)
    if problem is None:  # and an answer without groups has an empty list of them
        assert said is None and isinstance(document["groups"], list)
    else:
        assert said is not None and said.startswith(problem), said


@contextlib.contextmanager
def plain_http() -> Iterator[int]:
    """A server on 127.0.0.1 that answers a plain HTTP 400 as soon as a client connects,
    before reading anything (a TLS handshake sent to it, say); its port."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            sock, _ = server.accept()
            with sock:
                sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        thread.join(10)


def test_what_a_server_sends_that_is_not_a_procdelta_answer_is_named():
    with hostile(answering(b"200 OK", b"{not json")) as (port, _):
        assert fetched(port).endswith(": not a procdelta /processes answer (not a JSON object)")
    with hostile(lambda sock, port: sock.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")) as (port, _):
        assert fetched(port).startswith(f"--from http://127.0.0.1:{port}: not an HTTP answer: ")
    with hostile(lambda sock, port: None) as (port, _):  # closed without a word
        assert fetched(port).endswith(": the connection was closed before an answer (is it https?)")
    with plain_http() as port:  # TLS to plain http
        assert fetched(port, "https").endswith(": TLS: wrong version number (is it plain http?)")
    port = free_port()
    assert fetched(port) == f"--from http://127.0.0.1:{port}: cannot connect: Connection refused"


def test_the_request_says_who_asks_and_with_what(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("pa:ss\n")
    with hostile(answering(b"200 OK", b'{"processes": []}')) as (port, heads):
        remote = top.Remote(f"127.0.0.1:{port}/", username="al", password_file=str(secret))
        selection = top.Selection(cgroup="/x", sort="on_cpu_nanos", limit=None)
        source = top.RemoteSource(remote, selection)
        assert source.origin == f"http://127.0.0.1:{port}"
        view = source.fetch()
    assert view.document == {"processes": [], "groups": []} and view.pids == {}
    head = heads[0].decode()
    assert head.startswith("GET /processes?cgroup=%2Fx&sort=on_cpu_nanos&limit=0 HTTP/1.1\r\n")
    token = base64.b64encode(b"al:pa:ss").decode()
    assert f"\r\nAuthorization: Basic {token}\r\n" in head
    assert "\r\nAccept: application/json\r\n" in head
    assert f"\r\nUser-Agent: procdelta-top/{collector.__version__}\r\n" in head
    anonymous = top.RemoteSource(top.Remote("http://h"), top.Selection())
    assert "Authorization" not in anonymous.headers and anonymous.origin == "http://h"
    no_password = top.RemoteSource(top.Remote("http://h", username="al"), top.Selection())
    assert no_password.headers["Authorization"] == "Basic " + base64.b64encode(b"al:").decode()
    assert no_password.context is None


@contextlib.contextmanager
def tls_server(pki: Path, client_ca: bool = False) -> Iterator[int]:
    """A TLS server on 127.0.0.1 with the test CA's certificate (asking for a client
    certificate the CA signed, where `client_ca`), answering one request `{"processes":
    []}`; its port."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki / "ca.crt")
    server = socket.create_server(("127.0.0.1", 0))
    body = b'{"processes": []}'

    def serve() -> None:
        while True:
            try:
                sock, _ = server.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), sock:
                sock.settimeout(5)
                try:
                    tls = context.wrap_socket(sock, server_side=True)
                except ssl.SSLError:
                    # the alert is sent: read on until the client closes, so that closing
                    # with its request unread does not reset the connection before the
                    # client has read the alert (it would see a reset, not the TLS error)
                    while sock.recv(65536):
                        pass
                    continue
                with tls:
                    tls.recv(65536)
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
                    tls.sendall(body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(10)


def test_a_tls_failure_says_what_to_give(pki):
    """An untrusted server names --from.ca-file; one that wants a client certificate
    names --from.cert-file; with them, the answer comes through."""
    with tls_server(pki) as port:
        said = fetched(port, "https")
        assert said == (
            f"--from https://127.0.0.1:{port}: TLS: unable to get local issuer certificate "
            "(give --from.ca-file, or --from.insecure-skip-verify)"
        )
        trusted = top.Remote(f"https://127.0.0.1:{port}", ca_file=str(pki / "ca.crt"))
        assert top.RemoteSource(trusted, top.Selection()).fetch().document["processes"] == []
    with tls_server(pki, client_ca=True) as port:
        said = fetched(port, "https", ca_file=str(pki / "ca.crt"))
        assert said.startswith(f"--from https://127.0.0.1:{port}: TLS: ")
        assert said.endswith(
            " (does it want a client certificate? --from.cert-file, --from.key-file)"
        )
        certified = top.Remote(f"https://127.0.0.1:{port}", ca_file=str(pki / "ca.crt"),
                               cert_file=str(pki / "client.crt"),
                               key_file=str(pki / "client.key"))  # fmt: skip
        assert top.RemoteSource(certified, top.Selection()).fetch().document["processes"] == []


@pytest.mark.parametrize(
    ("remote", "said"),
    [
        ({"key_file": "k"}, "--from.key-file needs --from.cert-file"),
        ({"password_file": "p"}, "--from.password-file needs --from.username"),
        ({"username": "u", "password_file": "/nonexistent/p"},
         "--from.password-file /nonexistent/p: No such file or directory"),
    ],
)  # fmt: skip
def test_credentials_that_cannot_be_used_are_one_line(remote, said):
    with pytest.raises(top.BadValue) as raised:
        top.RemoteSource(top.Remote("http://h", **remote), top.Selection())
    assert str(raised.value) == said


def test_the_client_tls_trusts_what_it_is_told(pki, tmp_path):
    https = top.Remote("https://h", ca_file=str(pki / "ca.crt"))
    context = top.RemoteSource(https, top.Selection()).context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    insecure = top.remote.tls_context(top.Remote("https://h", insecure_skip_verify=True))
    assert insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
    top.remote.tls_context(top.Remote("https://h", cert_file=str(pki / "client.crt"),
                                      key_file=str(pki / "client.key")))  # fmt: skip
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for remote, said in (
        (top.Remote("https://h", ca_file=str(tmp_path / "none")),
         f"--from.ca-file {tmp_path / 'none'}: No such file or directory"),
        (top.Remote("https://h", cert_file=str(garbage)), f"--from.cert-file {garbage}: "),
        (top.Remote("https://h", cert_file=str(pki / "client.crt"), key_file=str(pki / "ca.key")),
         f"--from.cert-file {pki / 'client.crt'}: key values mismatch"),
    ):  # fmt: skip
        with pytest.raises(top.BadValue) as raised:
            top.remote.tls_context(remote)
        assert str(raised.value).startswith(said) and "\n" not in str(raised.value)
        assert said.endswith(": ") or str(raised.value) == said


@pytest.mark.parametrize(
    ("url", "asked"),
    [
        ("h:1", "http://h:1/processes?a=b"),
        ("https://h", "https://h/processes?a=b"),
        ("http://h:1/x/", "http://h:1/x/processes?a=b"),
        ("http://h:1/processes", "http://h:1/processes?a=b"),
        ("http://h:1/processes/?old=1", "http://h:1/processes?a=b"),
    ],
)
def test_the_processes_url_of_a_base_url(url, asked):
    assert top.processes_url(url, {"a": "b"}) == asked


@pytest.mark.parametrize("url", ["ftp://h", "http://", "h:port", "http://[::1", "https:///x"])
def test_a_url_that_is_no_server_is_refused(url):
    with pytest.raises(top.BadValue, match="want http://HOST:PORT or https://HOST:PORT"):
        top.processes_url(url, {})


def test_a_redirect_is_not_followed_with_the_credentials(tmp_path):
    """procdelta serve never redirects: a 302 to another port (where the credentials would
    go) is an error, and the other port hears nothing."""
    with hostile(lambda sock, port: None) as (elsewhere, stolen):

        def redirect(sock: socket.socket, port: int) -> None:
            sock.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/processes\r\n"
                         b"Content-Length: 0\r\n\r\n" % elsewhere)  # fmt: skip

        with hostile(redirect) as (port, heads):
            secret = tmp_path / "password"
            secret.write_text("s3cret\n")
            result = top_from(port, "--from.username", "alice", "--from.password-file", str(secret))
    assert_one_line_error(result, "302", "redirects", "not followed", status=1)
    assert len(heads) == 1 and b"Authorization: Basic" in heads[0]
    assert stolen == []


def test_what_a_server_says_reaches_the_terminal_as_printable_text():
    """An error's text with a terminal's escape sequences (a window title, a screen
    clear) comes through with none of them."""

    def evil(sock: socket.socket, port: int) -> None:
        body = b"\x1b]0;pwned\x07\x1b[2J\x1b[31mred\n"
        sock.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    with hostile(evil) as (port, _):
        result = top_from(port)
    assert_one_line_error(result, "500", "pwned", "red", status=1)
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def test_an_answer_too_large_is_refused_without_holding_it():
    """An answer of up to 1 GiB: read up to the cap, then an error."""

    def huge(sock: socket.socket, port: int) -> None:
        # no length said: up to 1 GiB, until the client stops reading
        sock.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        chunk = b"0" * (1 << 20)
        for _ in range(1024):
            sock.sendall(chunk)

    with hostile(huge) as (port, _):
        # in 400 MiB of address space: the answer held whole would not fit
        result = subprocess.run(
            ["prlimit", f"--as={400 << 20}", sys.executable, "-m", "collector", "top",
             "--from", f"http://127.0.0.1:{port}", "--format", "json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert_one_line_error(result, "over 32 MiB", "no procdelta /processes answer", status=1)


def test_a_server_that_trickles_is_cut_off_at_the_deadline(monkeypatch):
    """A byte every 0.2 s never trips a read's timeout; the whole GET has one deadline."""
    monkeypatch.setattr(top.remote, "REQUEST_TIMEOUT", 1.0)

    def trickle(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(50):
            sock.sendall(b" ")
            time.sleep(0.2)

    with hostile(trickle) as (port, _):
        source = top.RemoteSource(top.Remote(f"http://127.0.0.1:{port}"), top.Selection())
        started = time.monotonic()
        with pytest.raises(top.TopError, match="no answer within 1s"):
            source.fetch()
        assert time.monotonic() - started < 3


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ([], "not a JSON object"),
        ({"processes": {}}, "no list of processes"),
        ({"processes": [], "interval_seconds": "soon"}, "interval_seconds"),
        ({"processes": [7]}, "processes[0] is not an object"),
        ({"processes": [{"pid": 1, "comm": "x", "group": {"pod": 1}}]}, "processes[0].group"),
        ({"processes": [{"pid": "1", "comm": "x", "group": {}}]}, "processes[0] has no pid"),
        ({"processes": [{"pid": 1, "comm": "x", "group": {}, "on_cpu_nanos": -5}]},
         "processes[0].on_cpu_nanos is not a count"),
        ({"processes": [], "groups": [{"group": {}, "run_delay_nanos": 1.5}]},
         "groups[0].run_delay_nanos is not a count"),
    ],
)  # fmt: skip
def test_a_document_of_another_shape_is_refused_before_it_is_drawn(document, problem):
    def answer(sock: socket.socket, port: int) -> None:
        body = json.dumps(document).encode()
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    with hostile(answer) as (port, _):
        result = procdelta("top", "--from", f"http://127.0.0.1:{port}")
    assert_one_line_error(result, "not a procdelta /processes answer", problem, status=1)


def test_a_server_without_the_processes_view_is_one_line():
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    server = make_server("127.0.0.1:0", loop, "/metrics", None, None, processes=False)
    with contextlib.ExitStack() as stack:
        thread = threading.Thread(target=server.serve_forever)
        thread.start()
        stack.callback(thread.join, 10)
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        port = server.server_address[1]
        result = procdelta("top", "--from", f"http://127.0.0.1:{port}/", "--format", "json")
        wrong = procdelta("top", "--from", f"http://127.0.0.1:{port}/metrics", "--format", "json")
    assert_one_line_error(result, "404", "/processes", "--no-web.processes", status=1)
    # a URL with a path: the one asked is named, and what --from takes
    assert_one_line_error(wrong, "404", "/metrics/processes", "base URL", status=1)


def test_the_served_document_comes_through_whole():
    """With --from, the JSON is the server's own document: its interval, its processes."""
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    with serving(loop) as port:
        result = procdelta("top", "--from", f"http://127.0.0.1:{port}", "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    # without credentials: no process's storage bytes, and the document says so
    assert set(document) == {"interval_seconds", "timestamp", "processes", "groups", "withheld"}
    assert document["withheld"] == ["read_bytes", "write_bytes"]
    assert document["processes"] == []  # the counting engine keeps no process table


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
        # (as tests/test_end_to_end.py sets it): once its quota refills it runs at once, so
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


# --- plain text off a terminal -----------------------------------------------------------


def interruptible() -> None:
    """In `top`'s child before it runs: SIGINT as a terminal's shell leaves it. A shell
    starting the tests in the background (`cmd &`, a CI runner's script) ignores SIGINT, its
    children inherit that, and Python then installs no KeyboardInterrupt handler: `top`
    would never see the Ctrl-C these tests send."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


class Steps:
    """A viewer whose steps hand out `views` in turn (an exception is raised), then raise
    KeyboardInterrupt."""

    origin = ""

    def __init__(self, *views):
        self.views = list(views)
        self.steps = 0

    def step(self):
        self.steps += 1
        if not self.views:
            raise KeyboardInterrupt
        view = self.views.pop(0)
        if isinstance(view, Exception):
            raise view
        return view


def one_process(pid: int) -> top.View:
    process = {"pid": pid, "comm": "x", "group": {"cgroup": "/a"}}
    return top.View({"interval_seconds": 1, "processes": [process]})


def test_plain_text_is_a_block_per_interval_until_interrupted():
    """Off a terminal: nothing for a first pass, then each interval's block, a blank line
    between blocks, no trailing spaces; Ctrl-C ends it quietly."""
    out = io.StringIO()
    top.run_plain(Steps(None, one_process(11), one_process(22)), top.Selection(), 0, out)
    text = out.getvalue()
    assert text.startswith("procdelta top  node") and text.endswith(" /a\n")
    blocks = text.split("\n\nprocdelta top  node")
    assert len(blocks) == 2 and " 11 x " in blocks[0] and " 22 x " in blocks[1]
    assert all(line == line.rstrip() for line in out.getvalue().splitlines())


class FakeLive:
    def __init__(self):
        self.drawn: list[str] = []

    def update(self, renderable, refresh: bool) -> None:
        assert refresh
        self.drawn.append("\n".join(line.rstrip() for line in plain(renderable)))


@contextlib.contextmanager
def live_pipes() -> Iterator[tuple[int, int, int, int]]:
    """(keys' read end, its write end, resizes' read end, its write end)."""
    keys, typed = os.pipe()
    resized, resize = os.pipe2(os.O_NONBLOCK)
    try:
        yield keys, typed, resized, resize
    finally:
        for fd in (keys, typed, resized, resize):
            with contextlib.suppress(OSError):
                os.close(fd)


def live_loop(viewer, interval: float, keys, resized, live: FakeLive | None = None) -> FakeLive:
    """The live loop on an 80-by-24 console, drawing into `live` (a new one by default)."""
    live = live if live is not None else FakeLive()
    console = top.Console(width=80, height=24)
    top.terminal._live_loop(live, console, viewer, top.Selection(), interval, keys, resized)
    return live


def test_the_live_loop_redraws_on_a_key_or_a_resize_and_quits_on_q():
    with live_pipes() as (keys, typed, resized, resize):
        os.write(resize, b".")
        os.write(typed, b"x")
        viewer = Steps(one_process(11))
        waiting = threading.Timer(0.5, os.write, (typed, b"Q"))
        waiting.start()
        try:
            live = live_loop(viewer, 60, keys, resized)
        finally:
            waiting.cancel()
        # drawn once, again for the resize and the key (ready together), not refreshed
        assert viewer.steps == 1 and len(live.drawn) == 2
        assert all(" 11 x " in screen and "q quits" in screen for screen in live.drawn)
        with pytest.raises(BlockingIOError):  # the resize read, not left to wake it again
            os.read(resized, 64)


def test_the_live_loop_refreshes_every_interval_and_keeps_the_last_view_on_a_failure():
    with live_pipes() as (keys, _typed, resized, _resize):
        viewer = Steps(one_process(11), top.TopError("gone"), None, one_process(22))
        with pytest.raises(KeyboardInterrupt):  # the viewer's end, after its views
            live_loop(viewer, 0.01, keys, resized)
        assert viewer.steps == 5
    with live_pipes() as (_, _typed, resized, _resize):
        viewer = Steps(one_process(11), top.TopError("gone"), None, one_process(22))
        live = FakeLive()
        with pytest.raises(KeyboardInterrupt):
            live_loop(viewer, 0.01, None, resized, live)
        assert [" 11 x " in s for s in live.drawn] == [True, True, True, False]
        assert "refresh failed: gone" in live.drawn[1] and "refresh failed" in live.drawn[2]
        assert " 22 x " in live.drawn[3]


def test_the_live_loop_goes_on_refreshing_after_its_input_ends():
    with live_pipes() as (keys, typed, resized, _resize):
        os.close(typed)
        viewer = Steps(one_process(11), one_process(22))
        with pytest.raises(KeyboardInterrupt):
            live_loop(viewer, 0.01, keys, resized)
        assert viewer.steps == 3


def test_a_first_view_that_fails_ends_the_live_loop_with_its_error():
    with live_pipes() as (keys, _, resized, _), pytest.raises(top.TopError, match="refused"):
        live_loop(Steps(top.TopError("refused")), 60, keys, resized)


def test_the_live_screen_off_a_terminal_ends_quietly_on_ctrl_c(capsys):
    """Without a terminal on stdin no cbreak mode is set; Ctrl-C (the viewer's end) gives
    the screen back without a traceback."""
    viewer = Steps(one_process(11))
    top.run_live(viewer, top.Selection(), 0.01)
    assert viewer.steps == 2 and "Traceback" not in capsys.readouterr().err


def test_sigterm_and_sighup_stop_the_screen_and_their_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for signum in before:
        with pytest.raises(top.terminal._Stop), top.terminal._signals_stop():
            os.kill(os.getpid(), signum)
            time.sleep(1)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_resize_writes_a_byte_to_wait_on_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGWINCH)
    with top.terminal._resizes() as resized:
        os.kill(os.getpid(), signal.SIGWINCH)
        os.kill(os.getpid(), signal.SIGWINCH)
        assert os.read(resized, 64) == b".."
    assert signal.getsignal(signal.SIGWINCH) == before
    with pytest.raises(OSError):
        os.fstat(resized)


def test_logs_wait_while_the_screen_is_taken_the_last_50_kept():
    root = logging.getLogger()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep()
    root.addHandler(keep)
    try:
        with top.terminal._logs_held():
            for n in range(60):
                logging.getLogger("collector.test").warning("line %d", n)
            assert seen == []
        assert seen == [f"line {n}" for n in range(10, 60)]
        assert keep in root.handlers
    finally:
        root.removeHandler(keep)


def test_json_is_one_indented_document():
    out = io.StringIO()
    top.print_json(top.View({"processes": []}, threads=[]), out)
    assert (
        out.getvalue()
        == json.dumps({"processes": [], "threads_interval_seconds": None, "threads": []}, indent=2)
        + "\n"
    )


# --- the live screen in a pseudo-terminal ------------------------------------------------


class Terminal:
    """`procdelta top` on a pseudo-terminal of 80x24 that is its controlling terminal."""

    def __init__(self, *args: str):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.slave = slave
        self.before = termios.tcgetattr(slave)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "collector", "top", "--interval", "0.5", *args],
            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
            preexec_fn=lambda: (interruptible(), fcntl.ioctl(0, termios.TIOCSCTTY, 0)),
            env={**os.environ, "TERM": "xterm-256color"},
        )  # fmt: skip
        self.output = b""

    def read_until(self, pattern: bytes, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while pattern not in self.output and time.time() < deadline:
            self._drain(0.1)
        assert pattern in self.output, self.output[-2000:]

    def _drain(self, timeout: float) -> None:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            with contextlib.suppress(OSError):
                self.output += os.read(self.master, 65536)

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = 15) -> int:
        deadline = time.time() + timeout
        while self.process.poll() is None and time.time() < deadline:
            self._drain(0.1)
        self._drain(0.1)
        return self.process.wait(timeout=1)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def terminal() -> Iterator[callable]:
    made: list[Terminal] = []

    def make(*args: str) -> Terminal:
        made.append(Terminal(*args))
        return made[-1]

    yield make
    for each in made:
        each.close()


ENTER_SCREEN, LEAVE_SCREEN = b"\x1b[?1049h", b"\x1b[?1049l"


@pytest.mark.parametrize(
    "key", [b"q", b"\x03", signal.SIGTERM, signal.SIGHUP], ids=["q", "ctrl-c", "term", "hup"]
)
def test_the_live_screen_quits_and_gives_the_terminal_back(terminal, key):
    screen = terminal("--limit", "5")
    screen.read_until(ENTER_SCREEN)
    screen.read_until(b"s at ")  # "interval 0.50s at ...": a refresh after the first pass
    assert termios.tcgetattr(screen.slave) != screen.before  # cbreak: no echo, no lines
    if isinstance(key, bytes):
        screen.type(key)
    else:  # the session's end: `kubectl exec` closed, the terminal hung up
        screen.process.send_signal(key)
    assert screen.wait() == 0
    assert termios.tcgetattr(screen.slave) == screen.before
    assert screen.output.rindex(LEAVE_SCREEN) > screen.output.rindex(ENTER_SCREEN)
    shown = ANSI.sub(b"", screen.output).decode("utf-8", "replace")
    assert "procdelta top  node  by run delay  interval" in shown
    assert "PID COMM" in shown and "Traceback" not in shown


def test_an_error_in_the_live_screen_is_one_line_and_gives_the_terminal_back(terminal):
    screen = terminal("--from", f"http://127.0.0.1:{free_port()}")
    code = screen.wait()
    assert code == 1
    assert termios.tcgetattr(screen.slave) == screen.before
    after = screen.output[screen.output.rindex(LEAVE_SCREEN) + len(LEAVE_SCREEN) :]
    lines = ANSI.sub(b"", after).decode().strip().splitlines()
    assert len(lines) == 1 and "cannot connect" in lines[0], lines


def test_a_resized_terminal_is_redrawn_at_once(terminal):
    screen = terminal("--interval", "60")  # no refresh due while the test runs
    screen.read_until(b"first pass done")
    mark = len(screen.output)
    fcntl.ioctl(screen.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))

    def widths() -> set[int]:
        """The widths of the lines of the frames drawn since (each from the screen's top)."""
        frames = screen.output[mark:].split(b"\x1b[H")[1:]
        shown = ANSI.sub(b"", b"\r\n".join(frames)).decode("utf-8", "replace")
        return {len(line) for line in shown.split("\r\n")}

    deadline = time.time() + 10
    while 100 not in widths() and time.time() < deadline:
        screen._drain(0.1)
    assert 100 in widths() and max(widths()) <= 100
    screen.type(b"q")
    assert screen.wait() == 0


def test_from_with_threads_asks_for_every_process_and_keeps_a_processes_url():
    """With --threads the served processes are matched to this node's threads, so the
    server's cut must not drop any (limit=0, whatever --limit); a URL naming /processes
    itself is taken as it is, not as /processes/processes."""
    threads = top.RemoteSource(
        top.Remote("http://127.0.0.1:9746"),
        top.Selection(pod=("shop", "web"), threads=True, limit=5),
    )
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(threads.url).query))
    assert query["limit"] == "0"
    url = top.processes_url("http://127.0.0.1:9746/processes", {"limit": "3"})
    assert urllib.parse.urlsplit(url).path == "/processes"
    assert top.share(0, 0) == "-" and top.share(1, 3) == "25%"
