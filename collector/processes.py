"""The processes view (docs/reference.md §8): which process waits, at no series cost.

A pass already has every process's guarded delta (docs/reference.md §2) before it sums
them per group. It keeps them — references to what it built anyway, in a `ProcessTable`
— and a request for `/processes` (or `procdelta top`) makes its view from them: the
processes that match, sorted, cut to the limit. Nothing here runs in a pass.

A process is listed with the very delta the pass summed into its group, so a group's
processes add up to its interval gauges of the same pass. Processes carried over unread
(their cgroup did not run: collector/reading.py) are listed too, each with zero counters
and its share of the time its block was observed (their sum is the block's, exactly).

Only the kernel's `comm` (16 bytes, the name the process gave itself) is served, never
its command line or environment: those hold secrets.
"""

from __future__ import annotations

import heapq
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeGuard

from collector.groups import Group
from collector.model import FIELD_NAMES, CgroupFields, Fields
from collector.tracker import CarriedDelta, ProcessDelta

SORT_FIELDS: tuple[str, ...] = FIELD_NAMES[1:]
"""What `sort` takes: every field of docs/reference.md §3 but `processes` (1 for each)."""

STORAGE_FIELDS: tuple[str, ...] = ("read_bytes", "write_bytes")
"""A process's storage bytes (`/proc/<pid>/io`), which the kernel shows its owner alone
(mode 0400 since CVE-2011-2495: another user's write counts leak what it types): the view
withholds them from a client the listener does not authenticate, unless told otherwise."""

DEFAULT_SORT = "run_delay_nanos"
DEFAULT_LIMIT = 20
MAX_LIMIT = 100_000

FILTER_LABELS: tuple[str, ...] = (
    "namespace",
    "pod",
    "uid",
    "qos",
    "container",
    "container_id",
    "cgroup",
)
"""The group labels a query may match exactly (docs/reference.md §4)."""


class QueryError(ValueError):
    """A bad query parameter: its message is the one line a 400 answers with."""


def shown(text: str, at_most: int = 40) -> str:
    """What a client sent, as an error names it: quoted with its control characters
    escaped (repr), and cut to `at_most` characters."""
    if len(text) > at_most:
        return repr(text[:at_most]) + f"... ({len(text)} characters)"
    return repr(text)


@dataclass(frozen=True, slots=True)
class Query:
    """What to list: exact matches on group labels, the field to sort by (biggest first,
    then by PID), and how many (None: all)."""

    filters: tuple[tuple[str, str], ...] = ()
    sort: str = DEFAULT_SORT
    limit: int | None = DEFAULT_LIMIT

    @classmethod
    def parse(cls, query: str) -> Query:
        """From a URL's query string; `QueryError` says what is wrong in one line."""
        try:
            pairs = urllib.parse.parse_qsl(
                query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=32
            )
        except ValueError as error:
            raise QueryError(f"malformed query string: {error}") from None
        seen: set[str] = set()
        filters: list[tuple[str, str]] = []
        limit: int | None
        sort, limit = DEFAULT_SORT, DEFAULT_LIMIT
        for name, value in pairs:
            if name in seen:
                raise QueryError(f"parameter {shown(name)} given twice")
            seen.add(name)
            if name in FILTER_LABELS:
                filters.append((name, value))
            elif name == "sort":
                if value not in SORT_FIELDS:
                    raise QueryError(f"sort={shown(value)}: want one of {', '.join(SORT_FIELDS)}")
                sort = value
            elif name == "limit":
                limit = _limit(value)
            else:
                known = ", ".join((*FILTER_LABELS, "sort", "limit"))
                raise QueryError(f"unknown parameter {shown(name)}: want one of {known}")
        return cls(tuple(filters), sort, limit)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(name) == value for name, value in self.filters)


def _limit(value: str) -> int | None:
    """Bounded before it is parsed: no more digits than MAX_LIMIT's (leading zeros aside),
    so that no client makes `int()` convert thousands of them (or raise past 4,300)."""
    digits = value.lstrip("0") if value.isascii() and value.isdigit() else None
    if digits is None or len(digits) > len(str(MAX_LIMIT)) or int(digits or 0) > MAX_LIMIT:
        raise QueryError(f"limit={shown(value)}: want an integer from 0 (all) to {MAX_LIMIT}")
    return int(digits or 0) or None


class Row(NamedTuple):
    """One process of the view: its delta over the pass's interval."""

    pid: int
    comm: str
    group: Group
    threads: int
    fields: Fields


