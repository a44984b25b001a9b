"""The guarded cache (docs/reference.md §2): readings and an instant in, deltas and refusals out.

Pure: no I/O, no clock of its own. Identity is (pid, start time), and each thread is
guarded the same way by (tid, start time). Every PID a pass does not see is dropped,
so the cache is bounded by the process table.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Collection, Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import contains, is_
from typing import NamedTuple

from collector.closing import (
    READ,
    START_TOLERANCE_NS,
    SUSPEND_SLACK_NS,
    Closed,
    ExitDelta,
    Pending,
    last_interval,
    started_as,
    whole,
)
from collector.exits import ExitRecord
from collector.fieldtable import final_counters
from collector.model import Fields, ProcessReading, ThreadReading, build, ticks_to_ns
from collector.readings import Carried


class ProcessDelta(NamedTuple):
    """One process's contribution to an interval, with the reading it came from."""

    reading: ProcessReading
    fields: Fields
    born: bool


class CarriedDelta(NamedTuple):
    """A carried block (the reader's `Carried`) as the guard took it: the processes it
    accepted as continuations of their cached readings, by PID (the block's own mapping
    where it accepted every one), and the process-time observed of them all. Nothing else
    of theirs moved: each is one process and its observed time, every other field 0. A
    member refused is guarded as read, among `Advance.deltas`. `block` is the reader's, for
    its footprint sums."""

    block: Carried
    readings: Mapping[int, ProcessReading]
    observed_ns: int

    @property
    def cgroup(self) -> bytes:
        return self.block.cgroup


@dataclass(slots=True)
class Advance:
    """The outcome of one pass through the guard."""

    deltas: list[ProcessDelta] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    threads_refused: Counter[str] = field(default_factory=Counter)
    carried: list[CarriedDelta] = field(default_factory=list)  # one per block given


MAX_KEPT_PASSES = 16
"""At most this many passes' gone tasks are kept for their records (`Tracker.close`): at
the default interval two are, to cover START_TOLERANCE_NS; a shorter interval keeps
more, up to this."""


class _LeftBehind(NamedTuple):
    """What one pass replaced or dropped that an exit record may still close (`_take`):
    the last readings of processes gone, or of live ones that lost a task since, with the
    instants of those carried, and when the pass had read every process (a task missing
    from its readings had exited by then)."""

    read_until_ns: int
    readings: dict[int, ProcessReading]
    since: dict[int, _Instant]
    slept_ns: int  # the machine's time suspended by then (`Tracker.advance`)


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


class _Instant:
    """The instant a carried block's readings stand for, shared by its processes (each
    process's entry in `Tracker._since` is the very object): a block carried again moves
    every one of theirs at once."""

    __slots__ = ("ns",)

    def __init__(self, ns: int):
        self.ns = ns


class _Kept(NamedTuple):
    """Last pass's carried block, as the guard kept it: the readings it accepted (the
    reader's own mapping, where it accepted all of it) and the instant they stand for."""

    readings: Mapping[int, ProcessReading]
    instant: _Instant


