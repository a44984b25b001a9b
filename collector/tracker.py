"""The guarded cache (docs/reference.md §2): readings and an instant in, deltas and refusals out.

Pure: no I/O, no clock of its own. Identity is (pid, start time), and each thread is
guarded the same way by (tid, start time). Every PID a pass does not see is dropped,
so the cache is bounded by the process table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from operator import is_
from typing import NamedTuple

from collector.model import Fields, ProcessReading, ThreadReading, build, ticks_to_ns
from collector.plainread import Carried


class ProcessDelta(NamedTuple):
    """One process's contribution to an interval, with the reading it came from."""

    reading: ProcessReading
    fields: Fields
    born: bool


@dataclass(slots=True)
class Advance:
    """The outcome of one pass through the guard."""

    deltas: list[ProcessDelta] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    threads_refused: Counter[str] = field(default_factory=Counter)
    # Carried processes, summed by the bytes of their cgroup file: [processes, observed
    # ns]. Each is one delta whose every other field is 0 (nothing of it moved).
    carried: dict[bytes, list[int]] = field(default_factory=dict)
    # The processes of each carried block by PID, by its cgroup file: those `carried`
    # counts (for the processes view, collector/processes.py).
    carried_members: Mapping[bytes, Mapping[int, ProcessReading]] = field(default_factory=dict)


_ThreadSums = tuple[int, int, int, int, int, int]
"""Σ over a process's threads: on-CPU, run delay, (non)voluntary switches, read, write."""
_NO_THREAD_DELTA: _ThreadSums = (0, 0, 0, 0, 0, 0)


def _process_fell(new: ProcessReading, old: ProcessReading, since_ns: int) -> bool:
    return (
        new.at_ns < since_ns
        or new.utime_ticks < old.utime_ticks
        or new.stime_ticks < old.stime_ticks
        or new.major_faults < old.major_faults
    )


class _Undo:
    """The instants a pass's blocks moved before its processes read were guarded, to put
    them back if the pass fails (the cache itself is written only once the pass is taken):
    per PID its instant cell as it was (None: absent), and each shared cell's instant as
    it was. Applied in reverse, the oldest value wins."""

    __slots__ = ("cells", "entries")

    def __init__(self) -> None:
        self.entries: list[tuple[int, list[int] | None]] = []
        self.cells: list[tuple[list[int], int]] = []

    def apply(self, since_of: dict[int, list[int]]) -> None:
        for pid, cell in reversed(self.entries):
            if cell is None:
                since_of.pop(pid, None)
            else:
                since_of[pid] = cell
        for cell, ns in reversed(self.cells):
            cell[0] = ns


