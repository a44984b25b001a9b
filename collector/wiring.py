"""How the layers are put together for a run: the options every command shares, and the
engine they configure. The commands (collector/cli.py) and the benchmark
(collector/bench/) both build their engines here.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from collector import cgroupns, sources
from collector.aggregate import Totals
from collector.cgroupfs import CgroupFS, detect
from collector.engine import Engine
from collector.exits import BUFFER_BYTES, ExitListener, ExitsUnavailable
from collector.exposition import Shapes
from collector.groups import Grouper
from collector.model import WHOLE_READ_PASSES
from collector.podnames import PodNames
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.readings import boottime_ns
from collector.tracker import Tracker

log = logging.getLogger("procdelta")


@dataclass(frozen=True, kw_only=True)
class Options:
    """The options every command shares, by name (the defaults are the flags')."""

    procfs: str = "/proc"
    pod_logs: str = "/var/log/pods"
    container_logs: str = "/var/log/containers"
    per_container: bool = False
    pods_only: bool = False
    cgroupfs: str = "/sys/fs/cgroup"
    cgroup: bool = True  # read each group's own cgroup (docs/reference.md §7)
    pressure: bool = True  # and its PSI files, where the node has them
    interval_gauges: bool = True  # export procdelta_interval_<field>
    totals: bool = True  # export procdelta_<field>_total
    carry_quiet: bool = True  # carry a quiet cgroup's processes over unread (the bench's A/B)
    # K (collector/model.py); None, no whole reads, only to measure what the bound costs
    whole_read_passes: int | None = WHOLE_READ_PASSES
    cpu_pressure_only: bool = False  # of the PSI files, the CPU one alone
    exits: bool = False  # listen for the kernel's exit records (collector/exits.py)
    exits_buffer_bytes: int = BUFFER_BYTES

    @property
    def shapes(self) -> Shapes:
        return Shapes(self.interval_gauges, self.totals, self.cgroup)


def build_engine(
    options: Options,
    clock: Callable[[], int] = boottime_ns,
    hz: int | None = None,
    freeze_gc: bool = False,
) -> Engine:
    """Wire the layers for a run: ProcFS → Reader → Tracker → Grouper → Engine, and
    CgroupFS beside them unless the cgroup fields are off. Where this process runs in a
    cgroup namespace of its own, the Grouper reads paths through where its root sits on
    the host (collector/cgroupns.py), found here, once. `freeze_gc`: for a process that
    runs passes for good (`serve`; see `collector.engine._cyclic_gc_paused`)."""
    every = options.whole_read_passes
    reader = Reader(ProcFS(options.procfs), clock=clock, whole_read_passes=every)
    hz = hz or os.sysconf("SC_CLK_TCK")
    tracker = Tracker(hz)
    names = PodNames(options.pod_logs, options.container_logs)
    cgroupfs = (
        CgroupFS(
            options.cgroupfs,
            pressure=options.pressure,
            whole_read_passes=every,
            cpu_pressure_only=options.cpu_pressure_only,
        )
        if options.cgroup
        else None
    )
    hierarchies = cgroupfs.hierarchies if cgroupfs is not None else detect(options.cgroupfs)
    grouper = Grouper(
        names,
        per_container=options.per_container,
        pods_only=options.pods_only,
        namespace=cgroupns.locate(options.procfs, hierarchies),
    )
    return Engine(
        reader,
        tracker,
        grouper,
        Totals(),
        cgroupfs=cgroupfs,
        carry_quiet=options.carry_quiet,
        freeze_gc=freeze_gc,
        node_cpu=functools.partial(sources.node_cpu, options.procfs, hz),
        exits=listen_for_exits(options),
    )


def listen_for_exits(options: Options) -> ExitListener | None:
    """With `--collector.exits`, the kernel's exit records, listened for from now on; where
    no listener can be registered, one line says what was missing, and the passes run as
    without the flag."""
    if not options.exits:
        return None
    try:
        return ExitListener(options.exits_buffer_bytes).start()
    except ExitsUnavailable as error:
        log.warning(
            "--collector.exits: %s; each task's last interval stays lost, as without the flag",
            error,
        )
        return None


def node_cpus(options: Options) -> Callable[[], int | None]:
    """What reads the node's online CPUs each pass (`procdelta_node_cpus`)."""
    return functools.partial(sources.online_cpus, options.procfs)


def node_sources(options: Options, engine: Engine) -> dict[str, bool]:
    """What the node provides (collector/sources.py), each missing one said once."""
    found = sources.probe_procfs(options.procfs)
    found["cgroup_namespace_root"] = engine.grouper.namespace.complete
    if engine.cgroupfs is not None:
        found |= sources.probe_cgroups(engine.cgroupfs.hierarchies)
        if not options.pressure:
            del found["psi"]
    if options.exits:  # said at start-up already, where missing
        found["exits"] = engine.exits is not None
    sources.log_missing(found, options.procfs, options.cgroupfs if options.cgroup else None)
    return found
