"""`procdelta top`: its JSON against real processes and real servers, its threads, its
plain text, and its live screen in a pseudo-terminal (q and Ctrl-C quit, the terminal's
attributes come back)."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import http.client
import io
import json
import locale
import logging
import os
import re
import select
import selectors
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
from rich.cells import cell_len

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


def test_minutes_and_hours_are_whole_on_the_minute_and_the_hour():
    """17 minutes are 17m and 200 hours 200h: a whole unit is never shown as one less."""
    assert top.short_time(17 * 60 * 10**9) == "17m"
    assert top.short_time(200 * 3600 * 10**9) == "200h"


def test_a_single_nanosecond_runnable_has_a_share():
    """One nanosecond on a CPU or waiting for one is time runnable: its wait's share is
    0% or 100%, not `-` (which says there was none)."""
    assert top.share(0, 1) == "0%"
    assert top.share(1, 0) == "100%"


def drawn(renderable, width: int) -> list[str]:
    """What a screen `width` columns wide (no colour) shows of `renderable`, its lines
    without their trailing spaces."""
    console = top.Console(width=width, height=24, color_system=None, file=io.StringIO())
    with console.capture() as captured:
        console.print(renderable)
    return [line.rstrip() for line in captured.get().splitlines()]


def test_a_pods_screen_is_its_head_its_cgroup_a_blank_line_then_its_processes():
    """The whole screen of a pod, line by line: the head, the pod's own cgroup (its CPU,
    its throttling and CPU pressure, each in its place), a blank line, the table; a
    process without counters shows `-` in each of its cells, its wait's share too."""
    labels = {"namespace": "n", "pod": "p", "uid": "u", "qos": "guaranteed"}
    group = {"group": labels, "processes": 1, "run_delay_nanos": 0,
             "cgroup_cpu_nanos": 200_000_000, "cpu_periods": 10, "cpu_throttled_periods": 4,
             "cpu_throttled_nanos": 1_500_000,
             "cpu_pressure_waiting_nanos": 1_000_000_000}  # fmt: skip
    process = {"pid": 12, "comm": "sh", "threads": 1, "group": labels}
    document = {"interval_seconds": 2, "timestamp": 1.7e9, "processes": [process]}
    view = top.View({**document, "groups": [group]})
    clock = time.strftime("%H:%M:%S", time.localtime(1.7e9))
    assert drawn(top.render(view, top.Selection(pod=("n", "p")), 80), 80) == [
        f"procdelta top  pod n/p  by run delay  interval 2.00s at {clock}",
        "pod n/p  guaranteed  1 process with a delta",
        "  cgroup CPU 200ms  throttled 4/10 periods, 1.5ms  CPU pressure 1.00s",
        "  run delay 0",
        "",
        "    PID COMM             THR ON-CPU RUN-DELAY WAIT%  USER   SYS",
        "     12 sh                 1      -         -     -     -     -",
    ]


def test_a_run_delay_split_is_of_the_whole_run_delay_and_a_nanosecond_is_not_none():
    """The causes' shares are of the group's whole run delay, where the causes found do
    not add up to it; one nanosecond of run delay, or of wall wait, is shown as such,
    not as none."""
    split = {
        "run_delay_throttled_nanos": 1_000_000_000,
        "run_delay_own_threads_nanos": 1_000_000_000,
        "run_delay_neighbours_nanos": 0,
    }
    group = {"group": {"cgroup": "/x"}, "processes": 1, "run_delay_nanos": 4_000_000_000}
    assert top.group_lines({**group, **split})[2:] == [
        "  run delay 4.00s: 25% own limit (throttled) · 25% own threads · 0% neighbours"
    ]
    assert top.group_lines({**group, "run_delay_nanos": 1})[2:] == [
        "  run delay 1ns (no split by cause this interval)"
    ]
    stalled = dict(zip(top.screen.KERNEL_CAUSES, (1, 0, 0), strict=True))
    assert top.group_lines({**group, **stalled})[2:] == [
        "  run delay 4.00s",
        "  wall wait 1ns: 100% own limit (throttled) · 0% own threads · 0% neighbours",
    ]


