"""`procdelta once` output: a table for a person at a node, or JSON for a program."""

from __future__ import annotations

import json

from collector import fieldtable
from collector.engine import PassResult
from collector.model import CgroupFields
from collector.processes import group_row


def as_json(result: PassResult, cgroup_fields: bool = True) -> str:
    """docs/reference.md §6: an object with the interval's length (`interval_seconds`),
    the unix time of its second pass (`timestamp`), and `groups`: per group its labels
    under "group", then the §3 fields by name, then (unless the cgroup fields are off)
    the §7 fields, null where the group's cgroup has no such file or gave no delta this
    interval. A group whose cgroup gave a delta but no process of which contributed has
    its §3 fields at 0 (a sum over nothing)."""
    document = {
        "interval_seconds": None if result.interval_ns is None else result.interval_ns / 1e9,
        "timestamp": result.finished_at,
        "groups": [
            group_row(group, fields, cgroup, cgroup_fields)
            for group, fields, cgroup in result.ranked()
        ],
    }
    return json.dumps(document, indent=2)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 group`, `2 groups`: a count and its noun, singular for one."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _seconds(nanos: int) -> str:
    seconds = nanos / 1e9
    if seconds >= 100:
        return f"{seconds:.0f}s"
    if seconds >= 1:
        return f"{seconds:.2f}s"
    if nanos >= 1_000_000:
        return f"{nanos / 1e6:.1f}ms"
    if nanos >= 1_000:
        return f"{nanos / 1e3:.0f}µs"
    return f"{nanos}ns"


def _bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _count(value: int) -> str:
    if value >= 10_000_000:
        return f"{value / 1e6:.0f}M"
    if value >= 10_000:
        return f"{value / 1e3:.0f}k"
    return str(value)


def printable(text: str) -> str:
    """`text` with every character a terminal would act on (escape sequences, line
    breaks, bells) shown as `?`, as ps does: a process names itself, and whoever may make
    a cgroup names it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else "?" for c in text)


def group_name(labels: dict[str, str]) -> str:
    if "uid" in labels:
        name = f"{labels['namespace']}/{labels['pod']}" if labels["pod"] else f"pod {labels['uid']}"
        if labels.get("container") or labels.get("container_id"):
            name += f" [{labels.get('container') or labels['container_id'][:12]}]"
        return name
    return labels["cgroup"]


_COLUMNS: tuple[tuple[str, str | None], ...] = (("GROUP", None), *fieldtable.COLUMNS)
_NARROW = ("PROCS", "ON-CPU", "RUN-DELAY")
"""The process columns of the default table (80 columns); `--wide` shows every one."""
_NARROW_WITHOUT_CGROUP = (*_NARROW, "USER", "SYSTEM", "READ", "WRITE")
# What the group's own cgroup adds (docs/reference.md §7): its CPU, exited processes
# included, beside the sums' ON-CPU; time throttled by its own quota and the periods
# throttled out of those with runnable tasks; time some of its tasks waited for a CPU (PSI).
_CGROUP_COLUMNS = ("CGROUP-CPU", "THROTTLED", "THR-PERIODS", "CPU-WAIT")
_NARROW_CGROUP = ("CGROUP-CPU", "THR-PERIODS")
MIN_GROUP_WIDTH = 16


def _cell(field: str, value: int) -> str:
    if field.endswith("_nanos"):
        return _seconds(value)
    if field.endswith("_bytes"):
        return _bytes(value)
    return _count(value)


def _cgroup_cells(cgroup: CgroupFields | None) -> list[str]:
    if cgroup is None:
        return ["-"] * len(_CGROUP_COLUMNS)

    def nanos(value: int | None) -> str:
        return "-" if value is None else _seconds(value)

    periods = (
        "-"
        if cgroup.cpu_periods is None or cgroup.cpu_throttled_periods is None
        else f"{_count(cgroup.cpu_throttled_periods)}/{_count(cgroup.cpu_periods)}"
    )
    return [
        nanos(cgroup.cgroup_cpu_nanos),
        nanos(cgroup.cpu_throttled_nanos),
        periods,
        nanos(cgroup.cpu_pressure_waiting_nanos),
    ]


def middle_cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, cut in the middle (`…`): a name's both ends
    say the most (a pod's namespace and its hash, a cgroup's slice and scope)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    keep = width - 1
    return text[: keep - keep // 2] + "…" + text[len(text) - keep // 2 :]


def as_table(
    result: PassResult, cgroup_fields: bool = True, wide: bool = False, width: int = 80
) -> str:
    """One row per group, the biggest CPU consumers first, in human units; then what
    the group's own cgroup says ("-": no such file, or no delta yet). Fits `width`
    columns (group names shortened in the middle), unless `wide`: every field, names
    whole."""
    interval = "" if result.interval_ns is None else f" over {result.interval_ns / 1e9:.2f}s"
    header = [title for title, _ in _COLUMNS]
    if cgroup_fields:
        header += _CGROUP_COLUMNS
    rows = []
    for group, fields, cgroup in result.ranked():
        row = [printable(group_name(group.label_dict()))]
        row += [_cell(f, getattr(fields, f)) for _, f in _COLUMNS[1:] if f]
        if cgroup_fields:
            row += _cgroup_cells(cgroup)
        rows.append(row)
    if not wide:
        shown = _NARROW + _NARROW_CGROUP if cgroup_fields else _NARROW_WITHOUT_CGROUP
        keep = [0] + [header.index(title) for title in shown]
        header = [header[i] for i in keep]
        rows = [[row[i] for i in keep] for row in rows]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    if not wide:
        room = width - sum(widths[1:]) - 2 * (len(widths) - 1)
        widths[0] = max(len(header[0]), min(widths[0], max(room, MIN_GROUP_WIDTH)))
        for row in rows:
            row[0] = middle_cut(row[0], widths[0])
    lines = [f"{counted(len(rows), 'group')}{interval}; time is process-time (sums, not rates)"]
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
