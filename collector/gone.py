"""Processes born and gone between two passes, counted by parent (docs/reference.md §2,
"Exits, where the kernel reports them"): where every exit is a process's (a build farm:
make → sh → gcc → cc1, each a process of milliseconds), most records a pass takes are the
last task's of a process no pass read. `Tracker.close` would count each whole, its
process's fields with it, into the group of its nearest ancestor whose group is known
(collector/lineage.py), one record at a time (~16 µs each on a VM: an `ExitRecord`, a
`Fields`, an `ExitDelta`, the lineage walked anew). `GoneByParent` takes those records
before `close` does, from their packed tuples: each parent's known lives and each
ancestor's group looked up once a pass, each record's guard (its parent begun no later
than it, not gone before it) checked on its own, and its counters summed by the cgroup
found; the same sums, at a few µs a record.

What it does not take is given to `Tracker.close` as before, in the order it came: a
record `Tracker.unread_process` does not clear (a process a pass read or holds a task of,
a PID held by another process, a suspend since), one that waited too long to be matched,
and one whose parent is not known where it looks first (the records and the readings
held: `/proc` now, the next pass, and the exact choice among several holders of a PID
are `close`'s and the lineage's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from collector import lineage
from collector.closing import START_TOLERANCE_NS, Pending, whole
from collector.exits import ExitRecord, ExitRecords, record_of
from collector.lineage import (
    MAX_DEPTH,
    PENDING,
    Life,
    Sources,
    ancestor_cgroup,
    fits_as_parent,
)
from collector.model import Fields

# a packed record's fields (`ExitRecords.raw`, `ExitRecord`'s order) read here
_PID, _TGID, _PPID, _LAST = 0, 1, 2, 3
_COUNTED = 5  # from its arrival on: the numbers summed
_RECEIVED, _LIVED, _GROUP_LIVED, _WAITED = 5, 6, 7, 17

_FOLD_ROWS = 512
"""Rows held for a cgroup before they are summed into one: memory stays with the groups,
not with the records."""


class GoneByParent:
    """One pass's records of processes born and gone (see the module's docstring): give
    `others` the pass's records and `Tracker.close` what it yields; then `sums`.

    `unread` is `Tracker.unread_process` for these records (None: every record goes to
    `close`); `known(pid)`, the lives of the holders of a PID as the records and the
    readings held tell (the lineage's first source); `sources`, every source, in order
    (`collector.lineage.Sources`)."""

    def __init__(
        self,
        unread: Callable[[int, int], bool] | None,
        known: Callable[[int], Sequence[Life]],
        sources: Sources,
    ):
        self._unread = unread
        self._known = known
        self._sources = sources
        self._lives: dict[int, Sequence[Life]] = {}  # by parent PID: `known`'s
        self._found: dict[Life, bytes | lineage.Pending | None] = {}  # an ancestor's cgroup
        self._rows: dict[bytes, list[tuple]] = {}  # by cgroup: the records' numbers
        self._counts: dict[bytes, int] = {}  # by cgroup: the records taken

    def others(self, records: ExitRecords) -> Iterator[ExitRecord]:
        """The records not taken here, in their order, for `Tracker.close`: lazily, so
        that a record is taken or not once `close` has taken those before it (a gone
        task of the process it held: `Pending`)."""
        unread = self._unread
        if unread is None:
            yield from records
            return
        lives_of, found, rows_of, counts = self._lives, self._found, self._rows, self._counts
        for raw in records.raw():
            ppid, received, waited = raw[_PPID], raw[_RECEIVED], raw[_WAITED]
            group_start = received - raw[_GROUP_LIVED]
            if (
                not raw[_LAST]
                or ppid <= 1  # no ancestor (`ancestor_cgroup`): unplaced
                or waited > START_TOLERANCE_NS
                or not unread(
                    raw[_TGID] or raw[_PID], min(received - raw[_LIVED], group_start) - waited
                )
            ):
                yield record_of(raw)
                continue
            lives = lives_of.get(ppid)
            if lives is None:
                lives = lives_of[ppid] = self._known(ppid)
            # its parent, the one holder known, where it fits (`parent_in`'s rule); where
            # more than one is known, `close` and the lineage choose
            parent = lives[0] if len(lives) == 1 else None
            if parent is None or not fits_as_parent(parent, group_start, received - waited):
                yield record_of(raw)
                continue
            cgroup = parent.cgroup
            if cgroup is None:  # known from its record alone: its own ancestors'
                if parent not in found:
                    # (its parent, a step of the chain's MAX_DEPTH, was found here)
                    found[parent] = ancestor_cgroup(parent, self._sources, MAX_DEPTH - 1)
                ancestor = found[parent]
                if ancestor is PENDING:  # not known yet: `close`'s deferral
                    yield record_of(raw)
                    continue
                cgroup = ancestor
            key = b"" if cgroup is None else cgroup
            rows = rows_of.get(key)
            if rows is None:
                rows = rows_of[key] = []
                counts[key] = 0
            rows.append(raw[_COUNTED:])
            counts[key] += 1
            if len(rows) >= _FOLD_ROWS:
                rows[:] = [tuple(map(sum, zip(*rows, strict=True)))]

    def sums(self) -> Iterable[tuple[bytes | None, Fields]]:
        """What the records taken add, by the cgroup file of the ancestor each counts
        with (None: unplaced): each counted whole (`whole`, `processes` one each)."""
        for key, rows in self._rows.items():
            sums = tuple(map(sum, zip(*rows, strict=True)))
            summed = record_of((0, 0, 0, True, b"", *sums))
            fields = whole(summed, Pending(summed.group_start_ns, 0))
            fields.processes = self._counts[key]
            yield (key or None), fields