@dataclass(frozen=True, slots=True)
class ProcessTable:
    """What a pass kept for the view: references to what it built anyway.

    `deltas` and `group_of_pid` as the pass guarded and grouped them (a PID whose group
    is None was left out of the sums); `carried` and `group_of_cgroup` likewise for the
    blocks carried over unread: each as the guard took it, and its group by cgroup file
    (absent: left out)."""

    deltas: Sequence[ProcessDelta] = ()
    group_of_pid: Mapping[int, Group | None] = field(default_factory=dict)
    carried: Sequence[CarriedDelta] = ()
    group_of_cgroup: Mapping[bytes, Group] = field(default_factory=dict)

    def rows(self, query: Query) -> list[Row]:
        """The processes the query matches, sorted and cut to its limit."""
        rows = self._rows(_matcher(query))
        name = query.sort

        def key(row: Row) -> tuple[int, int]:
            return -getattr(row.fields, name), row.pid

        if query.limit is None:
            return sorted(rows, key=key)
        return heapq.nsmallest(query.limit, rows, key=key)

    def _rows(self, matches: Callable[[Group | None], TypeGuard[Group]]) -> Iterator[Row]:
        group_of = self.group_of_pid
        for reading, fields, _born in self.deltas:
            group = group_of.get(reading.pid)
            if matches(group):
                yield Row(reading.pid, reading.comm, group, len(reading.threads), fields)
        for block in self.carried:
            group = self.group_of_cgroup.get(block.cgroup)
            members = block.readings
            if not matches(group) or not members:
                continue
            share, extra = divmod(block.observed_ns, len(members))
            for index, pid in enumerate(sorted(members)):
                reading = members[pid]
                fields = Fields(1, share + (index < extra))
                yield Row(pid, reading.comm, group, len(reading.threads), fields)

    def pids(self, query: Query) -> list[int]:
        """Every PID the pass saw in a group the query matches, with a delta or not."""
        matches = _matcher(query)
        pids = {pid for pid, group in self.group_of_pid.items() if matches(group)}
        for block in self.carried:
            if matches(self.group_of_cgroup.get(block.cgroup)):
                pids.update(block.readings)
        return sorted(pids)

    def groups(self, query: Query) -> set[Group]:
        """Every group with a process in the table that the query matches."""
        groups = {g for g in self.group_of_pid.values() if g is not None}
        groups.update(self.group_of_cgroup.values())
        return {g for g in groups if query.matches(g.label_dict())}


def _matcher(query: Query) -> Callable[[Group | None], TypeGuard[Group]]:
    """Whether a group (None: a process left out of the sums) is one the query matches,
    each group's labels matched once."""
    matched: dict[Group, bool] = {}

    def matches(group: Group | None) -> TypeGuard[Group]:
        if group is None:
            return False
        answer = matched.get(group)
        if answer is None:
            answer = matched[group] = query.matches(group.label_dict())
        return answer

    return matches


def process_row(row: Row, names: Sequence[str] = SORT_FIELDS) -> dict[str, object]:
    """A process as docs/reference.md §8 gives it: pid, comm, group, threads, then the
    fields of §3 but `processes` (those of `names`)."""
    item: dict[str, object] = {
        "pid": row.pid,
        "comm": row.comm,
        "group": row.group.label_dict(),
        "threads": row.threads,
    }
    fields = row.fields
    item.update((name, getattr(fields, name)) for name in names)
    return item


def group_row(
    group: Group, fields: Fields | None, cgroup: CgroupFields | None, cgroup_fields: bool
) -> dict[str, object]:
    """A group as `once --format json` gives it: its labels under "group", the fields of
    §3, then (unless the cgroup fields are off) those of §7, null where its cgroup has
    no such file or gave no delta."""
    row: dict[str, object] = {"group": group.label_dict()}
    fields = fields or Fields()
    row.update((name, getattr(fields, name)) for name in FIELD_NAMES)
    if cgroup_fields:
        row.update((cgroup or CgroupFields()).as_dict())
    return row


@dataclass(frozen=True, slots=True)
class PassView:
    """A completed pass as the view needs it: its table, interval and groups' sums."""

    table: ProcessTable = field(default_factory=ProcessTable)
    interval_ns: int | None = None
    timestamp: float | None = None  # unix time the pass completed
    intervals: Mapping[Group, Fields] = field(default_factory=dict)
    cgroup_intervals: Mapping[Group, CgroupFields] = field(default_factory=dict)

    @classmethod
    def of(cls, result) -> PassView:
        """Of a `collector.engine.PassResult`."""
        return cls(
            result.processes,
            result.interval_ns,
            result.finished_at,
            result.intervals,
            result.cgroup_intervals,
        )

    def document(
        self, query: Query, cgroup_fields: bool = True, storage_bytes: bool = True
    ) -> dict[str, object]:
        """The response of docs/reference.md §8: the pass's interval and instant, the
        processes, and the groups they belong to (those the query's filters match, or
        with none, those of the processes listed) as `once --format json` gives them, so
        that a process reads beside its group's own cgroup of the same pass. Without
        `storage_bytes`, no process has its STORAGE_FIELDS, and "withheld" names them
        (its groups' sums keep theirs: /metrics serves them)."""
        if not storage_bytes and query.sort in STORAGE_FIELDS:
            raise QueryError(f"sort={query.sort}: this client is not served storage bytes")
        names = SORT_FIELDS if storage_bytes else _WITHOUT_STORAGE
        rows = self.table.rows(query)
        if query.filters:
            groups = self.table.groups(query)
            groups.update(
                g
                for g in self.intervals.keys() | self.cgroup_intervals.keys()
                if query.matches(g.label_dict())
            )
        else:
            groups = {row.group for row in rows}

        def cpu(group: Group) -> tuple[int, tuple]:
            fields, cgroup = self.intervals.get(group), self.cgroup_intervals.get(group)
            used = max(
                fields.on_cpu_nanos if fields else 0,
                (cgroup.cgroup_cpu_nanos or 0) if cgroup else 0,
            )
            return -used, group.labels

        document: dict[str, object] = {
            "interval_seconds": None if self.interval_ns is None else self.interval_ns / 1e9,
            "timestamp": self.timestamp,
            "processes": [process_row(row, names) for row in rows],
            "groups": [
                group_row(g, self.intervals.get(g), self.cgroup_intervals.get(g), cgroup_fields)
                for g in sorted(groups, key=cpu)
            ],
        }
        if not storage_bytes:
            document["withheld"] = list(STORAGE_FIELDS)
        return document


_WITHOUT_STORAGE = tuple(name for name in SORT_FIELDS if name not in STORAGE_FIELDS)
