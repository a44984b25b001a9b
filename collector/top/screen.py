"""The view drawn with rich: its tables, its numbers in a few characters, the group's
own cgroup above its processes."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.console import Group as Stack
from rich.table import Table
from rich.text import Text

from collector.output import group_name, middle_cut, printable
from collector.top.core import Selection, View

PLAIN_WIDTH = 80


# --- drawing ---------------------------------------------------------------------------


def short_time(nanos: int | None) -> str:
    """Nanoseconds in at most 5 characters, cut (never rounded up past a unit): 850ns
    850µs 8.5ms 850ms 8.50s 85.0s 850s, minutes from 1000 s, hours from 10000 minutes."""
    if nanos is None:
        return "-"
    if nanos == 0:
        return "0"
    if nanos < 1_000:
        return f"{nanos}ns"
    if nanos < 1_000_000:
        return f"{nanos // 1_000}µs"
    if nanos < 10_000_000:
        return f"{nanos // 100_000 / 10:.1f}ms"
    if nanos < 1_000_000_000:
        return f"{nanos // 1_000_000}ms"
    if nanos < 10_000_000_000:
        return f"{nanos // 10_000_000 / 100:.2f}s"
    if nanos < 100_000_000_000:
        return f"{nanos // 100_000_000 / 10:.1f}s"
    if nanos < 1_000_000_000_000:
        return f"{nanos // 1_000_000_000}s"
    if nanos < 600_000_000_000_000:
        return f"{nanos // 60_000_000_000}m"
    return f"{nanos // 3_600_000_000_000}h"


def short_count(value: int | None) -> str:
    if value is None:
        return "-"
    if value >= 10_000_000:
        return f"{value // 1_000_000}M"
    if value >= 10_000:
        return f"{value // 1_000}k"
    return str(value)


def share(run_delay: int, on_cpu: int) -> str:
    """The run delay's share of the time runnable (on a CPU or waiting for one)."""
    runnable = on_cpu + run_delay
    return "-" if runnable <= 0 else f"{100 * run_delay / runnable:.0f}%"


def _text(text: str, width: int | None = None) -> Text:
    """A line or a cell as it is, never read as markup, cut in its middle to `width`."""
    text = printable(text)
    return Text(text if width is None else middle_cut(text, width), no_wrap=True)


def _row_group(labels: Mapping[str, str]) -> str:
    """A process's group in a node-wide view: its pod (namespace/name) or cgroup."""
    try:
        return group_name(dict(labels))
    except KeyError:
        return "?"


# (header, width, field) of the process table; the group's column takes the rest
_PROCESS_COLUMNS = (
    ("PID", 7, "pid"),
    ("COMM", 15, "comm"),
    ("THR", 4, "threads"),
    ("ON-CPU", 6, "on_cpu_nanos"),
    ("RUN-DELAY", 9, "run_delay_nanos"),
    ("WAIT%", 5, None),
    ("USER", 5, "cpu_user_nanos"),
    ("SYS", 5, "cpu_system_nanos"),
)
_THREAD_COLUMNS = (
    ("PID", 7, "pid"),
    ("TID", 7, "tid"),
    ("THREAD", 15, "comm"),
    ("ON-CPU", 6, "on_cpu_nanos"),
    ("RUN-DELAY", 9, "run_delay_nanos"),
    ("WAIT%", 5, None),
    ("VOL-CS", 6, "voluntary_switches"),
    ("INVOL-CS", 8, "nonvoluntary_switches"),
)
_GROUP_COLUMN_MIN = 8


def _cell(name: str | None, item: Mapping[str, Any]) -> str:
    if name is None:
        return share(int(item.get("run_delay_nanos") or 0), int(item.get("on_cpu_nanos") or 0))
    value = item.get(name)
    if name == "comm":
        return str(value)
    if name.endswith("_nanos"):
        return short_time(value)
    if name in ("pid", "tid"):
        return str(value)
    return short_count(value)


def _table(columns, items: Iterable[Mapping[str, Any]], width: int, group_column: bool) -> Table:
    table = Table(
        box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, header_style="bold"
    )
    for header, column_width, name in columns:
        table.add_column(
            header,
            width=column_width,
            justify="left" if name == "comm" else "right",
            no_wrap=True,
            overflow="ellipsis",
        )
    rest = width - sum(w + 1 for _, w, _ in columns)
    if group_column:
        rest = max(rest, _GROUP_COLUMN_MIN)
        table.add_column("GROUP", width=rest, no_wrap=True, overflow="ellipsis")
    for item in items:
        cells = [_text(_cell(name, item)) for _, _, name in columns]
        if group_column:
            cells.append(_text(_row_group(item.get("group") or {}), rest))
        table.add_row(*cells)
    return table


def _percent(part: int | None, whole: int) -> str:
    return "-" if part is None else f"{100 * part / whole:.0f}%"


KERNEL_CAUSES = (
    "cpu_stalled_throttled_nanos",
    "cpu_waiting_own_threads_nanos",
    "cpu_stalled_neighbours_nanos",
)
"""Why a group waited from its CPU pressure (wall time), in the group line's order."""
INTERVAL_CAUSES = tuple(
    f"run_delay_{cause}_nanos" for cause in ("throttled", "own_threads", "neighbours")
)
"""The same from its run delay's split (thread-time), where it has no CPU pressure."""