def test_on_a_narrow_screen_each_line_and_cell_is_cut_to_fit_and_marked_cut():
    """A screen 40 columns wide: the head, the group's lines and the line saying it has
    no process are cut in their middle to the width; a cell cut to its column ends in
    `…` (a PID of 4194303 is never shown as 419)."""
    labels = {"namespace": "a-long-namespace", "pod": "a-long-pod-name-7d9f8c6b5-x2x9z"}
    selection = top.Selection(pod=(labels["namespace"], labels["pod"]))
    process = {"pid": 4194303, "comm": "kube-controller", "threads": 12_345,
               "on_cpu_nanos": 987_654_321_000, "run_delay_nanos": 1_000_000,
               "group": labels}  # fmt: skip
    group = {"group": {**labels, "uid": "u"}, "processes": 2, "run_delay_nanos": 0}
    view = top.View({"interval_seconds": 1, "processes": [process], "groups": [group]})
    lines = drawn(top.render(view, selection, 40, live=True, height=20), 40)
    assert lines[:5] == [
        "procdelta top  pod a…l 1.00s at --:--:--",
        "q quits",
        "pod a-long-namespace…cesses with a delta",
        "  own cgroup: no rea…sight, or not read)",
        "  run delay 0",
    ]
    assert all(len(line) <= 40 for line in lines)
    assert lines[-1].split()[:2] == ["419…", "kube-contro…"]
    empty = top.View({"interval_seconds": 1, "processes": [], "groups": []})
    lines = drawn(top.render(empty, selection, 40), 40)
    assert lines[1] == "no process of pod a-…9z in this interval"


def test_a_name_of_wide_characters_or_spaces_stays_on_its_one_line():
    """Characters two columns wide (a cgroup named in Japanese): its lines are cut at the
    screen's edge, in the plain text's 80 columns too, never wrapped onto a second line
    (which would push the table down); a process name with spaces is cut in its cell,
    not wrapped either."""
    name = "/" + "日本語" * 15
    process = {"pid": 1, "comm": "tokio runtime worker", "group": {"cgroup": name}}
    group = {"group": {"cgroup": name}, "processes": 1, "run_delay_nanos": 0}
    view = top.View({"interval_seconds": 1, "processes": [process], "groups": [group]})
    lines = plain(top.render(view, top.Selection(cgroup=name), 80))
    assert len(lines) == 7, lines  # head; the group: three lines; blank; the table: two
    assert all(cell_len(line) <= 80 for line in lines), lines
    assert lines[-1].rstrip() == "      1 tokio runtime …    -      -         -     -     -     -"


def test_the_tables_heads_are_bold_on_a_terminal():
    console = top.Console(width=80, force_terminal=True, color_system="standard")
    with console.capture() as captured:
        console.print(top.render(one_process(11), top.Selection(), 80))
    assert "\x1b[1m    PID\x1b[0m" in captured.get()


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


def test_one_interval_whose_second_pass_fails_says_so_in_its_words():
    failed = top.Viewer(FakeSource({}, {}), top.Selection())
    with pytest.raises(top.TopError) as raised:
        top.one_interval(failed, 0, lambda _: None)
    assert str(raised.value) == "the pass over the proc filesystem failed; see the log"


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