class Tracker:
    """Keeps one reading per PID (and per TID within it) between passes.

    `hz` is USER_HZ, the unit of start times and of utime/stime.
    """

    def __init__(self, hz: int):
        self.hz = hz
        # One reading per PID (its threads are the thread cache), kept in place from pass
        # to pass: a PID no pass sees is dropped, a carried process's entry is untouched.
        self._cache: dict[int, ProcessReading] = {}
        # The instant a cached reading stands for, where it is not its own `at_ns`: a
        # reading carried over unread stands for the last pass that carried it. A cell
        # (`[ns]`), one per carried block, shared by its processes: a block carried
        # again moves every one of theirs at once.
        self._since: dict[int, list[int]] = {}
        # Last pass's carried blocks, by cgroup: the readings mapping accepted (the
        # reader's own object, where it accepted all of it) and the block's cell.
        self._blocks: dict[bytes, tuple[Mapping[int, ProcessReading], list[int]]] = {}
        self._previous_listing_ns: int | None = None

    @property
    def previous_listing_ns(self) -> int | None:
        """When the last pass it guarded began listing `/proc` (None before the first)."""
        return self._previous_listing_ns

    @property
    def tracked_processes(self) -> int:
        return len(self._cache)

    @property
    def tracked_threads(self) -> int:
        return sum(len(reading.threads) for reading in self._cache.values())

    def _born_since_previous_pass(self, start_ticks: int, at_ns: int) -> bool:
        """The birth rule: started after the previous pass began listing, so it is all new."""
        previous = self._previous_listing_ns
        if previous is None:
            return False
        start_ns = ticks_to_ns(start_ticks, self.hz)
        return previous < start_ns <= at_ns

    def advance(
        self,
        readings: Iterable[ProcessReading],
        listed_at_ns: int,
        carried: Iterable[Carried] = (),
        carried_at_ns: int | None = None,
    ) -> Advance:
        """Guard one pass. `listed_at_ns` is when this pass began listing `/proc`.

        `carried`: the blocks the reader carried over (`PassReadings.carried`): last
        pass's very readings, which stand for `carried_at_ns`. Each gives the delta of a
        process that did not run — processes 1, its observed time, every other field 0 —
        summed by cgroup file into `Advance.carried` rather than one `ProcessDelta` each;
        one that is not such a continuation is guarded like any reading.

        The processes a block shares with last pass's block of its cgroup, where their
        readings are the very ones accepted there (each was checked when it joined, and
        none was given since), are such continuations as a whole: their observed time
        is their number times the span since the block's instant, and a block given
        again as the same object costs O(1). A process joining a block is checked on its
        own; one leaving it keeps the block's last instant as its own.

        All or nothing: a pass that raises midway leaves the tracker as it was (the
        processes read are written into the cache, and this pass's blocks kept, only once
        all of them are guarded; the instants the blocks moved before are put back), so the
        next pass's deltas run from the last pass that completed and nothing of the failed
        one is lost."""
        undo = _Undo()
        try:
            return self._advance(readings, listed_at_ns, carried, carried_at_ns, undo)
        except BaseException:
            undo.apply(self._since)
            raise

    def _advance(
        self,
        readings: Iterable[ProcessReading],
        listed_at_ns: int,
        carried: Iterable[Carried],
        carried_at_ns: int | None,
        undo: _Undo,
    ) -> Advance:
        result = Advance()
        cache, since_of = self._cache, self._since
        alive: set[int] = set()
        others: list[ProcessReading] = []
        blocks = self._continue_blocks(carried, carried_at_ns, result.carried, others, alive, undo)
        # The processes read are guarded against the cache as it stands and written into
        # it only once every one of them is (below): a pass that fails midway wrote none.
        if others or not isinstance(readings, (list, tuple)):  # iterated twice
            readings = [*readings, *others]
        for reading in readings:
            pid = reading.pid
            alive.add(pid)
            old = cache.get(pid)
            cell = since_of.get(pid)
            same_process = old is not None and old.start_ticks == reading.start_ticks
            if same_process and reading.threads is old.threads:
                # The reader's very readings of last pass (a quiet process): zero deltas.
                thread_sums, thread_refusals = _NO_THREAD_DELTA, None
            else:
                old_threads = old.threads if same_process else ()
                thread_sums, thread_refusals = self._guard_threads(reading, old_threads)

            if old is not None and same_process:
                since_ns = old.at_ns if cell is None else cell[0]
                if _process_fell(reading, old, since_ns):
                    result.refused["counter_fell"] += 1
                    continue
                base, born = old, False
            elif self._born_since_previous_pass(reading.start_ticks, reading.at_ns):
                base, born = None, True
            else:
                result.refused["first_seen" if old is None else "pid_reused"] += 1
                continue

            hz = self.hz
            if base is None:
                observed = reading.at_ns - ticks_to_ns(reading.start_ticks, hz)
                user, system, faults = (
                    reading.utime_ticks,
                    reading.stime_ticks,
                    reading.major_faults,
                )
            else:
                observed = reading.at_ns - since_ns
                user = reading.utime_ticks - base.utime_ticks
                system = reading.stime_ticks - base.stime_ticks
                faults = reading.major_faults - base.major_faults
            on_cpu, delay, voluntary, nonvoluntary, read_bytes, write_bytes = thread_sums
            fields = Fields(
                1, observed, on_cpu, delay, ticks_to_ns(user, hz), ticks_to_ns(system, hz),
                faults, voluntary, nonvoluntary, read_bytes, write_bytes,
            )  # fmt: skip
            result.deltas.append(build(ProcessDelta, (reading, fields, born)))
            if thread_refusals:
                result.threads_refused.update(thread_refusals)
        # Nothing fails below: the pass is taken whole.
        for reading in readings:
            pid = reading.pid
            cache[pid] = reading
            if pid in since_of:  # its instant is this reading's own from now on
                del since_of[pid]
        for pid in cache.keys() - alive:  # not seen this pass: gone
            del cache[pid]
            since_of.pop(pid, None)
        self._blocks = blocks
        self._previous_listing_ns = listed_at_ns
        result.carried_members = {cgroup: block[0] for cgroup, block in blocks.items()}
        return result

    def _continue_blocks(
        self,
        carried: Iterable[Carried],
        at_ns: int | None,
        sums: dict[bytes, list[int]],
        others: list[ProcessReading],
        alive: set[int],
        undo: _Undo,
    ) -> dict[bytes, tuple[Mapping[int, ProcessReading], list[int]]]:
        """Sum each carried block into `sums` ([processes, observed ns] by cgroup file);
        readings that are no continuation of their cached one go to `others`, to be
        guarded as read. Every PID carried is added to `alive`. This pass's blocks. Each
        instant it moves is noted in `undo`."""
        cache, since_of, before = self._cache, self._since, self._blocks
        entries = undo.entries
        blocks: dict[bytes, tuple[Mapping[int, ProcessReading], list[int]]] = {}
        for block in carried:
            if at_ns is None:
                raise ValueError("readings carried as they were need carried_at_ns")
            members = block.readings
            alive.update(members)
            last = before.get(block.cgroup)
            kept: Collection[int] = ()
            if last is not None and last[1][0] <= at_ns:
                accepted_before, cell = last
                if accepted_before is members:  # the very block: every reading accepted
                    kept = members
                else:  # the readings it kept must be the very ones accepted last pass
                    common = members.keys() & accepted_before.keys()
                    if all(
                        map(is_, map(members.__getitem__, common),
                            map(accepted_before.__getitem__, common))
                    ):  # fmt: skip
                        kept = common
                        for pid in accepted_before.keys() - common:  # leaving it this pass
                            entries.append((pid, since_of.get(pid)))
                            since_of[pid] = [cell[0]]  # its instant, not the block's next
            if kept:
                observed = len(kept) * (at_ns - cell[0])
            else:
                cell, observed = [at_ns], 0
            refused: set[int] = set()
            for pid, reading in members.items() if kept is not members else ():
                if pid in kept:
                    continue
                old = cache.get(pid)
                if old is None or reading is not old:
                    others.append(reading)
                    refused.add(pid)
                    continue
                since = since_of.get(pid)
                since_ns = old.at_ns if since is None else since[0]
                if at_ns < since_ns:
                    others.append(reading)
                    refused.add(pid)
                    continue
                observed += at_ns - since_ns
                entries.append((pid, since))
                since_of[pid] = cell
            undo.cells.append((cell, cell[0]))
            cell[0] = at_ns
            count = len(members) - len(refused)
            if not count:
                continue
            if refused:
                members = {pid: r for pid, r in members.items() if pid not in refused}
            blocks[block.cgroup] = (members, cell)
            total = sums.get(block.cgroup)
            if total is None:
                sums[block.cgroup] = [count, observed]
            else:
                total[0] += count
                total[1] += observed
        return blocks

    def _guard_threads(
        self,
        reading: ProcessReading,
        old_threads: tuple[ThreadReading, ...],
    ) -> tuple[_ThreadSums, Counter[str] | None]:
        """Σ of the per-thread deltas of one process, and the threads refused (counted only
        when the process itself contributes). `old_threads`: its threads' last readings.

        Run for every thread every pass: readings are unpacked into locals and summed in
        locals (a NamedTuple attribute or a slot costs a lookup each). A thread's last
        reading is looked for first at the same position (the reader lists threads in TID
        order, so it is there unless a thread came or went), then by TID.
        """
        on_cpu = delay = voluntary = nonvoluntary = read_bytes = write_bytes = 0
        refused: Counter[str] | None = None  # made on the first refusal: most have none
        by_tid: dict[int, ThreadReading] | None = None  # made on the first misplaced thread
        count = len(old_threads)
        for position, thread in enumerate(reading.threads):
            tid, start, cpu, wait, _, vol, nonvol, read, write = thread
            old = old_threads[position] if position < count else None
            if old is None or old[0] != tid:
                if by_tid is None:
                    by_tid = {seen[0]: seen for seen in old_threads}
                old = by_tid.get(tid)
            if old is thread:
                continue  # the very reading of last pass (an idle thread): a zero delta
            if old is not None and old[1] == start:
                _, _, old_cpu, old_wait, _, old_vol, old_nonvol, old_read, old_write = old
                if (
                    cpu < old_cpu
                    or wait < old_wait
                    or vol < old_vol
                    or nonvol < old_nonvol
                    or read < old_read
                    or write < old_write
                ):
                    refused = refused or Counter()
                    refused["counter_fell"] += 1
                    continue
                on_cpu += cpu - old_cpu
                delay += wait - old_wait
                voluntary += vol - old_vol
                nonvoluntary += nonvol - old_nonvol
                read_bytes += read - old_read
                write_bytes += write - old_write
            elif self._born_since_previous_pass(start, reading.at_ns):
                on_cpu += cpu
                delay += wait
                voluntary += vol
                nonvoluntary += nonvol
                read_bytes += read
                write_bytes += write
            else:
                refused = refused or Counter()
                refused["first_seen" if old is None else "pid_reused"] += 1
        return (on_cpu, delay, voluntary, nonvoluntary, read_bytes, write_bytes), refused
