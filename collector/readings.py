"""What a pass reads, for both readers: the plain one (collector/plainread.py, the oracle)
and the incremental one the collector runs (collector/reading.py). The types of a pass's
readings (`PassReadings`, `Footprint`, a `Carried` block, `Unreadable`), the clock they are
stamped with, and the incremental reader's loop over what it listed (`collect`); the
oracle has its own, so that what they are held to (tests/unit/test_incremental.py) shares no
code between them but these definitions.

**The identity contract** between the incremental reader and the guard (collector/tracker.py),
stated here once; tests/unit/test_identity_contract.py holds each clause by name. A reading
is immutable, and the two pass readings by reference, so that what did not move is known
without a field compared:

1. What the reader did not read again it hands back as the very object it handed before —
   an idle thread's `ThreadReading`, a carried process's `ProcessReading` — never an equal
   copy; the guard takes `is` its cached reading as a zero delta (an idle thread, a quiet
   process's threads) or a carried block's member accepted.
2. A carried block whose members all stand is handed back as the very `Carried.readings`
   mapping of the pass before, and the guard, where it accepted every member, gives back
   that very mapping (`CarriedDelta.readings`): a block that stands costs O(1) in the guard
   and in the sums, whatever its size.
3. Identity only ever saves work, never decides a delta: a reading equal but not the same
   object goes the long way — subtracted field by field, or, as a carried member, refused
   from the block and guarded as read (a zero delta; its process-time observed counted at
   its next carry, from its cached instant) — and the sums come out the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from collector.model import AccessDenied, ProcError, ProcessGone, ProcessReading, build

log = logging.getLogger(__name__)

Clock = Callable[[], int]


def boottime_ns() -> int:
    """CLOCK_BOOTTIME in ns: the clock `/proc/<pid>/stat` start times are counted on."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class Footprint(NamedTuple):
    """What a pass saw of a process, delta or not: its cgroup, threads and resident memory."""

    pid: int
    cgroup: bytes
    threads: int
    rss_bytes: int


class Carried(NamedTuple):
    """The processes of one cgroup carried over unread, as a block (collector/reading.py):
    their cgroup did not run, so no file of theirs was read. `readings`: each process's
    last reading, the very object, by PID (the identity contract, above). The footprint sums
    are the block's own, kept with it: a block that stands from pass to pass is the same
    object, summed in O(1) (`Tracker.advance`, `group_pass`)."""

    cgroup: bytes  # the `cgroup` file every one of them read when last read
    readings: Mapping[int, ProcessReading]
    threads: int
    rss_bytes: int


@dataclass(frozen=True, slots=True)
class PassReadings:
    """Everything one pass read. `listed_at_ns` is the instant the pass began listing."""

    listed_at_ns: int
    processes: tuple[ProcessReading, ...]  # read (or proved quiet), each with a footprint
    footprints: tuple[Footprint, ...]
    vanished: int
    unreadable: int
    denied: int
    # Carried over, their cgroup quiet, no file of theirs read: their last readings, the
    # very objects, which stand for `carried_at_ns` (their own `at_ns` is when they were
    # read), in one block per cgroup. Their footprints are their own fields
    # (collector/aggregate.py sums them by block).
    carried: tuple[Carried, ...] = ()
    carried_at_ns: int | None = None
    # When every process listed was read and its tasks listed (a task missing from the
    # readings had exited by then: the exit records' guard, collector/tracker.py).
    read_until_ns: int | None = None

    @property
    def carried_by_cgroup(self) -> int:
        """The processes of which this pass read no file: their cgroup had not run."""
        return sum(len(block.readings) for block in self.carried)


class Unreadable(ProcError):
    """A process that could not be read whole; carries what was seen of it, if anything."""

    def __init__(self, footprint: Footprint | None, cause: ProcError):
        super().__init__(str(cause))
        self.footprint = footprint
        self.cause = cause


def collect(
    listed_at_ns: int,
    listed: Iterable[tuple[int, int]],
    read: Callable[[int, int], ProcessReading],
    clock: Callable[[], int] | None = None,
) -> PassReadings:
    """Read each listed (pid, inode) with `read`, counting what could not be read; the
    pass read until `clock()` once every one was."""
    readings: list[ProcessReading] = []
    footprints: list[Footprint] = []
    vanished = unreadable = denied = 0
    for pid, ino in listed:
        try:
            reading = read(pid, ino)
        except ProcessGone:
            vanished += 1
            continue
        except Unreadable as error:
            unreadable += 1
            if isinstance(error.cause, AccessDenied):
                denied += 1
            else:
                log.debug("pid %d unreadable: %s", pid, error.cause)
            if error.footprint is not None:
                footprints.append(error.footprint)
            continue
        readings.append(reading)
        footprints.append(
            build(Footprint, (pid, reading.cgroup, len(reading.threads), reading.rss_bytes))
        )
    return PassReadings(
        listed_at_ns,
        tuple(readings),
        tuple(footprints),
        vanished,
        unreadable,
        denied,
        read_until_ns=None if clock is None else clock(),
    )