@dataclass(slots=True)
class _Carry:
    """What the blocks given to a pass make of it, the tracker's state left untouched:
    written (`Tracker._take`) only once every process read is guarded too, so that a pass
    that fails midway changes nothing."""

    carried: list[CarriedDelta] = field(default_factory=list)
    blocks: dict[bytes, _Kept] = field(default_factory=dict)  # this pass's, by cgroup
    others: list[ProcessReading] = field(default_factory=list)  # to guard as read
    alive: set[int] = field(default_factory=set)  # every PID carried
    moves: list[tuple[_Instant, int]] = field(default_factory=list)  # a block's new instant
    instants: list[tuple[int, _Instant]] = field(default_factory=list)  # a PID's, in order


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
        # reading carried over unread stands for the last pass that carried it.
        self._since: dict[int, _Instant] = {}
        self._blocks: dict[bytes, _Kept] = {}  # last pass's carried blocks, by cgroup
        self._previous_listing_ns: int | None = None
        self._read_until_ns = 0  # when the last pass had read every process
        # with `keeps_replaced`, by PID: when the pass had read every process whose reading
        # of it began the run of readings, each with every task of the one before, that
        # ends in the cache's (a task not in the cache's was in none of them); not there:
        # the first pass's, `_first_until_ns`
        self._unchanged_since: dict[int, int] = {}
        self._first_until_ns = 0
        # Exit records (`close`): the readings the last passes dropped or, with
        # `keeps_replaced`, replaced where a task was gone from the new one (a task gone
        # before it was read, whose record comes after), newest last, and the end of the
        # latest pass whose are no longer kept (a task that started before it may have
        # been read); the processes whose last task's record closed their interval (a
        # zombie read after it adds nothing), by PID: start ticks.
        self.keeps_replaced = False
        self._left: deque[_LeftBehind] = deque()
        self._forgotten_ns: int | None = None
        self._forgotten_slept_ns = 0  # the machine's time suspended by then
        self._contributed: set[int] = set()  # PIDs the last pass took a delta of
        self._pending: dict[int, Pending] = {}  # by PID: processes born since, never read
        self._passes = 0
        self._closed: dict[int, int] = {}
        # the processes held whose last task's record came (`close`), by PID: their start
        # ticks, and their end as the record tells it (`ended`)
        self._ended: dict[int, tuple[int, int, int]] = {}

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

    def pend(
        self, tgid: int, group_start_ns: int, *, utime_us: int, stime_us: int, major_faults: int
    ) -> None:
        """What tasks of a process born since, gone and folded as they came
        (`collector.exits.Fold`), add to its user and system time and major faults: held
        as its own gone tasks' are (`Pending`), for its last task's record, or dropped
        where a pass reads the process. Its keywords are the process counters' record
        attributes (`fieldtable.process_record_counters`)."""
        pending = self._pending.get(tgid)
        if pending is None or abs(pending.group_start_ns - group_start_ns) > START_TOLERANCE_NS:
            pending = self._pending[tgid] = Pending(group_start_ns, self._passes)
        pending.utime_us += utime_us
        pending.stime_us += stime_us
        pending.major_faults += major_faults

    def held(self, pid: int) -> Iterator[tuple[ProcessReading, int | None]]:
        """The readings of PID `pid` held: the cache's (None: alive when its pass read it),
        then those the last passes left, newest first, each with the end of the pass that
        left it (gone by then, unless it was only a task of it that was)."""
        reading = self._cache.get(pid)
        if reading is not None:
            yield reading, None
        for left in reversed(self._left):
            old = left.readings.get(pid)
            if old is not None:
                yield old, left.read_until_ns

    def ended(self, pid: int, start_ticks: int) -> tuple[int, int] | None:
        """When the process held as PID `pid` that started at `start_ticks` ended, as its
        last task's record said (`close`), at the earliest and the latest; None where no
        such record came. A reading held says only that it was alive when read and, where a
        later pass found it gone, that it was gone by then."""
        end = self._ended.get(pid)
        if end is None or end[0] != start_ticks:
            return None
        return end[1], end[2]

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
        read_until_ns: int | None = None,
        slept_ns: int = 0,
    ) -> Advance:
        """Guard one pass. `listed_at_ns` is when this pass began listing `/proc`;
        `read_until_ns`, when it had read every process and listed their tasks (a task
        missing from its readings had exited by then: `close`), by default the latest
        instant among its listing, its readings and `carried_at_ns`; `slept_ns`, how long the
        machine had been suspended in all by then (CLOCK_BOOTTIME less CLOCK_MONOTONIC: a
        record's life runs on the monotonic clock, `close`).

        `carried`: the blocks the reader carried over (`PassReadings.carried`): last
        pass's very readings, which stand for `carried_at_ns`. Each gives one
        `CarriedDelta` (`Advance.carried`): the processes that did not run — processes 1,
        their observed time, every other field 0 — rather than one `ProcessDelta` each; a
        member that is not such a continuation is guarded like any reading.

        The processes a block shares with last pass's block of its cgroup, where their
        readings are the very ones accepted there (each was checked when it joined, and
        none was given since), are such continuations as a whole: their observed time
        is their number times the span since the block's instant, and a block given
        again as the same object costs O(1). A process joining a block is checked on its
        own; one leaving it keeps the block's last instant as its own.

        All or nothing: the tracker's state is written only once every process of the
        pass is guarded, so a pass that raises midway leaves it as it was: the next
        pass's deltas run from the last pass that completed and nothing of the failed one
        is lost."""
        result = Advance()
        carry = self._carry(carried, carried_at_ns)
        result.carried = carry.carried
        # The processes read are guarded against the cache as it stands and written into
        # it only once every one of them is (`_take`): a pass that fails midway wrote none.
        others = carry.others
        if others or not isinstance(readings, (list, tuple)):  # iterated twice
            readings = [*readings, *others]
        cache, since_of = self._cache, self._since
        closed = self._closed
        # with `keeps_replaced`: the PIDs whose cached reading has a task this one lacks
        lost: set[int] | None = set() if self.keeps_replaced else None
        for reading in readings:
            pid = reading.pid
            old = cache.get(pid)
            instant = since_of.get(pid)
            same_process = old is not None and old.start_ticks == reading.start_ticks
            if closed and closed.get(pid) == reading.start_ticks:
                if lost is not None and old is not None:
                    lost.add(pid)
                continue  # a zombie whose exit record closed its last interval: nothing new
            # (`same_process` holds only where `old` is not None: mypy does not narrow
            # through a condition kept in a variable)
            if same_process and reading.threads is old.threads:  # type: ignore[union-attr]
                # The reader's very readings of last pass (a quiet process): zero deltas
                # (collector/readings.py, the identity contract).
                thread_sums, thread_refusals = _NO_THREAD_DELTA, None
            else:
                old_threads = old.threads if same_process else ()  # type: ignore[union-attr]
                thread_sums, thread_refusals, matched = self._guard_threads(reading, old_threads)
                if lost is not None and old is not None and matched < len(old.threads):
                    lost.add(pid)

            if old is not None and same_process:
                since_ns = old.at_ns if instant is None else instant.ns
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
        if self.keeps_replaced:  # what this pass took a delta of (`close`: `processes`)
            self._contributed = {delta.reading.pid for delta in result.deltas}
            for kept in result.carried:
                self._contributed.update(kept.readings)
        if read_until_ns is None:
            read_until_ns = max(
                [listed_at_ns, carried_at_ns or 0, *(reading.at_ns for reading in readings)]
            )
        self._take(readings, carry, listed_at_ns, (read_until_ns, slept_ns), lost)
        return result

    def close(
        self,
        records: Iterable[ExitRecord],
        sink: Callable[[ExitDelta], object] | None = None,
        slept_ns: int | None = None,
    ) -> Closed:
        """Close tasks' last intervals with their exit records (docs/reference.md §2), once
        a pass is taken (`advance`), with the records received since the last was: a record
        closes the interval of the task the cache holds (read alive by the pass, or a zombie)
        or a pass dropped or replaced (gone before it was read: what the last passes left
        is kept while a record may come for it, `_keep_left`), the same guard as a
        reading's: only where its start is that task's (`started_as`), and not where a
        counter fell; a task not held that started after the end of the latest pass whose
        readings went (`_forgotten_ns`) was read by no pass, and counts whole; any other
        record closes nothing (`unmatched`). A record's life runs on the monotonic clock,
        which stops while the machine is suspended: `slept_ns`, the machine's time suspended
        now (as `advance` takes it), less that at the end of that pass, is how much later
        than its own a start derived from it may be; a birth must hold even that much
        earlier (None: as at that pass).

        Of a task held, the thread fields count (on-CPU, run delay, switches, storage
        bytes: final less the cached thread's), and its process's interval closes with its
        last task (`processes` 1, observed to the exit); its user and system time and major
        faults do not (the record's are raw, not the adjusted values `/proc` gives, and a
        live process's stat takes its gone threads' in). A task born since the previous
        pass counts whole, its own user and system time and faults too where its process
        was born since as well (its process's are the sum of its tasks'). The cached thread
        takes the record's final counters, and a process closed so is not counted again
        where a pass reads it as a zombie: no task is counted twice, whichever of its
        record and the next pass comes first.

        With `sink`, each delta is given to it as it is made, not kept in the result."""
        result = Closed()
        forgotten = self._forgotten_ns
        asleep = self._asleep(slept_ns)
        cache, hz = self._cache, self.hz
        # where to look for a task: the cache, then what the last passes left, newest first,
        # with when each pass had read every process (the cache's: `_unchanged_since`)
        places = [(cache, self._since, 0)]
        places += [(left.readings, left.since, left.read_until_ns) for left in reversed(self._left)]
        unchanged_since, first_until = self._unchanged_since, self._first_until_ns
        indexes: dict[int, tuple[ProcessReading, dict[int, ThreadReading]]] = {}
        finals: dict[int, dict[int, ThreadReading]] = {}  # by process: `_finalise`

        def thread_of(reading: ProcessReading, tid: int) -> ThreadReading | None:
            if len(reading.threads) <= 8:
                return next((t for t in reading.threads if t.tid == tid), None)
            kept = indexes.get(id(reading))  # the reading kept beside: its id stays its own
            if kept is None:
                kept = indexes[id(reading)] = (reading, {t.tid: t for t in reading.threads})
            return kept[1].get(tid)

        for record in records:
            if record.waited_ns > START_TOLERANCE_NS:  # its start too uncertain to match
                result.outcomes["late"] += 1
                continue
            tgid = record.tgid or record.pid
            # The process as this pass read it, and as the last ones did where a pass
            # replaced or dropped that reading (a thread gone since is only there).
            process, held, thread, finalise, since = None, False, None, False, None
            read_at = oldest_until = 0
            for readings, instants, until in places:
                candidate = readings.get(tgid)
                if candidate is None or not started_as(candidate.start_ticks, record, True, hz):
                    continue
                oldest_until = until or unchanged_since.get(tgid, first_until)
                if process is None:
                    process, held, since = candidate, readings is cache, instants.get(tgid)
                found = thread_of(candidate, record.pid)
                if found is not None and started_as(found.start_ticks, record, False, hz):
                    thread, finalise, read_at = found, readings is cache, candidate.at_ns
                    break
            if process is not None and record.last:  # its end (`ended`)
                received = record.received_ns
                self._ended[tgid] = (process.start_ticks, received - record.waited_ns, received)
            # No pass read it (what they read and left is kept): it started after the
            # end of the latest pass whose readings went, at its earliest start (its
            # arrival less its life and the longest it waited).
            earliest = record.start_ns - record.waited_ns - asleep
            born = forgotten is not None and earliest > forgotten
            # Or of a process held, in no reading of it kept though alive after the oldest
            # was taken (the cache's: the first of its readings since each held every task
            # of the one before, `_unchanged_since`): begun after that reading listed its
            # tasks, so after the first pass began, and read by none since (a reading that
            # held it is kept until a pass reads the process without it, and then until it
            # goes, moving `_forgotten_ns` past it).
            if not born and process is not None and thread is None:
                born = record.received_ns - record.waited_ns > oldest_until
            if born and asleep and thread is None:  # a suspend since: is it one held?
                born = not any(
                    (held_process := readings.get(tgid)) is not None
                    and started_as(held_process.start_ticks, record, True, hz, asleep)
                    for readings, *_ in places
                )
            if thread is not None:
                # read alive, before it exited: at the earliest its record may have come
                read_alive = read_at < record.received_ns - record.waited_ns
                fields = last_interval(thread, record, read_alive)
                if fields is None:
                    result.outcomes["counter_fell"] += 1
                    continue
                if fields is READ:  # a pass read it after its exit: nothing left
                    if held and record.last:  # (`held` was set with `process`: not None)
                        self._closed[tgid] = process.start_ticks  # type: ignore[union-attr]
                    result.outcomes["read"] += 1
                    continue
            elif born:
                # its process's own fields too, where no pass read the process either: it
                # started after that pass ended, and none holds a reading of it
                process_born = (
                    process is None
                    and forgotten is not None
                    and record.group_start_ns - record.waited_ns - asleep > forgotten
                )
                fields = whole(record, self._pending_of(record) if process_born else None)
            else:
                result.outcomes["unmatched"] += 1
                continue
            if process is not None and record.last:  # the process's last interval
                since_ns = process.at_ns if since is None else since.ns
                fields.observed_nanos = max(0, record.received_ns - since_ns)
                # counted once an interval: not where this pass took a delta of it
                fields.processes = 0 if held and tgid in self._contributed else 1
                if held:
                    self._closed[tgid] = process.start_ticks
            if thread is not None and finalise:  # once every record is closed (below)
                finals.setdefault(tgid, {})[id(thread)] = final_counters(thread, record)
            delta = ExitDelta(record, fields, process, record.ppid)
            if sink is None:
                result.deltas.append(delta)
            else:  # each taken as it comes: a storm's records are not held at once
                sink(delta)
            result.outcomes["closed" if thread is not None else "born"] += 1
        for tgid, threads in finals.items():
            self._finalise(tgid, threads)
        return result

    def _asleep(self, slept_ns: int | None) -> int:
        """How much later than its own a start derived from a record may be (`close`): the
        machine's time suspended since the end of the latest pass whose readings went."""
        asleep = 0 if slept_ns is None else slept_ns - self._forgotten_slept_ns
        return 0 if asleep < SUSPEND_SLACK_NS else asleep

    def unread_process(self, slept_ns: int | None = None) -> Callable[[int, int], bool] | None:
        """A quick test for the records `close` is about to take (given the same
        `slept_ns`), made once for them: whether the last task's record of process `tgid`,
        begun at the earliest at `earliest_ns` (the earlier of its own and its process's
        derived starts, less its wait), is of a process no pass read: its PID in no
        reading held, no gone task of it held for it (`Pending`), begun after the end of
        the latest pass whose readings went. `close` counts such a record whole, its
        process's fields with it, into its parent's lineage; a pass may do so itself, the
        same way, without giving it to `close`. A record it is False for may be such one
        too (its PID held by another process): `close` finds out. None where a suspend
        since (or no pass yet) asks `close`'s own care of every record."""
        forgotten = self._forgotten_ns
        if forgotten is None or self._asleep(slept_ns):
            return None
        places: tuple[Container[int], ...] = (
            self._cache,
            *(left.readings for left in self._left),
            self._pending,
        )

        def unread(tgid: int, earliest_ns: int) -> bool:
            return earliest_ns > forgotten and not any(map(contains, places, repeat(tgid)))

        return unread

    def _pending_of(self, record: ExitRecord) -> Pending | None:
        """For a task of a process no pass read, born since: its process's fields where it
        is the last task (those its gone tasks left, `Pending`, with its own); else None,
        its own held for the last one."""
        tgid = record.tgid or record.pid
        pending = self._pending.get(tgid)
        if pending is not None and abs(pending.group_start_ns - record.group_start_ns) > (
            START_TOLERANCE_NS
        ):
            pending = None  # another process's, under a PID since reused
        if record.last:
            self._pending.pop(tgid, None)
            return pending or Pending(record.group_start_ns, self._passes)
        if pending is None:
            pending = self._pending[tgid] = Pending(record.group_start_ns, self._passes)
        pending.utime_us += record.utime_us
        pending.stime_us += record.stime_us
        pending.major_faults += record.major_faults
        return None

    def _finalise(self, tgid: int, finals: dict[int, ThreadReading]) -> None:
        """The cached threads of process `tgid` take their records' final counters
        (`finals`, by the id of the cached thread each replaces): a read after them (a
        zombie) adds nothing more. Once a `close`, whatever its records: a process of
        20,000 threads is copied once, not once a record."""
        process = self._cache[tgid]
        threads = tuple(finals.get(id(t), t) for t in process.threads)
        self._cache[tgid] = process._replace(threads=threads)

    def _take(
        self,
        readings: list[ProcessReading] | tuple,
        carry: _Carry,
        listed_at_ns: int,
        read_until: tuple[int, int],
        lost: set[int] | None,
    ):
        """The pass is taken whole: nothing fails from here on."""
        cache, since_of = self._cache, self._since
        instant: _Instant | None  # a carried one, then (below) a gone process's, if any
        for instant, ns in carry.moves:
            instant.ns = ns
        for pid, instant in carry.instants:
            since_of[pid] = instant
        alive = carry.alive
        before: dict[int, ProcessReading] = {}
        before_since: dict[int, _Instant] = {}
        keep, pending = self.keeps_replaced, self._pending
        unchanged_since, until = self._unchanged_since, read_until[0]
        if not self._passes:
            self._first_until_ns = until
        for reading in readings:
            pid = reading.pid
            alive.add(pid)
            if lost and pid in lost:  # a task of it gone: its last reading, for its record
                before[pid] = cache[pid]
                if pid in since_of:
                    before_since[pid] = since_of[pid]
                unchanged_since[pid] = until
            elif keep and self._passes:
                old = cache.get(pid)
                if old is None or old.start_ticks != reading.start_ticks:
                    unchanged_since[pid] = until
            if pending and keep:  # read: its stat has its gone tasks' times
                pending.pop(pid, None)
            cache[pid] = reading
            if pid in since_of:  # its instant is this reading's own from now on
                del since_of[pid]
        for pid in cache.keys() - alive:  # not seen this pass: gone
            before[pid] = cache.pop(pid)
            if unchanged_since:
                unchanged_since.pop(pid, None)
            instant = since_of.pop(pid, None)
            if instant is not None:
                before_since[pid] = instant
        self._keep_left(before, before_since, *read_until, listed_at_ns)
        self._passes += 1
        if pending:  # a process never read, whose last record never came: forgotten
            for pid in [p for p, held in pending.items() if held.taken_at_pass < self._passes - 2]:
                del pending[pid]
        if self._closed:
            self._closed = {pid: s for pid, s in self._closed.items() if pid in cache}
        if self._ended:
            self._ended = {
                pid: end
                for pid, end in self._ended.items()
                if any(pid in readings for readings in (cache, *(k.readings for k in self._left)))
            }
        self._blocks = carry.blocks
        self._previous_listing_ns, self._read_until_ns = listed_at_ns, until

    def _keep_left(
        self,
        readings: dict[int, ProcessReading],
        since: dict[int, _Instant],
        read_until_ns: int,
        slept_ns: int,
        listed_at_ns: int,
    ) -> None:
        """Keep what this pass left behind for the records to come, and let go of what no
        record can need: every record closed from now on was received after the last
        pass (`_previous_listing_ns`), and one of a task that exited before a pass had
        read every process, that waited START_TOLERANCE_NS less, is `late`. Past
        MAX_KEPT_PASSES, the oldest go. A task that started before the end of a pass whose
        readings went (`_forgotten_ns`) may have been read by it: its record counts it
        whole no more.

        At the start, that bound is when the first pass began listing: a task that started
        before may have run before there was a tracker; one that started after and that
        the first pass read is in a reading kept (the cache, or what a later pass left
        here, until it goes and moves the bound past that pass's end)."""
        left = self._left
        if self._forgotten_ns is None:  # the first pass: a task older may never be read
            self._forgotten_ns, self._forgotten_slept_ns = listed_at_ns, slept_ns
        if readings:
            left.append(_LeftBehind(read_until_ns, readings, since, slept_ns))
        previous = self._previous_listing_ns
        while left and (
            len(left) > MAX_KEPT_PASSES
            or (previous is not None and left[0].read_until_ns + START_TOLERANCE_NS < previous)
        ):
            gone = left.popleft()
            if gone.read_until_ns > self._forgotten_ns:
                self._forgotten_ns, self._forgotten_slept_ns = gone.read_until_ns, gone.slept_ns

    def _carry(self, carried: Iterable[Carried], at_ns: int | None) -> _Carry:
        """What each carried block makes of the pass (`_Carry`), read from the tracker's
        state and written to none of it."""
        carry = _Carry()
        for block in carried:
            if at_ns is None:
                raise ValueError("readings carried as they were need carried_at_ns")
            carry.alive.update(block.readings)
            self._carry_block(block, at_ns, carry)
        return carry

    def _carry_block(self, block: Carried, at_ns: int, carry: _Carry) -> None:
        """One block's `CarriedDelta`, and what it changes once the pass is taken."""
        cache, since_of = self._cache, self._since
        members = block.readings
        last = self._blocks.get(block.cgroup)
        kept: Collection[int] = ()
        if last is not None and last.instant.ns <= at_ns:
            accepted_before, instant = last
            # the identity contract (collector/readings.py), clause 2
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
                        # its instant, not the block's next
                        carry.instants.append((pid, _Instant(instant.ns)))
        if kept:
            observed = len(kept) * (at_ns - instant.ns)
        else:
            instant, observed = _Instant(at_ns), 0
        refused: set[int] = set()
        for pid, reading in members.items() if kept is not members else ():
            if pid in kept:
                continue
            old = cache.get(pid)
            if old is None or reading is not old:
                carry.others.append(reading)
                refused.add(pid)
                continue
            since = since_of.get(pid)
            since_ns = old.at_ns if since is None else since.ns
            if at_ns < since_ns:
                carry.others.append(reading)
                refused.add(pid)
                continue
            observed += at_ns - since_ns
            carry.instants.append((pid, instant))
        carry.moves.append((instant, at_ns))
        if refused:
            members = {pid: r for pid, r in members.items() if pid not in refused}
        carry.carried.append(CarriedDelta(block, members, observed))
        if members:
            carry.blocks[block.cgroup] = _Kept(members, instant)

    def _guard_threads(
        self,
        reading: ProcessReading,
        old_threads: tuple[ThreadReading, ...],
    ) -> tuple[_ThreadSums, Counter[str] | None, int]:
        """Σ of the per-thread deltas of one process, the threads refused (counted only
        when the process itself contributes), and how many of `old_threads` (its threads'
        last readings) it still has: fewer than all, and a task is gone from it.

        Run for every thread every pass: readings are unpacked into locals and summed in
        locals (a NamedTuple attribute or a slot costs a lookup each). A thread's last
        reading is looked for first at the same position (the reader lists threads in TID
        order, so it is there unless a thread came or went), then by TID.
        """
        on_cpu = delay = voluntary = nonvoluntary = read_bytes = write_bytes = 0
        refused: Counter[str] | None = None  # made on the first refusal: most have none
        by_tid: dict[int, ThreadReading] | None = None  # made on the first misplaced thread
        count = len(old_threads)
        matched = 0
        for position, thread in enumerate(reading.threads):
            tid, start, cpu, wait, _, vol, nonvol, read, write = thread
            old = old_threads[position] if position < count else None
            if old is None or old[0] != tid:
                if by_tid is None:
                    by_tid = {seen[0]: seen for seen in old_threads}
                old = by_tid.get(tid)
            if old is thread:
                matched += 1
                continue  # the very reading of last pass (an idle thread): a zero delta
            if old is not None and old[1] == start:
                matched += 1
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
        return (on_cpu, delay, voluntary, nonvoluntary, read_bytes, write_bytes), refused, matched
