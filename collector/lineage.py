"""Where a task born and gone between two passes counts (docs/reference.md §2, "Exits, where
the kernel reports them"): the group of its nearest ancestor whose group is known, each
ancestor found by PID *and* life, so that a reused PID is never an ancestor.

Pure: the lives of the holders of a PID come from the caller (`Sources`), which knows the
exit records of the pass, `/proc` as it is now and the readings the cache holds.

The kernel fact it rests on: a task's exit record names the parent it has *at its exit*
(`ac_ppid`, `bacct_add_tsk` in kernel/tsacct.c, filled in `do_exit` before the task's
children are handed on): its first parent, or, where that one exited first, the reaper the
task was given then (the nearest subreaper, or the init of its PID namespace). Either way
that parent was alive when the task exited and had begun before the task began. Of all the
processes that ever held that PID, exactly one did both: each holder began after the one
before it was gone. So a holder counts as the parent only where its life, as far as its
source knows it (`Life`), began no later than the child's and did not end before the
child's did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from typing import Final, NamedTuple

from collector.exits import ExitRecord, ProcessEnd
from collector.model import ticks_to_ns

MAX_DEPTH = 64
"""Ancestors followed at most: a chain of short-lived parents (make → sh → gcc → cc1) is a
handful; past this, the task is unplaced."""


class Life(NamedTuple):
    """One holder of a PID, as one source knows it: when it began, at the earliest and the
    latest; when it was gone, at the earliest and the latest (None: alive when last seen);
    its cgroup file where a pass read it (None: known from its exit record alone), and the
    parent its record names (0 where not known)."""

    began_from_ns: int
    began_by_ns: int
    gone_from_ns: int | None
    gone_by_ns: int | None
    cgroup: bytes | None
    ppid: int


def of_record(record: ExitRecord | ProcessEnd) -> Life:
    """A task's process's life as an exit record of it tells: begun by the record's
    derived start, earlier by as long as it may have waited; gone by its arrival, as
    much earlier; its parent then."""
    if isinstance(record, ProcessEnd):
        start, received = record.start_ns, record.received_ns
    else:
        start, received = record.group_start_ns, record.received_ns
    waited = record.waited_ns
    return Life(start - waited, start, received - waited, received, None, record.ppid)


def of_reading(start_ticks: int, cgroup: bytes, hz: int, gone_by_ns: int | None = None) -> Life:
    """A process's life as a reading of it tells: begun within the clock tick its start
    names; alive when read (gone by `gone_by_ns` where a later pass found it gone)."""
    return Life(
        ticks_to_ns(start_ticks, hz),
        ticks_to_ns(start_ticks + 1, hz),
        None,
        gone_by_ns,
        cgroup,
        0,
    )


def fits_as_parent(life: Life, began_by_ns: int, gone_from_ns: int | None) -> bool:
    """Whether a holder of a child's parent PID may be its parent: begun no later than the
    child (at the latest it may have, `began_by_ns`), and not gone before the child was (at
    the earliest it may have been, `gone_from_ns`; None: not known to be gone)."""
    return life.began_from_ns <= began_by_ns and (
        life.gone_by_ns is None or gone_from_ns is None or life.gone_by_ns >= gone_from_ns
    )


def parent_in(lives: Iterable[Life], child: Life) -> Life | None:
    """Of the lives of the holders of a child's parent PID, the parent's: begun no later
    than the child (at the earliest it may have), and not gone before the child was (at the
    latest it may have been, at the earliest the child may have been). Where two windows
    allow more than one, the latest begun, as its cgroup is known where any of its own
    lives (the same start) says it."""
    fits = [life for life in lives if fits_as_parent(life, child.began_by_ns, child.gone_from_ns)]
    if not fits:
        return None
    chosen = max(fits, key=lambda life: life.began_by_ns)
    if chosen.cgroup is None:
        for life in fits:  # the same holder, read by a pass: its start's window meets
            if life.cgroup is not None and (
                life.began_from_ns <= chosen.began_by_ns
                and chosen.began_from_ns <= life.began_by_ns
            ):
                return life
    return chosen


class Pending(Enum):
    """`PENDING`'s type: a one-member Enum, a sentinel the checker tells from a cgroup."""

    PENDING = "pending"


PENDING: Final = Pending.PENDING
"""`ancestor_cgroup`'s answer where an ancestor is not known yet: its own record may come
in the next pass's records (a parent exits after its child)."""

Sources = Callable[[int], Iterable[Sequence[Life]]]
"""The lives of the holders of a PID, source by source, in the order they are to be asked:
the first source with a life that fits (`parent_in`) answers."""


def ancestor_cgroup(
    child: Life, sources: Sources, depth: int = MAX_DEPTH
) -> bytes | Pending | None:
    """The cgroup file of the nearest ancestor of `child` (an exited task's own life, its
    `ppid` its parent's PID) that a pass read; None where there is none to find (no parent
    named, PID 1, or the chain longer than `depth`); PENDING where a holder of an
    ancestor's PID that fits is not known (yet).

    PID 1, the init of the host's PID namespace, is no ancestor: it reaps every orphan whose
    own ancestors set no subreaper, so a task that names it may have begun anywhere, and a
    service it starts runs in a cgroup of its own, not init's."""
    pid = child.ppid
    for _ in range(depth):
        if pid <= 1:
            return None
        for lives in sources(pid):
            parent = parent_in(lives, child)
            if parent is not None:
                break
        else:
            return PENDING
        if parent.cgroup is not None:
            return parent.cgroup
        child, pid = parent, parent.ppid
    return None
