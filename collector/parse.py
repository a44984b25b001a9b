"""Pure parsers: `bytes` of one `/proc` or cgroup file in, a NamedTuple (or int) out.

Each raises `Malformed` (naming the file and the text) on anything it cannot read
exactly; none touches the filesystem.
"""

from __future__ import annotations

import re

from collector.model import (
    CgroupLine,
    IOBytes,
    Malformed,
    Pressure,
    SchedStat,
    Stat,
    Switches,
    build,
)

# Field N of proc(5)'s stat list sits at index N - 3 once the line is cut after `comm`.
_STAT_FIELDS_NEEDED = 24 - 3 + 1

# The kernel's exact layouts of `status` and `io`, one compiled pattern each, tried first
# (bytes patterns: \d is [0-9] only); anything else is parsed the general way, which also
# says what is malformed. (`schedstat`, three numbers, is quicker split than matched.)
_SWITCHES = re.compile(rb"\nvoluntary_ctxt_switches:\t(\d+)\nnonvoluntary_ctxt_switches:\t(\d+)\n")
_SWITCHES_SPAN = 128  # the two lines end the file: searched for in its last bytes
_IO = re.compile(rb"\nread_bytes: (\d+)\nwrite_bytes: (\d+)\n")
_PSI_AVERAGES = rb" avg10=\d+\.\d\d avg60=\d+\.\d\d avg300=\d+\.\d\d total="
_PRESSURE = re.compile(
    rb"some" + _PSI_AVERAGES + rb"(\d+)\n(?:full" + _PSI_AVERAGES + rb"(\d+)\n)?"
)


def _natural(token: bytes, what: str, text: bytes) -> int:
    """A non-negative decimal integer, or Malformed."""
    if not token.isdigit():
        raise Malformed(what, text)
    try:
        return int(token)
    except ValueError:  # more digits than int() takes
        raise Malformed(what, text) from None


def parse_stat(data: bytes) -> Stat:
    """`/proc/<pid>/stat` (or `task/<tid>/stat`).

    Field 2, the command name, is in parentheses and may itself hold spaces and
    parentheses, so the fields after it are counted from the *last* `)`.
    """
    open_paren = data.find(b"(")
    close_paren = data.rfind(b")")
    if open_paren < 0 or close_paren < open_paren:
        raise Malformed("stat", data)
    # Split no further than field 24: a pass parses every running process's stat.
    rest = data[close_paren + 1 :].split(None, _STAT_FIELDS_NEEDED)
    if len(rest) < _STAT_FIELDS_NEEDED:
        raise Malformed("stat", data)
    pid = data[:open_paren].strip()
    # fields 12 majflt, 14 utime, 15 stime, 20 num_threads, 22 starttime, 24 rss
    majflt, utime, stime = rest[12 - 3], rest[14 - 3], rest[15 - 3]
    threads, start, rss = rest[20 - 3], rest[22 - 3], rest[24 - 3]
    if not (
        pid.isdigit()
        and majflt.isdigit()
        and utime.isdigit()
        and stime.isdigit()
        and threads.isdigit()
        and start.isdigit()
        and rss.isdigit()
    ):
        raise Malformed("stat", data)
    try:
        return build(Stat, (
            int(pid),
            data[open_paren + 1 : close_paren].decode("utf-8", "backslashreplace"),
            rest[0].decode("ascii", "replace"),
            int(threads),
            int(start),
            int(utime),
            int(stime),
            int(majflt),
            int(rss),
        ))  # fmt: skip
    except ValueError:  # more digits than int() takes
        raise Malformed("stat", data) from None


def parse_start_ticks(data: bytes) -> int:
    """Only field 22 of a `stat` file: a thread's start time, in ticks since boot."""
    close_paren = data.rfind(b")")
    rest = data[close_paren + 1 :].split(None, 22 - 3 + 1)
    if close_paren < 0 or len(rest) < 22 - 3 + 1:
        raise Malformed("stat", data)
    return _natural(rest[22 - 3], "stat", data)


def parse_schedstat(data: bytes) -> SchedStat:
    """`schedstat`: on-CPU ns, run-delay ns, timeslices (Documentation/scheduler/sched-stats)."""
    parts = data.split()
    if len(parts) == 3:
        on_cpu, run_delay, timeslices = parts
        if (on_cpu + run_delay + timeslices).isdigit():  # one check for the three
            try:
                return build(SchedStat, (int(on_cpu), int(run_delay), int(timeslices)))
            except ValueError:  # more digits than int() takes
                raise Malformed("schedstat", data) from None
    raise Malformed("schedstat", data)


def _line_value(data: bytes, key: bytes, what: str) -> int:
    """The number on the line `<key><whitespace>number`; `key` starts with a newline, so
    that it matches a whole key at a line start (not the tail of a longer key)."""
    start = data.find(key)
    if start < 0:
        if not data.startswith(key[1:]):
            raise Malformed(what, data)
        start = -1
    start += len(key)
    end = data.find(b"\n", start)
    value = data[start:end].strip() if end >= 0 else data[start:].strip()
    if not value.isdigit():
        raise Malformed(what, data)
    try:
        return int(value)
    except ValueError:  # more digits than int() takes
        raise Malformed(what, data) from None


