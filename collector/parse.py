"""Pure parsers: `bytes` of one `/proc` file in, a frozen dataclass out.

Each raises `Malformed` (naming the file and the text) on anything it cannot read
exactly; none touches the filesystem.
"""

from __future__ import annotations

from collections.abc import Iterable

from collector.model import CgroupLine, IOBytes, Malformed, SchedStat, Stat, Switches

# Field N of proc(5)'s stat list sits at index N - 3 once the line is cut after `comm`.
_STAT_FIELDS_NEEDED = 24 - 3 + 1


def _natural(token: bytes, what: str, text: bytes) -> int:
    """A non-negative decimal integer, or Malformed."""
    if not token.isdigit():
        raise Malformed(what, text)
    return int(token)


def parse_stat(data: bytes) -> Stat:
    """`/proc/<pid>/stat` (or `task/<tid>/stat`).

    Field 2, the command name, is in parentheses and may itself hold spaces and
    parentheses, so the fields after it are counted from the *last* `)`.
    """
    open_paren = data.find(b"(")
    close_paren = data.rfind(b")")
    if open_paren < 0 or close_paren < open_paren:
        raise Malformed("stat", data)
    rest = data[close_paren + 1 :].split()
    if len(rest) < _STAT_FIELDS_NEEDED:
        raise Malformed("stat", data)
    pid = _natural(data[:open_paren].strip(), "stat", data)
    comm = data[open_paren + 1 : close_paren].decode("utf-8", "backslashreplace")
    try:
        state = rest[0].decode("ascii")
    except UnicodeDecodeError:
        raise Malformed("stat", data) from None
    return Stat(
        pid=pid,
        comm=comm,
        state=state,
        major_faults=_natural(rest[12 - 3], "stat", data),
        utime_ticks=_natural(rest[14 - 3], "stat", data),
        stime_ticks=_natural(rest[15 - 3], "stat", data),
        num_threads=_natural(rest[20 - 3], "stat", data),
        start_ticks=_natural(rest[22 - 3], "stat", data),
        rss_pages=_natural(rest[24 - 3], "stat", data),
    )


def parse_start_ticks(data: bytes) -> int:
    """Only field 22 of a `stat` file: a thread's start time, in ticks since boot."""
    close_paren = data.rfind(b")")
    rest = data[close_paren + 1 :].split()
    if close_paren < 0 or len(rest) < 22 - 3 + 1:
        raise Malformed("stat", data)
    return _natural(rest[22 - 3], "stat", data)


def parse_schedstat(data: bytes) -> SchedStat:
    """`schedstat`: on-CPU ns, run-delay ns, timeslices (Documentation/scheduler/sched-stats)."""
    parts = data.split()
    if len(parts) != 3:
        raise Malformed("schedstat", data)
    return SchedStat(
        on_cpu_ns=_natural(parts[0], "schedstat", data),
        run_delay_ns=_natural(parts[1], "schedstat", data),
        timeslices=_natural(parts[2], "schedstat", data),
    )


def _keyed_lines(data: bytes, keys: Iterable[bytes], what: str) -> dict[bytes, int]:
    """Values of `key:<whitespace>number` lines, for exactly the keys asked for."""
    wanted = set(keys)
    found: dict[bytes, int] = {}
    for line in data.splitlines():
        key, sep, value = line.partition(b":")
        if sep and key in wanted:
            found[key] = _natural(value.strip(), what, data)
    if len(found) != len(wanted):
        raise Malformed(what, data)
    return found


_SWITCH_KEYS = (b"voluntary_ctxt_switches", b"nonvoluntary_ctxt_switches")


def parse_status_switches(data: bytes) -> Switches:
    """The two context-switch lines of `status`; every other line is ignored."""
    found = _keyed_lines(data, _SWITCH_KEYS, "status")
    return Switches(
        voluntary=found[b"voluntary_ctxt_switches"],
        nonvoluntary=found[b"nonvoluntary_ctxt_switches"],
    )


_IO_KEYS = (b"read_bytes", b"write_bytes")


def parse_io(data: bytes) -> IOBytes:
    """`read_bytes` and `write_bytes` of `io`: storage traffic, not `rchar`/`wchar`."""
    found = _keyed_lines(data, _IO_KEYS, "io")
    return IOBytes(read_bytes=found[b"read_bytes"], write_bytes=found[b"write_bytes"])


def parse_cgroup(data: bytes) -> tuple[CgroupLine, ...]:
    """`/proc/<pid>/cgroup`: one `hierarchy-ID:controller-list:path` per line.

    The path is split at the first two colons only: a v1 `name=systemd` path may hold
    colons itself (`…pod<uid>.slice:cri-containerd:<id>`).
    """
    lines = []
    for raw in data.splitlines():
        if not raw:
            continue
        parts = raw.split(b":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith(b"/"):
            raise Malformed("cgroup", data)
        controllers = tuple(c for c in parts[1].decode("utf-8", "replace").split(",") if c)
        lines.append(
            CgroupLine(
                hierarchy=int(parts[0]),
                controllers=controllers,
                path=parts[2].decode("utf-8", "backslashreplace"),
            )
        )
    if not lines:
        raise Malformed("cgroup", data)
    return tuple(lines)