def _causes_line(what: str, parts: list, whole: int | None = None) -> str:
    """`what` and its three causes, each a share of `whole` (of their sum without it)."""
    total = sum(int(p or 0) for p in parts) if whole is None else whole
    if total <= 0:
        return f"  {what} 0"
    throttled, own, neighbours = (_percent(p, total) for p in parts)
    return (
        f"  {what} {short_time(total)}: {throttled} own limit (throttled)"
        f" · {own} own threads · {neighbours} neighbours"
    )


def group_lines(group: Mapping[str, Any]) -> list[str]:
    """A group's own cgroup, what its processes cannot see (docs/reference.md §7): its
    CPU, throttling and CPU pressure; then why it waited: moment by moment from its CPU
    pressure (wall time), else its run delay split on the interval (thread-time)."""
    labels = group.get("group") or {}
    name = _row_group(labels)
    kind = "pod" if "uid" in labels else "cgroup"
    qos = f"  {labels['qos']}" if labels.get("qos") else ""
    count = group.get("processes")
    noun = "process" if count == 1 else "processes"
    lines = [f"{kind} {name}{qos}  {short_count(count)} {noun} with a delta"]
    cpu = group.get("cgroup_cpu_nanos")
    periods, throttled = group.get("cpu_periods"), group.get("cpu_throttled_periods")
    if cpu is None and periods is None and group.get("cpu_pressure_waiting_nanos") is None:
        lines.append("  own cgroup: no reading this interval (first sight, or not read)")
    else:
        throttling = (
            "-" if periods is None or throttled is None else f"{throttled}/{periods} periods"
        )
        lines.append(
            f"  cgroup CPU {short_time(cpu)}  throttled {throttling},"
            f" {short_time(group.get('cpu_throttled_nanos'))}"
            f"  CPU pressure {short_time(group.get('cpu_pressure_waiting_nanos'))}"
        )
    run_delay = int(group.get("run_delay_nanos") or 0)
    stalled = [group.get(name) for name in KERNEL_CAUSES]
    if all(part is not None for part in stalled):
        lines.append(f"  run delay {short_time(run_delay)}")
        lines.append(_causes_line("wall wait", stalled))
        return lines
    split = [group.get(name) for name in INTERVAL_CAUSES]
    if run_delay <= 0:
        lines.append("  run delay 0")
    elif all(part is None for part in split):
        lines.append(f"  run delay {short_time(run_delay)} (no split by cause this interval)")
    else:
        lines.append(_causes_line("run delay", split, run_delay))
    return lines


def _clock(timestamp: object) -> str:
    if not isinstance(timestamp, int | float):
        return "--:--:--"
    return time.strftime("%H:%M:%S", time.localtime(timestamp))


_SORT_NAMES = {"run_delay_nanos": "run delay", "on_cpu_nanos": "on-CPU"}


def render(
    view: View | None,
    selection: Selection,
    width: int,
    origin: str = "",
    interval: float = 2.0,
    live: bool = False,
    height: int | None = None,
) -> Stack:
    """One screen: a header (what, the interval, the time), the group's own cgroup for a
    pod or a cgroup, then its processes (or threads), no more rows than `height` (a
    screen's: those below it are never drawn)."""
    document = view.document if view is not None else {}
    seconds = document.get("interval_seconds")
    sort = _SORT_NAMES.get(selection.sort, selection.sort)
    head = f"procdelta top  {selection.scope}  by {sort}"
    if view is None:
        head += f"  first pass done, the first interval in {interval:g}s"
    elif isinstance(seconds, int | float):
        head += f"  interval {seconds:.2f}s at {_clock(document.get('timestamp'))}"
    else:
        head += "  no interval yet"
    lines = [head]
    if origin:
        lines.append(f"from {origin} (its passes; refreshed every {interval:g}s)")
    if view is not None and view.note:
        lines.append(view.note)
    if live:
        lines.append("q quits")
    parts: list[Any] = [_text(line, width) for line in lines]
    if view is None:
        return Stack(*parts)
    if selection.filters:
        groups = document.get("groups") or []
        if not groups:
            parts.append(_text(f"no process of {selection.scope} in this interval", width))
        for group in groups:
            parts.extend(_text(line, width) for line in group_lines(group))
    parts.append(Text(""))
    if selection.threads and view.threads is not None:
        if view.threads_interval_ns is None:
            parts.append(Text("threads: first reading; their deltas from the next interval"))
        else:
            items = [row.as_dict() for row in view.threads[:height]]
            parts.append(_table(_THREAD_COLUMNS, items, width, group_column=False))
    else:
        processes = (document.get("processes") or [])[:height]
        parts.append(_table(_PROCESS_COLUMNS, processes, width, not selection.filters))
    return Stack(*parts)


def plain_console(file) -> Console:
    """A console that writes plain text: no colour, no escape codes, 80 columns."""
    return Console(
        file=file,
        width=PLAIN_WIDTH,
        force_terminal=False,
        color_system=None,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=False,
    )
