"""`procdelta top`: what a screen shows, drawn without a kernel: short numbers, the head, the
group and process lines, the widths, the selection and one interval's view."""

from __future__ import annotations

import io
import time
import uuid

import pytest
from rich.cells import cell_len

from collector import top
from collector.processes import Query

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


def one_process(pid: int) -> top.View:
    process = {"pid": pid, "comm": "x", "group": {"cgroup": "/a"}}
    return top.View({"interval_seconds": 1, "processes": [process]})


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