def parse_status_switches(data: bytes) -> Switches:
    """The two context-switch lines of `status`; every other line is ignored."""
    match = _SWITCHES.search(data, len(data) - _SWITCHES_SPAN)
    if match is not None:
        try:
            return build(Switches, (int(match[1]), int(match[2])))
        except ValueError:  # more digits than int() takes
            raise Malformed("status", data) from None
    return Switches(
        _line_value(data, b"\nvoluntary_ctxt_switches:", "status"),
        _line_value(data, b"\nnonvoluntary_ctxt_switches:", "status"),
    )


def parse_io(data: bytes) -> IOBytes:
    """`read_bytes` and `write_bytes` of `io`: storage traffic, not `rchar`/`wchar`."""
    match = _IO.search(data)
    if match is not None:
        try:
            return build(IOBytes, (int(match[1]), int(match[2])))
        except ValueError:  # more digits than int() takes
            raise Malformed("io", data) from None
    return IOBytes(
        _line_value(data, b"\nread_bytes:", "io"),
        _line_value(data, b"\nwrite_bytes:", "io"),
    )


def parse_cgroup(data: bytes) -> tuple[CgroupLine, ...]:
    """`/proc/<pid>/cgroup`: one `hierarchy-ID:controller-list:path` per line.

    The path is split at the first two colons only: a v1 `name=systemd` path may hold
    colons itself (`…pod<uid>.slice:cri-containerd:<id>`). Lines end at LF alone: a CR, a
    form feed or a line separator is a cgroup name's own. Bytes that are not UTF-8 are held
    as surrogates (`surrogateescape`), so that two names stay two, and the path can be
    encoded back to the directory's own bytes; `collector.groups.label_of` escapes them.
    """
    lines = []
    for raw in data.split(b"\n"):
        if not raw:
            continue
        parts = raw.split(b":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith(b"/"):
            raise Malformed("cgroup", data)
        controllers = tuple(c for c in parts[1].decode("utf-8", "replace").split(",") if c)
        try:
            lines.append(
                CgroupLine(
                    hierarchy=int(parts[0]),
                    controllers=controllers,
                    path=parts[2].decode("utf-8", "surrogateescape"),
                )
            )
        except ValueError:  # more digits than int() takes
            raise Malformed("cgroup", data) from None
    if not lines:
        raise Malformed("cgroup", data)
    return tuple(lines)


def parse_flat_keyed(data: bytes, what: str = "cpu.stat") -> dict[bytes, int]:
    """A cgroup "flat keyed" file such as `cpu.stat`: one `key value` pair per line
    (Documentation/admin-guide/cgroup-v2.rst, "Format"). Keys the kernel adds later are
    kept and ignored by the caller."""
    parts = data.split()
    # two tokens on every line, every second one a number: one check for the whole file
    if parts and len(parts) == 2 * data.count(b"\n") and b"".join(parts[1::2]).isdigit():
        try:
            return dict(zip(parts[0::2], map(int, parts[1::2]), strict=True))
        except ValueError:  # more digits than int() takes
            raise Malformed(what, data) from None
    values: dict[bytes, int] = {}
    for line in data.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not fields[1].isdigit():
            raise Malformed(what, data)
        try:
            values[fields[0]] = int(fields[1])
        except ValueError:  # more digits than int() takes
            raise Malformed(what, data) from None
    if not values:
        raise Malformed(what, data)
    return values


def parse_single_value(data: bytes, what: str = "cpuacct.usage") -> int:
    """A file that holds one non-negative integer, such as v1 `cpuacct.usage` (ns)."""
    return _natural(data.strip(), what, data)


def parse_pressure(data: bytes, what: str = "pressure") -> Pressure:
    """A PSI file: `some avg10=… avg60=… avg300=… total=<µs>` and, where the kernel has
    it, the same for `full` (Documentation/accounting/psi.rst). Only the totals, which
    only grow, are kept: the averages are the kernel's own ratios."""
    match = _PRESSURE.fullmatch(data)
    if match is not None:
        full = match[2]
        try:
            return build(Pressure, (int(match[1]), None if full is None else int(full)))
        except ValueError:  # more digits than int() takes
            raise Malformed(what, data) from None
    totals: dict[bytes, int] = {}
    for line in data.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] not in (b"some", b"full") or not parts[-1].startswith(b"total="):
            raise Malformed(what, data)
        totals[parts[0]] = _natural(parts[-1][len(b"total=") :], what, data)
    if b"some" not in totals:
        raise Malformed(what, data)
    return Pressure(totals[b"some"], totals.get(b"full"))


def parse_cpu_max(data: bytes) -> tuple[int | None, int]:
    """v2 `cpu.max`: `$MAX $PERIOD`, the quota and its period in µs, `max` for no quota
    (Documentation/admin-guide/cgroup-v2.rst, "CPU Interface Files")."""
    parts = data.split()
    if len(parts) != 2 or not (parts[0] == b"max" or parts[0].isdigit()):
        raise Malformed("cpu.max", data)
    period = _natural(parts[1], "cpu.max", data)
    try:
        return (None if parts[0] == b"max" else int(parts[0])), period
    except ValueError:  # more digits than int() takes
        raise Malformed("cpu.max", data) from None


def parse_cfs_quota(data: bytes) -> int | None:
    """v1 `cpu.cfs_quota_us`: the quota per period in µs, -1 for none
    (Documentation/scheduler/sched-bwc.rst)."""
    text = data.strip()
    return None if text == b"-1" else _natural(text, "cpu.cfs_quota_us", data)
