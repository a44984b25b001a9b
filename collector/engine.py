"""One pass, end to end: read → guard → group → sum, into an immutable `PassResult`."""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Final

from collector.aggregate import FootprintSums, Grouped, Totals, group_pass
from collector.cgroupfs import CgroupFS
from collector.cgrouppass import Cgroups
from collector.closing import Closed, ExitDelta
from collector.cpusets import Cpusets, cpu_set
from collector.exits import ExitListener, ExitRecord, Fold
from collector.fieldtable import process_record_counters, thread_fields
from collector.gone import GoneByParent
from collector.groups import UNPLACED, Group, Grouper
from collector.lineage import PENDING, Life, ancestor_cgroup, of_reading, of_record
from collector.model import (
    CGROUP_REFUSAL_REASONS,
    REFUSAL_REASONS,
    THREAD_REFUSAL_REASONS,
    CgroupFields,
    CpuSet,
    Fields,
    Malformed,
    ProcError,
)
from collector.parse import parse_stat
from collector.processes import ProcessTable
from collector.reading import Reader
from collector.tracker import ProcessDelta, Tracker
from collector.waits import NodeCPU, node_interval, with_waits

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PassResult:
    """Everything a pass produced. Never mutated once built."""

    number: int
    listed_at_ns: int
    interval_ns: int | None
    duration_seconds: float
    finished_at: float
    intervals: Mapping[Group, Fields]
    footprints: Mapping[Group, FootprintSums]
    totals: Mapping[Group, Mapping[str, int]]
    dropped: Mapping[str, int]
    dropped_threads: Mapping[str, int]  # threads of contributing processes, by reason
    tracked_processes: int
    tracked_threads: int
    denied: int
    # docs/reference.md §7: each group's own cgroup, beside the process sums (empty when not read)
    cgroup_intervals: Mapping[Group, CgroupFields] = field(default_factory=dict)
    dropped_cgroups: Mapping[str, int] = field(default_factory=dict)
    tracked_cgroups: int = 0
    carried_by_cgroup: int = 0  # processes not read: their cgroup had not run
    # every process's delta, kept for the processes view (collector/processes.py)
    processes: ProcessTable = field(default_factory=ProcessTable)
    # the CPUs each group's running processes may use (collector/cpusets.py); empty: not
    # read, or none of its processes ran
    cpusets: Mapping[Group, CpuSet] = field(default_factory=dict)
    # exit records (collector/exits.py): how many came to each end this pass, and what
    # tasks whose group no file told added (None: not listening)
    exits: Mapping[str, int] | None = None
    exits_unplaced: Fields | None = None
    # the records dropped past the listener's bound since the last pass, by group (their
    # tasks' parent's as `/proc` or the cache shows it now); None where not listening
    exits_lost: Mapping[Group, int] | None = None

    def ranked(self) -> list[tuple[Group, Fields, CgroupFields | None]]:
        """Groups with an interval of either kind, the biggest CPU consumers first (by
        on-CPU time, or by their cgroup's CPU where that is larger: a pod of short-lived
        processes ranks by the CPU it really used)."""
        groups = set(self.intervals) | set(self.cgroup_intervals)
        rows = [
            (group, self.intervals.get(group) or Fields(), self.cgroup_intervals.get(group))
            for group in groups
        ]

        def cpu(row: tuple[Group, Fields, CgroupFields | None]) -> int:
            cgroup = row[2].cgroup_cpu_nanos if row[2] is not None else None
            return max(row[1].on_cpu_nanos, cgroup or 0)

        return sorted(rows, key=lambda row: (-cpu(row), -row[1].observed_nanos, row[0].labels))


GC_SWEEP_PASSES = 64
"""With `Engine(freeze_gc=True)`, every this many passes the objects frozen since are
handed back to the cyclic garbage collector and a full collection runs."""


