"""The pass loop: passes of an engine every interval, in a thread of their own, each
published as one immutable snapshot swapped in under a lock (`PassLoop`, `Snapshot`).

A pass builds a complete snapshot — the `/metrics` page's families, their lines rendered
(`PageRenderer`: only what changed since the last pass), each format joined and
compressed when a scraper first asks for it — and swaps it in. Whoever reads a snapshot
(the HTTP app of collector/exporter.py, `once --format prometheus`) never waits for a
pass and never advances the cache.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol

from collector import __version__
from collector.aggregate import FootprintSums
from collector.engine import PassResult
from collector.exposition import (
    Page,
    PageRenderer,
    SelfState,
    Shapes,
)
from collector.groups import UNPLACED, Group
from collector.model import CgroupFields, CpuSet, Fields
from collector.output import counted
from collector.privileges import refused_reads
from collector.processes import PassView

log = logging.getLogger(__name__)

HEALTHY_INTERVALS = 3
"""/healthz fails when the last completed pass is older than this many intervals."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One published state: the page (each format joined, and compressed, when a scraper
    first asks for it: `Page`) and what /healthz needs. Never replaced in part: a scrape
    only picks the bytes it was asked for."""

    page: Page
    passes: int
    completed_at: float | None  # monotonic instant of the pass, None before the first
    view: PassView = field(default_factory=PassView)  # what /processes is made from

    @property
    def text(self) -> bytes:
        return self.page.text

    @property
    def openmetrics(self) -> bytes:
        """Without the closing `# EOF`: the live families follow it."""
        return self.page.openmetrics


@dataclass(frozen=True, slots=True)
class _LastGoodPass:
    """The per-group part of the last good pass, kept to re-render after a failed one."""

    intervals: Mapping[Group, Fields] = field(default_factory=dict)
    totals: Mapping[Group, Mapping[str, int]] = field(default_factory=dict)
    footprints: Mapping[Group, FootprintSums] = field(default_factory=dict)
    cgroup_intervals: Mapping[Group, CgroupFields] = field(default_factory=dict)
    view: PassView = field(default_factory=PassView)
    cpusets: Mapping[Group, CpuSet] = field(default_factory=dict)


class PassEngine(Protocol):
    """What `PassLoop` runs passes of: a `collector.engine.Engine`, or an engine that
    makes its groups up (collector/bench/latency.py). (Its `cgroupfs` and `exits` are
    looked for too, where it has them.)"""

    def run_pass(self) -> PassResult: ...


class PassLoop:
    """Runs passes of an `Engine` every `interval` seconds and publishes snapshots."""

    def __init__(
        self,
        engine: PassEngine,
        interval: float,
        monotonic: Callable[[], float] = time.monotonic,
        version: str = __version__,
        shapes: Shapes | None = None,
        sources: Mapping[str, bool] | None = None,
        cpus: Callable[[], int | None] = lambda: None,
        say_denied: bool = True,
    ):
        self.engine = engine
        self.cpus = cpus  # the node's online CPUs, read after each pass (sources.online_cpus)
        self.interval = interval
        self.monotonic = monotonic
        self.shapes = shapes or Shapes()
        collects_cgroups = getattr(engine, "cgroupfs", None) is not None
        self._state = SelfState(
            version=version,
            dropped_cgroups={} if collects_cgroups and self.shapes.cgroup else None,
            sources=MappingProxyType(dict(sources)) if sources is not None else None,
        )
        self._data = _LastGoodPass()
        self._dropped: Counter[str] = Counter()
        self._dropped_threads: Counter[str] = Counter()
        self._dropped_cgroups: Counter[str] = Counter()
        self._exits: Counter[str] | None = (
            Counter() if getattr(engine, "exits", None) is not None else None
        )
        self._exits_unplaced = (0, 0)
        self._exits_lost: dict[Group, int] = {}
        self._lock = threading.Lock()
        self._renderer = PageRenderer(self.shapes)
        self._snapshot = self._render(completed_at=None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_denied = not say_denied  # the caller says it otherwise

    def set_sources(self, sources: Mapping[str, bool]) -> None:
        """What the node provides (`procdelta_source_available`), found at start-up."""
        self._state = replace(self._state, sources=MappingProxyType(dict(sources)))
        self._publish(self._render(completed_at=self.snapshot().completed_at))

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def healthy(self) -> tuple[bool, str]:
        snapshot = self.snapshot()
        if snapshot.completed_at is None:
            return False, "no pass has completed yet"
        age = self.monotonic() - snapshot.completed_at
        if age > HEALTHY_INTERVALS * self.interval:
            return False, f"last pass completed {age:.1f}s ago (interval {self.interval:g}s)"
        return True, f"ok: {counted(snapshot.passes, 'pass', 'passes')}, last {age:.1f}s ago"

    def run_pass(self) -> PassResult | None:
        """One pass, published. A failed pass is logged and counted, never raised."""
        try:
            result = self.engine.run_pass()
        except Exception as error:  # a pass must never take the collector down
            log.error("pass failed: %s", error, exc_info=log.isEnabledFor(logging.DEBUG))
            self._state = replace(self._state, failed_passes=self._state.failed_passes + 1)
            self._publish(self._render(completed_at=self.snapshot().completed_at))
            return None
        self._dropped.update(result.dropped)
        self._dropped_threads.update(result.dropped_threads)
        self._dropped_cgroups.update(result.dropped_cgroups)
        self._state = replace(
            self._state,
            passes=self._state.passes + 1,
            dropped=MappingProxyType(dict(self._dropped)),
            dropped_threads=MappingProxyType(dict(self._dropped_threads)),
            dropped_cgroups=(
                None
                if self._state.dropped_cgroups is None
                else MappingProxyType(dict(self._dropped_cgroups))
            ),
            tracked_cgroups=result.tracked_cgroups,
            carried_processes=result.carried_by_cgroup,
            durations=self._state.durations.observe(result.duration_seconds),
            interval_seconds=None if result.interval_ns is None else result.interval_ns / 1e9,
            last_pass_timestamp=result.finished_at,
            tracked_processes=result.tracked_processes,
            tracked_threads=result.tracked_threads,
            node_cpus=self.cpus(),
            **self._exit_state(result),
        )
        self._data = _LastGoodPass(
            result.intervals,
            result.totals,
            result.footprints,
            result.cgroup_intervals,
            PassView.of(result),
            result.cpusets,
        )
        self._publish(self._render(completed_at=self.monotonic()))
        if result.denied and not self._warned_denied:
            self._warned_denied = True
            log.info(
                '%s; each pass counts them in procdelta_dropped_deltas_total{reason="unreadable"}',
                refused_reads(result.denied, []),
            )
        return result

    def _lost(self, result: PassResult) -> dict[Group, int]:
        """The records lost by group, accumulated, each group's kept while the totals keep
        it (`UNPLACED`'s always)."""
        lost = self._exits_lost
        for group, count in (result.exits_lost or {}).items():
            lost[group] = lost.get(group, 0) + count
        for group in [g for g in lost if g not in result.totals and g is not UNPLACED]:
            del lost[group]
        return dict(lost)

    def _exit_state(self, result: PassResult) -> dict:
        """The exit records' self-metrics, accumulated (none where not listening)."""
        listener = getattr(self.engine, "exits", None)
        if self._exits is None or listener is None:
            return {}
        self._exits.update(result.exits or {})
        if result.exits_unplaced is not None:
            on_cpu, run_delay = self._exits_unplaced
            self._exits_unplaced = (
                on_cpu + result.exits_unplaced.on_cpu_nanos,
                run_delay + result.exits_unplaced.run_delay_nanos,
            )
        return {
            "exits": MappingProxyType(dict(self._exits)),
            "exit_overflows": listener.overflows,
            "exits_dropped": listener.dropped,
            "exits_refused": MappingProxyType(dict(listener.refused)),
            "exits_lost": MappingProxyType(self._lost(result)),
            "exits_unplaced": self._exits_unplaced,
        }

    def _render(self, completed_at: float | None) -> Snapshot:
        data = self._data
        page = self._renderer.render(
            data.intervals,
            data.totals,
            data.footprints,
            self._state,
            data.cgroup_intervals,
            data.cpusets,
        )
        return Snapshot(page, self._state.passes, completed_at, data.view)

    def _publish(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._snapshot = snapshot

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="passes", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        next_at = self.monotonic()
        while not self._stop.is_set():
            self.run_pass()
            next_at += self.interval
            now = self.monotonic()
            if next_at < now:  # the pass overran (or the process was stopped): skip the slots
                next_at = now + self.interval - (now - next_at) % self.interval
            self._stop.wait(next_at - now)