def test_threads_from_another_nodes_server_name_the_server_and_what_to_do(tmp_path):
    """Where the served PIDs name other processes here, the one line names the server
    (its origin), the proc filesystem read and how to run top where they are alike."""
    write_process(tmp_path, 10, "sshd")
    body = json.dumps({"processes": [{"pid": 10, "comm": "main", "group": {}}]}).encode()
    with hostile(answering(b"200 OK", body)) as (port, _):
        selection = top.Selection(cgroup="/x", threads=True)
        remote = top.Remote(f"http://127.0.0.1:{port}")
        source = top.RemoteSource(remote, selection, ProcFS(str(tmp_path)))
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
def hostile(answer, read_head: bool = True) -> Iterator[tuple[int, list[bytes]]]:
    """A server on 127.0.0.1 that reads each request's head (unless not `read_head`: a
    TLS client's hello has none), records it and hands the socket to `answer(sock,
    port)`; (its port, the heads it read)."""
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
                while read_head and b"\r\n\r\n" not in head and (chunk := sock.recv(4096)):
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
                tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                with tls:
                    try:
                        tls.do_handshake()
                    except ssl.SSLError:
                        # the alert is sent: read on (bytes, below TLS) until the client
                        # closes, so that closing with its request unread does not reset
                        # the connection before the client reads the alert (it would see
                        # a reset or an end, not the TLS error)
                        while socket.socket.recv(tls, 65536):
                            pass
                        continue
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
    assert_one_line_error(result, "over 16 MiB", "no procdelta /processes answer", status=1)


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


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b'{"processes": [], "timestamp": NaN}', "not a JSON object"),
        (b'{"processes": [], "interval_seconds": Infinity}', "not a JSON object"),
        (b'{"processes": [], "timestamp": 1e300}', "timestamp is not a number"),
        (b'{"processes": [], "timestamp": "now"}', "timestamp is not a number"),
        (b'{"processes": [{"pid": 1, "comm": "x", "group": {}, '
         b'"on_cpu_nanos": 18446744073709551616}]}',
         "processes[0].on_cpu_nanos is not a count"),
        (b'{"processes": [{"pid": 99999999999999999999999, "comm": "x", "group": {}}]}',
         "processes[0] has no pid"),
        (b'{"processes": [], "x": ' + b"9" * 5000 + b"}", "not a JSON object"),
        (b'{"processes": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not a JSON object"),
    ],
)  # fmt: skip
def test_values_top_cannot_draw_are_refused_in_one_line(body, problem):
    """What passes for JSON but cannot be drawn: NaN or infinite clocks, counts past the
    kernel's 64 bits, numbers past Python's digits, nesting past the stack: one line
    naming the answer, never a traceback."""

    def answer(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    with hostile(answer) as (port, _):
        result = procdelta("top", "--from", f"http://127.0.0.1:{port}", "--format", "json")
    assert_one_line_error(result, "not a procdelta /processes answer", problem, status=1)


def test_an_answer_of_tiny_values_is_refused_before_it_is_parsed():
    """16 MiB of `{},` would cost some 400 MiB to parse: an answer of more values than a
    node's processes have is refused before parsing, in 200 MiB of address space."""
    body = b"[" + b"{}," * ((top.remote.MAX_ANSWER_BYTES // 3) - 1) + b"{}]"

    def answer(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
        sock.sendall(body)

    with hostile(answer) as (port, _):
        result = subprocess.run(
            ["prlimit", f"--as={200 << 20}", sys.executable, "-m", "collector", "top",
             "--from", f"http://127.0.0.1:{port}", "--format", "json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert_one_line_error(result, "values is no procdelta /processes answer", status=1)


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (b"500 ", b"", "500 "),  # no reason, no body: the status alone
        (b"500 Oops", b"x" * 300, "500 " + "x" * 200),
        (b"503 Busy", b"\xffbusy\n", "503 \ufffdbusy"),  # not UTF-8: shown, not an error
        (b"300 Multiple Choices", b"", "300: the server redirects, which procdelta serve "
         "never does; not followed (--from takes the server's own base URL)"),
    ],
)  # fmt: skip
def test_a_refusal_is_exactly_its_status_and_what_the_server_said(status, body, said):
    with hostile(answering(status, body)) as (port, _):
        assert fetched(port) == f"--from http://127.0.0.1:{port}: {said}"


def test_a_password_file_is_read_as_utf8_whatever_the_locale(tmp_path):
    """The password's bytes are sent as written (UTF-8), under a locale of another
    encoding too; a file that is not UTF-8 is one line naming it."""
    secret = tmp_path / "password"
    secret.write_bytes("pässword\n".encode())
    saved = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # ASCII
    try:
        source = top.RemoteSource(
            top.Remote("http://h", username="al", password_file=str(secret)), top.Selection()
        )
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)
    token = base64.b64encode("al:pässword".encode()).decode()
    assert source.headers["Authorization"] == f"Basic {token}"
    secret.write_bytes(b"\xff\n")
    with pytest.raises(top.BadValue) as raised:
        top.RemoteSource(
            top.Remote("http://h", username="al", password_file=str(secret)), top.Selection()
        )
    assert str(raised.value) == (
        f"--from.password-file {secret}: 'utf-8' codec can't decode byte 0xff in position 0: "
        "invalid start byte"
    )


def ssl_error(text: str, reason: str) -> ssl.SSLError:
    """An SSLError as OpenSSL's come: its text and its reason."""
    error = ssl.SSLError(1, text)
    error.reason = reason
    return error


def verify_error(message: str | None) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_message = message
    return error


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        (verify_error(None), "TLS: certificate verify failed (give --from.ca-file, or "
         "--from.insecure-skip-verify)"),
        (ssl_error("[SSL: SOME_ALERT] some alert", "SOME_ALERT"), "TLS: some alert"),
        (ssl_error("[SSL: SSLV3_ALERT_HANDSHAKE_FAILURE] sslv3 alert handshake failure",
                   "SSLV3_ALERT_HANDSHAKE_FAILURE"), "TLS: sslv3 alert handshake failure "
         "(does it want a client certificate? --from.cert-file, --from.key-file)"),
        (ssl_error("[SSL: RECORD_LAYER_FAILURE] record layer failure", "RECORD_LAYER_FAILURE"),
         "TLS: record layer failure (is it plain http?)"),
        (ConnectionResetError(104, "Connection reset by peer"),
         "the connection was closed before an answer (is it https?)"),
        (http.client.BadStatusLine("SSH-2.0-OpenSSH\r\n"),
         "not an HTTP answer: BadStatusLine('SSH-2.0-OpenSSH\\r\\n')"),
        (ValueError("x" * 300), "cannot connect: " + "x" * 200),
    ],
    ids=["unverified", "tls", "handshake", "record-layer", "reset", "not-http", "other"],
)  # fmt: skip
def test_each_way_a_server_cannot_be_reached_is_said_with_what_to_try(reason, said):
    assert top.remote._unreachable(reason) == said


def test_each_connection_of_from_waits_the_request_timeout_at_most(monkeypatch):
    """Connecting and each read are bounded by REQUEST_TIMEOUT, over http and https (the
    deadline's timer cannot cut a connect short: there is no socket yet to shut)."""
    timeouts: list[float | None] = []
    connect = socket.create_connection

    def recording(address, timeout=None, *args, **kwargs):
        timeouts.append(timeout)
        return connect(address, timeout, *args, **kwargs)

    monkeypatch.setattr(top.remote.socket, "create_connection", recording)
    port = free_port()  # nothing listens there
    for scheme in ("http", "https"):
        assert fetched(port, scheme).endswith(": cannot connect: Connection refused")
    assert timeouts == [top.REQUEST_TIMEOUT, top.REQUEST_TIMEOUT]


def test_an_answer_over_the_cap_is_refused_as_soon_as_the_cap_is_passed(monkeypatch):
    """One byte past the cap is read, no more: an answer that says it is larger is refused
    then, without waiting for the rest (which the server may never send)."""
    monkeypatch.setattr(top.remote, "MAX_ANSWER_BYTES", 1 << 20)
    monkeypatch.setattr(top.remote, "REQUEST_TIMEOUT", 2.0)
    done = threading.Event()

    def stalls(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
        sock.sendall(b" " * ((1 << 20) + 1))
        done.wait(10)  # the rest never comes

    with hostile(stalls) as (port, _):
        try:
            said = fetched(port)
        finally:
            done.set()
    assert said.endswith(": an answer over 1 MiB is no procdelta /processes answer"), said


def test_a_server_that_trickles_its_status_line_is_cut_off_at_the_deadline(monkeypatch):
    """The deadline cuts the exchange wherever it is: in the status line, what was read
    of it is no answer within the deadline, not a malformed answer."""
    monkeypatch.setattr(top.remote, "REQUEST_TIMEOUT", 0.5)

    def trickle(sock: socket.socket, port: int) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
            sock.sendall(bytes([byte]))
            time.sleep(0.1)

    with hostile(trickle) as (port, _):
        said = fetched(port)
    assert said == (
        f"--from http://127.0.0.1:{port}: no answer within 0.5s (an https URL for a plain "
        "http serve?)"
    )


@contextlib.contextmanager
def thread_errors() -> Iterator[list]:
    """The exceptions that end a thread meanwhile (each one a traceback on stderr)."""
    raised: list = []
    hook = threading.excepthook
    threading.excepthook = raised.append
    try:
        yield raised
    finally:
        threading.excepthook = hook


def test_the_deadline_cuts_a_tls_handshake_and_the_body_of_a_closing_answer(monkeypatch):
    """The deadline cuts the exchange wherever the server trickles: during the TLS
    handshake (the socket then held by TLS) and during the body of an answer that says it
    closes the connection (the socket then held by the answer, not the connection). Each
    server would trickle for 3 s; the fetch ends at the deadline of 0.5 s, said in one
    line, and the deadline's timer leaves no traceback."""
    monkeypatch.setattr(top.remote, "REQUEST_TIMEOUT", 0.5)

    def handshake(sock: socket.socket, port: int) -> None:
        sock.sendall(b"\x16\x03\x03\x40\x00")  # a handshake record of 16 KiB, trickled
        for _ in range(30):
            sock.sendall(b"\x00")
            time.sleep(0.1)

    def closing(sock: socket.socket, port: int) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 40\r\n\r\n")
        for _ in range(30):
            sock.sendall(b" ")
            time.sleep(0.1)

    for scheme, answer in (("https", handshake), ("http", closing)):
        with thread_errors() as raised, hostile(answer, read_head=scheme == "http") as (port, _):
            started = time.monotonic()
            said = fetched(port, scheme, insecure_skip_verify=scheme == "https")
            took = time.monotonic() - started
            for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
                timer.join(5)
        assert said.endswith(": no answer within 0.5s (an https URL for a plain http serve?)")
        assert took < 2.0, (scheme, took)  # not the 3 s the server trickles for
        assert raised == []


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


class ViewsEnd(Exception):
    """A viewer asked for a view past those a test gave it: the live loop's end in a test
    (an exception a test catches, where a KeyboardInterrupt escaping would stop the whole
    session rather than fail one test)."""


class Steps:
    """A viewer whose steps hand out `views` in turn (an exception is raised), then raise
    `end`: ViewsEnd, or KeyboardInterrupt where Ctrl-C is what the test is about."""

    origin = ""

    def __init__(self, *views, end: type[BaseException] = ViewsEnd):
        self.views = list(views)
        self.end = end
        self.steps = 0

    def step(self):
        self.steps += 1
        if not self.views:
            raise self.end
        view = self.views.pop(0)
        if isinstance(view, Exception):
            raise view
        return view


def one_process(pid: int) -> top.View:
    process = {"pid": pid, "comm": "x", "group": {"cgroup": "/a"}}
    return top.View({"interval_seconds": 1, "processes": [process]})


@contextlib.contextmanager
def ctrl_c_is_caught(where: str) -> Iterator[None]:
    """A KeyboardInterrupt escaping `where` fails the test (it would otherwise stop the
    whole session)."""
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail(f"Ctrl-C escaped {where}")


def test_plain_text_is_a_block_per_interval_until_interrupted():
    """Off a terminal: nothing for a first pass, then each interval's block, a blank line
    between blocks, no trailing spaces; Ctrl-C ends it quietly."""
    out = io.StringIO()
    viewer = Steps(None, one_process(11), one_process(22), end=KeyboardInterrupt)
    with ctrl_c_is_caught("run_plain"):
        top.run_plain(viewer, top.Selection(), 0, out)
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
        with pytest.raises(ViewsEnd):  # the viewer's end, after its views
            live_loop(viewer, 0.01, keys, resized)
        assert viewer.steps == 5
    with live_pipes() as (_, _typed, resized, _resize):
        viewer = Steps(one_process(11), top.TopError("gone"), None, one_process(22))
        live = FakeLive()
        with pytest.raises(ViewsEnd):
            live_loop(viewer, 0.01, None, resized, live)
        assert [" 11 x " in s for s in live.drawn] == [True, True, True, False]
        assert "refresh failed: gone" in live.drawn[1] and "refresh failed" in live.drawn[2]
        assert " 22 x " in live.drawn[3]


def test_the_live_loop_goes_on_refreshing_after_its_input_ends():
    with live_pipes() as (keys, typed, resized, _resize):
        os.close(typed)
        viewer = Steps(one_process(11), one_process(22))
        with pytest.raises(ViewsEnd):
            live_loop(viewer, 0.01, keys, resized)
        assert viewer.steps == 3


def test_a_first_view_that_fails_ends_the_live_loop_with_its_error():
    with live_pipes() as (keys, _, resized, _), pytest.raises(top.TopError, match="refused"):
        live_loop(Steps(top.TopError("refused")), 60, keys, resized)


class Clock:
    """terminal.py's `time`: a monotonic clock that moves only by its sleeps (each one
    kept), the steps and the waits that move it."""

    def __init__(self):
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class SlowSteps(Steps):
    """Steps that each take `takes` seconds of `clock`."""

    def __init__(self, clock: Clock, takes: float, *views, **steps):
        super().__init__(*views, **steps)
        self.clock, self.takes = clock, takes

    def step(self):
        self.clock.now += self.takes
        return super().step()


def test_plain_text_is_each_screen_at_80_columns_an_interval_after_the_last_was_due(
    monkeypatch,
):
    """Each block is the view's screen as it is drawn, where its passes come from and how
    often, 80 columns whatever the environment's COLUMNS says; the next one comes an
    interval after the last was due, not an interval after it was printed."""
    monkeypatch.setenv("COLUMNS", "40")
    clock = Clock()
    monkeypatch.setattr(top.terminal, "time", clock)
    viewer = SlowSteps(clock, 0.2, None, one_process(11), one_process(22), end=KeyboardInterrupt)
    viewer.origin = "http://x:1"
    out = io.StringIO()
    with ctrl_c_is_caught("run_plain"):
        top.run_plain(viewer, top.Selection(), 0.5, out)
    block = [
        "procdelta top  node  by run delay  interval 1.00s at --:--:--",
        "from http://x:1 (its passes; refreshed every 0.5s)",
        "",
        "    PID COMM             THR ON-CPU RUN-DELAY WAIT%  USER   SYS GROUP",
        "     {} x                  -      -         -     -     -     - /a",
    ]
    assert out.getvalue() == "\n".join([*block, "", *block, ""]).format(11, 22)
    assert clock.slept == pytest.approx([0.3, 0.3, 0.3])


class TickingSelectors:
    """terminal.py's `selectors` on a Clock: a wait returns at once what is ready, or else
    moves the clock by its timeout; each wait's timeout kept."""

    EVENT_READ = selectors.EVENT_READ

    def __init__(self, clock: Clock):
        self.clock = clock
        self.waits: list[float] = []

    def DefaultSelector(self):
        return TickingSelector(self)


class TickingSelector:
    def __init__(self, ticking: TickingSelectors):
        self.ticking = ticking
        self.real = selectors.DefaultSelector()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.real.close()

    def register(self, fd: int, events: int) -> None:
        self.real.register(fd, events)

    def unregister(self, fd: int) -> None:
        self.real.unregister(fd)

    def select(self, timeout: float):
        self.ticking.waits.append(timeout)
        ready = self.real.select(0)
        if not ready:
            self.ticking.clock.now += timeout
        return ready


def test_the_live_loop_refreshes_an_interval_after_the_last_was_due(monkeypatch):
    """The first refresh an interval after the first view is drawn; each next one an
    interval after the last was due: a view that takes 0.2 s of a 0.5 s interval leaves
    0.3 s to wait."""
    clock = Clock()
    ticking = TickingSelectors(clock)
    monkeypatch.setattr(top.terminal, "time", clock)
    monkeypatch.setattr(top.terminal, "selectors", ticking)
    viewer = SlowSteps(clock, 0.2, one_process(11), one_process(22), one_process(33))
    with live_pipes() as (keys, _typed, resized, _resize), pytest.raises(ViewsEnd):
        live_loop(viewer, 0.5, keys, resized)
    assert viewer.steps == 4
    assert ticking.waits == pytest.approx([0.5, 0.3, 0.3])


def test_the_live_screen_is_drawn_to_the_consoles_height_with_where_it_comes_from():
    """A live screen: its head says where its passes come from and how often, then how
    to quit; no more rows than the console is high."""
    processes = [{"pid": pid, "comm": "x", "group": {"cgroup": "/a"}} for pid in range(1, 31)]
    viewer = Steps(top.View({"interval_seconds": 1, "processes": processes}))
    viewer.origin = "http://x:1"
    with live_pipes() as (keys, typed, resized, _resize):
        os.write(typed, b"q")
        live = live_loop(viewer, 60, keys, resized)
    (screen,) = live.drawn
    lines = screen.splitlines()
    assert lines[:4] == [
        "procdelta top  node  by run delay  interval 1.00s at --:--:--",
        "from http://x:1 (its passes; refreshed every 60s)",
        "q quits",
        "",
    ]
    assert [line.split()[0] for line in lines[4:]] == ["PID", *map(str, range(1, 25))]


def test_the_live_screen_on_a_terminal_reads_keys_in_cbreak_mode_and_gives_it_back(
    monkeypatch,
):
    """On a terminal: rich's alternate screen, drawn only when `top` says (no refresh
    thread of rich's), stdout and stderr left alone; stdin in cbreak mode while it runs
    (each key read as it is typed, not echoed), a `q` typed there quits at once, and the
    terminal's modes come back as they were."""
    master, slave = os.openpty()
    before = termios.tcgetattr(slave)
    lives = []

    class Recording:
        """rich's Live: its arguments, and the terminal's local modes at each draw (the
        first one types `q`)."""

        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.modes: list[int] = []
            lives.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

        def update(self, renderable, refresh: bool) -> None:
            self.modes.append(termios.tcgetattr(slave)[3])
            os.write(master, b"q")

    stdin = open(slave, "rb", buffering=0, closefd=False)  # noqa: SIM115
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(top.terminal, "Live", Recording)
    viewer = Steps(one_process(11), one_process(22))
    try:
        top.run_live(viewer, top.Selection(), 2.0)
        after = termios.tcgetattr(slave)
    finally:
        stdin.close()
        os.close(master)
        os.close(slave)
    (live,) = lives
    console = live.kwargs.get("console")
    assert isinstance(console, top.Console)
    assert live.kwargs == {"console": console, "screen": True, "auto_refresh": False,
                           "redirect_stdout": False, "redirect_stderr": False}  # fmt: skip
    assert viewer.steps == 1  # quit by the q, before a refresh
    assert live.modes and all(not mode & (termios.ICANON | termios.ECHO) for mode in live.modes)
    assert after == before


def test_the_live_screen_off_a_terminal_ends_quietly_on_ctrl_c(capsys):
    """Without a terminal on stdin no cbreak mode is set; Ctrl-C (the viewer's end) gives
    the screen back without a traceback."""
    viewer = Steps(one_process(11), end=KeyboardInterrupt)
    with ctrl_c_is_caught("run_live"):
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