def slept_ns() -> int:
    """How long the machine has been suspended since it booted, up to a constant:
    CLOCK_BOOTTIME runs on through a suspend, CLOCK_MONOTONIC stops (an exit record's life
    is on the latter, `/proc`'s start times on the former)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@contextlib.contextmanager
def _cyclic_gc_paused(freeze: bool = False, sweep: bool = False):
    """The cyclic garbage collector off for the span of a pass.

    A pass makes tens of thousands of short-lived tuples, freed by reference counting;
    the collector would otherwise scan the cache's long-lived objects every few hundred
    allocations. Cycles made meanwhile wait for the next collection after it.

    With `freeze` (a long-running `serve`), what the process holds at the end of a pass
    is frozen (`gc.freeze`: moved out of the collector's generations, at no cost) before
    the collector is turned back on: the pass's new readings are otherwise scanned by the
    first young collections after it, and a full collection of the whole cache runs every
    few passes (what each costs: docs/design.md, "The served process"). The readings
    hold no cycles, and are freed by reference counting, frozen or not. Cyclic garbage
    frozen meanwhile (none that the passes make) is collected at the next `sweep`:
    everything frozen is handed back and a full collection runs, every `GC_SWEEP_PASSES`
    passes.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            if sweep:
                gc.unfreeze()
                gc.collect()
            gc.freeze()
        gc.enable()


class Engine:
    """Owns the reader, the guard and the grouper; `run_pass()` does one complete pass."""

    def __init__(
        self,
        reader: Reader,
        tracker: Tracker,
        grouper: Grouper,
        totals: Totals | None = None,
        wall_clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
        cgroupfs: CgroupFS | None = None,
        carry_quiet: bool = True,
        freeze_gc: bool = False,
        node_cpu: Callable[[], NodeCPU | None] | None = None,
        exits: ExitListener | None = None,
    ):
        self.reader = reader
        self.tracker = tracker
        self.grouper = grouper
        self.totals = totals or Totals()
        self.cgroupfs = cgroupfs  # None: the cgroup fields are not collected
        self.cgroups = Cgroups(cgroupfs, grouper)  # the cgroup side of each pass
        self.cpusets = None if cgroupfs is None else Cpusets(cgroupfs.hierarchies)
        self.carry_quiet = carry_quiet
        self.freeze_gc = freeze_gc  # `_cyclic_gc_paused`: for a long-running process only
        self.wall_clock = wall_clock
        self.timer = timer
        self.passes = 0
        # the node's CPUs, read at each pass's listing (collector/waits.py); None: not read,
        # and no group's run delay is split by cause
        self.node_cpu = node_cpu
        self._node_before: NodeCPU | None = None  # at the last completed pass's listing
        # the kernel's exit records (`--collector.exits`), and the tasks born and gone whose
        # ancestor was not known at the last pass (`_close_exits`)
        self.exits = exits
        tracker.keeps_replaced = exits is not None  # a live process's gone threads' readings
        self.slept: Callable[[], int] = slept_ns  # the machine's time suspended (exit records)
        self._deferred: list[ExitDelta] = []  # born and gone, their ancestor not known yet
        # when the last pass and the one before it had read every process (`_unread`)
        self._read_until: int | None = None
        self._read_before: int | None = None
        # the records the listener had lost (its socket overflowed, or past its bound) as
        # the last two passes took theirs (`_close_exits`: a gone parent's end unknown)
        self._lost_at: tuple[int, int] = (0, 0)

    def run_pass(self) -> PassResult:
        """One pass: the groups' cgroups first (every pod, and the non-pod groups of the
        last pass), so that a cgroup whose usage did not move proves its processes quiet
        (`reading.in_quiet_cgroup`); then the processes; then the cgroups of non-pod
        groups seen for the first time and the cgroup guard (collector/cgrouppass.py);
        the causes of waiting; the sums."""
        began = self.timer()
        sweep = self.freeze_gc and self.passes % GC_SWEEP_PASSES == GC_SWEEP_PASSES - 1
        with _cyclic_gc_paused(self.freeze_gc, sweep):
            self.grouper.refresh()
            cgroup_pass = self.cgroups.begin()
            node_now = self.node_cpu() if self.node_cpu is not None else None
            if self.exits is not None:  # what exits from now on this pass may read
                self.exits.pass_began()
            readings = self.reader.read_pass(cgroup_pass.quiet() if self.carry_quiet else None)
            if self.exits is not None and readings.read_until_ns is not None:
                # every process read: a task begun since is read by no pass before the next
                self.exits.pass_read(readings.read_until_ns)
                self._read_before, self._read_until = self._read_until, readings.read_until_ns
            previous_listing_ns = self.tracker.previous_listing_ns
            interval_ns = (
                None if previous_listing_ns is None else readings.listed_at_ns - previous_listing_ns
            )
            node = node_interval(self._node_before, node_now, interval_ns)
            advance = self.tracker.advance(
                readings.processes,
                readings.listed_at_ns,
                readings.carried,
                readings.carried_at_ns,
                readings.read_until_ns,
                self.slept(),
            )
            grouped = group_pass(
                advance.deltas,
                readings.footprints,
                self.grouper,
                advance.carried,
            )
            closed, unplaced = (None, None)
            if self.exits is not None:
                closed, unplaced = self._close_exits(grouped)
            cgroups = cgroup_pass.finish(grouped)
            cpusets = self._cpusets(advance.deltas, grouped)
            cgroup_intervals = with_waits(
                grouped.intervals,
                cgroups.advance.deltas,
                cgroups.advance.throttled_wall_ns,
                node,
                cpusets,
            )
            seen = grouped.footprints.keys() | cgroups.read
            self.totals.add_pass(grouped.intervals, seen, cgroup_intervals)
            self._node_before = node_now

        dropped: Counter[str] = Counter(advance.refused)
        dropped["unreadable"] += readings.unreadable + len(grouped.malformed_pids)
        dropped["vanished"] += readings.vanished
        dropped["unplaced"] += grouped.unplaced
        if grouped.malformed_pids:
            log.debug("cgroup file malformed for pids %s", sorted(grouped.malformed_pids))

        self.passes += 1
        refused = cgroups.advance.refused
        return PassResult(
            number=self.passes,
            listed_at_ns=readings.listed_at_ns,
            interval_ns=interval_ns,
            duration_seconds=self.timer() - began,
            finished_at=self.wall_clock(),
            intervals=MappingProxyType(grouped.intervals),
            footprints=MappingProxyType(grouped.footprints),
            totals=MappingProxyType(self.totals.snapshot()),
            dropped=MappingProxyType({reason: dropped[reason] for reason in REFUSAL_REASONS}),
            dropped_threads=MappingProxyType(
                {reason: advance.threads_refused[reason] for reason in THREAD_REFUSAL_REASONS}
            ),
            tracked_processes=self.tracker.tracked_processes,
            tracked_threads=self.tracker.tracked_threads,
            denied=readings.denied,
            cgroup_intervals=MappingProxyType(cgroup_intervals),
            dropped_cgroups=MappingProxyType(
                {reason: refused[reason] for reason in CGROUP_REFUSAL_REASONS}
                if self.cgroupfs is not None
                else {}
            ),
            tracked_cgroups=self.cgroups.tracker.tracked,
            carried_by_cgroup=readings.carried_by_cgroup,
            processes=ProcessTable(
                advance.deltas,
                grouped.group_of_pid,
                advance.carried,
                grouped.group_of_cgroup,
            ),
            cpusets=MappingProxyType(cpusets),
            exits=None if closed is None else MappingProxyType(dict(closed.outcomes)),
            exits_unplaced=unplaced,
            exits_lost=None if self.exits is None else MappingProxyType(self._lost_by_group()),
        )

    def _close_exits(self, grouped: Grouped) -> tuple[Closed, Fields]:
        """The exit records received since the last pass (`Tracker.close`), each delta into
        its group's interval as it is made: the group of the process the cache held, or,
        for a task born and gone, its nearest ancestor's whose group is known
        (collector/lineage.py): the ancestors' own records among these, `/proc` as it is
        now, the readings the cache holds. A task whose ancestor is not known yet waits one
        pass (its parent's record may come then). What no file places adds to the node's
        own unplaced sums, returned."""
        assert self.exits is not None
        unplaced = Fields()
        unplaced_count = 0
        records, folds = self.exits.take()
        deferred, self._deferred = self._deferred, []
        # the ends of the processes these records name as parents, theirs included
        wanted = records.parents()
        wanted.update(delta.record.ppid for delta in deferred)
        wanted.update(fold.ppid for fold in folds)
        ends: dict[int, list[Life]] = {}
        for end in records.ends(wanted):
            ends.setdefault(end.tgid, []).append(of_record(end))
        read_now: dict[int, list[Life]] = {}

        # records lost since the pass before the last: a process read, gone since, whose
        # own end is not among the records may have ended long before a pass found it gone
        lost = self.exits.overflows + self.exits.dropped
        lost_lately = lost > self._lost_at[0]
        self._lost_at = (self._lost_at[1], lost)

        def known(pid: int) -> list[Life]:
            # its records and the readings held, together: a process a pass read whose
            # record is here too is known with its cgroup (`parent_in`); one a pass read,
            # until its record came (its end, here or in an earlier pass's records: a child
            # begun after it, under its PID taken again, is not its), else, where a later
            # pass found it gone, until that pass where no record was lost, or not at all
            hz = self.tracker.hz
            own = ends.get(pid, ())
            lives = list(own)
            for reading, gone in self.tracker.held(pid):
                life = of_reading(reading.start_ticks, reading.cgroup, hz, gone)
                end = next(((e.gone_from_ns, e.gone_by_ns) for e in own if _meets(e, life)), None)
                if end is None:
                    end = self.tracker.ended(pid, reading.start_ticks)
                if end is not None:
                    life = life._replace(gone_from_ns=end[0], gone_by_ns=end[1])
                elif gone is not None and lost_lately:
                    continue
                lives.append(life)
            return lives

        def sources(pid: int) -> Iterator[list[Life]]:
            yield known(pid)  # then `/proc` now
            now = read_now.get(pid)
            if now is None:
                now = read_now[pid] = self._life_now(pid)
            yield now

        def add(group: Group | _LeftOut | None, fields: Fields, count: int = 1) -> None:
            nonlocal unplaced_count
            if group is _LEFT_OUT:  # --pods-only: not a pod's
                return
            if group is None:
                unplaced.add(fields)
                unplaced_count += count
                return
            interval = grouped.intervals.get(group)
            if interval is None:
                interval = grouped.intervals[group] = Fields()
            interval.add(fields)

        def place(delta: ExitDelta, last_chance: bool = False) -> None:
            if delta.process is not None:
                add(self._group_of_text(delta.process.cgroup), delta.fields)
                return
            cgroup = ancestor_cgroup(of_record(delta.record), sources)
            if cgroup is PENDING:
                if not last_chance and len(self._deferred) < MAX_DEFERRED:
                    self._deferred.append(delta)
                    return
                cgroup = None
            add(self._group_of_text(cgroup), delta.fields)

        own: list[tuple[Fold, Life, bytes | None]] = []
        for fold in folds:  # before the records: a process's last one takes its own
            # its parent (at its first record's task's exit) alive then: no parent gone before
            seen, waited = fold.seen_ns, fold.waited_ns
            life = Life(fold.start_ns - waited, fold.start_ns, seen - waited, seen, None, fold.ppid)
            cgroup, read = self._own_cgroup(fold.tgid, life)
            if fold.born and not read:  # its process's fields, for its last task's record
                self.tracker.pend(fold.tgid, fold.start_ns, **process_record_counters(fold))
            own.append((fold, life, cgroup))
        taken: Counter[str] = Counter()
        slept = self.slept()
        gone = GoneByParent(self.tracker.unread_process(slept), known, sources)
        closed = self.tracker.close(
            self._unread(gone.others(records), add, taken), sink=place, slept_ns=slept
        )
        for cgroup, fields in gone.sums():
            add(self._group_of_text(cgroup), fields, fields.processes)
            taken["born"] += fields.processes
        closed.outcomes.update(taken)
        for delta in deferred:
            place(delta, last_chance=True)
        for fold, life, cgroup in own:
            if cgroup is None:
                found = ancestor_cgroup(life, sources)
                cgroup = None if found is PENDING else found
            add(self._group_of_text(cgroup), thread_fields(fold))
            closed.outcomes["born"] += fold.tasks
        if unplaced_count:
            closed.outcomes["unplaced"] += unplaced_count
        return closed, unplaced

    def _lost_by_group(self) -> dict[Group, int]:
        """The records the listener dropped since the last pass, by the group of the parent
        their tasks had, as the cache holds it or `/proc` shows it now (a PID taken again
        since names the newer holder's); those of no group a file tells under UNPLACED."""
        assert self.exits is not None
        lost: dict[Group, int] = {}
        for ppid, count in self.exits.take_lost().items():
            held = next(self.tracker.held(ppid), None) if ppid > 1 else None  # init: none
            if held is not None:
                cgroup: bytes | None = held[0].cgroup
            else:
                now = self._life_now(ppid) if ppid > 1 else []
                cgroup = now[0].cgroup if now else None
            group = self._group_of_text(cgroup)
            if group is _LEFT_OUT:
                continue
            key = UNPLACED if group is None else group
            lost[key] = lost.get(key, 0) + count
        return lost

    def _unread(
        self,
        records: Iterable[ExitRecord],
        add: Callable[[Group | _LeftOut | None, Fields], None],
        taken: Counter[str],
    ) -> Iterator[ExitRecord]:
        """The records for `Tracker.close`, less those of threads that no pass read, taken
        here as the listener folds them (collector/exits.py, `Fold`): a thread, not its
        process's last task, begun after the pass before this one had read every process,
        of a process this pass read without it. Its thread fields count whole, in its
        process's group (`born`). Such records waited in the queue only because they
        came while this pass read: at a storm's rate, hundreds a pass."""
        before, hz = self._read_before, self.tracker.hz
        tids: dict[int, frozenset[int]] = {}
        for record in records:
            tgid = record.tgid
            if before is None or record.last or record.pid == tgid or not tgid:
                yield record
                continue
            if record.start_ns - record.waited_ns <= before:
                yield record
                continue
            held = next(self.tracker.held(tgid), None)
            life = Life(
                record.group_start_ns - record.waited_ns, record.group_start_ns,
                None, None, None, record.ppid,
            )  # fmt: skip
            if (
                held is None
                or held[1] is not None  # only a pass before left it
                or not _meets(of_reading(held[0].start_ticks, held[0].cgroup, hz), life)
            ):
                yield record
                continue
            reading = held[0]
            read = tids.get(tgid)
            if read is None:
                read = tids[tgid] = frozenset(t.tid for t in reading.threads)
            if record.pid in read:
                yield record
                continue
            add(self._group_of_text(reading.cgroup), thread_fields(record))
            taken["born"] += 1

    def _own_cgroup(self, tgid: int, life: Life) -> tuple[bytes | None, bool]:
        """The cgroup file of the process `life` is (by its start), where a pass holds it
        (and True: a pass read it) or `/proc` shows it now; None where neither does."""
        hz = self.tracker.hz
        for reading, _ in self.tracker.held(tgid):
            if _meets(of_reading(reading.start_ticks, reading.cgroup, hz), life):
                return reading.cgroup, True
        for now in self._life_now(tgid):
            if _meets(now, life):
                return now.cgroup, False
        return None, False

    def _life_now(self, pid: int) -> list[Life]:
        """The life of the process that holds `pid` now, from `/proc` (none where it is
        gone or unreadable): its cgroup file read first, then its start, so that a PID
        taken again between the two reads gives the newer start, and fits no child the
        older had."""
        procfs = self.reader.procfs
        try:
            cgroup = procfs.process_file(pid, "cgroup")
            start_ticks = parse_stat(procfs.process_file(pid, "stat")).start_ticks
        except (ProcError, Malformed):
            return []
        return [of_reading(start_ticks, cgroup, self.tracker.hz)]

    def _group_of_text(self, cgroup: bytes | None) -> Group | _LeftOut | None:
        """The group a cgroup file names; `_LEFT_OUT` where `--pods-only` drops it; None
        where it names none (no file, malformed, unplaced)."""
        if not cgroup:
            return None
        try:
            group = self.grouper.group_of(cgroup)
        except Malformed:
            return None
        if group is None:
            return _LEFT_OUT
        return None if group is UNPLACED else group

    def _cpusets(self, deltas: list[ProcessDelta], grouped: Grouped) -> dict[Group, CpuSet]:
        """Each group's CPUs, where the cgroup fields are read."""
        if self.cpusets is None:
            return {}
        masks = self.cpusets.of_groups(deltas, grouped.group_of_pid, self.grouper)
        node = self.cpusets.node()
        return {group: cpu_set(mask, node) for group, mask in masks.items()}


def _meets(one: Life, other: Life) -> bool:
    """Whether two lives may have begun at the same instant: one process's, by two sources."""
    return one.began_from_ns <= other.began_by_ns and other.began_from_ns <= one.began_by_ns


MAX_DEFERRED = 100_000
"""Tasks born and gone whose ancestor was not known at a pass, held for the next at most;
past it, unplaced at once."""


class _LeftOut(Enum):
    """`_LEFT_OUT`'s type: a one-member Enum, a sentinel the checker tells from a group."""

    LEFT_OUT = "left out"


_LEFT_OUT: Final = _LeftOut.LEFT_OUT
"""A group `--pods-only` leaves out (`Engine._group_of_text`)."""
