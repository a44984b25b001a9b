"""The field order of every NamedTuple, pinned (`Fields`' is the field table's:
tests/unit/test_fieldtable.py).

The hot path builds readings with `model.build` (tuple.__new__) and unpacks them by
position: reordering or inserting a field in collector/ would silently swap two integers
there. This table makes it a failing test instead; change it together with every
positional build and unpacking of that type (grep `build(<Type>` and the unpackings).
"""

from __future__ import annotations

import importlib
import pkgutil

import collector

PINNED = {
    "collector.cgroupfs.Location": ("hierarchy", "path", "inode", "subtree"),
    "collector.cgroupfs._Dir": ("root", "location", "directory", "inode", "ident", "parent"),
    "collector.cgroupfs._Plan": (
        "locations", "listed", "stagger", "v2", "cpuacct", "cpu", "identities",
    ),
    "collector.cgroupfs._Held": ("inode", "fd"),
    "collector.podcgroups._Listed": ("listing", "pods", "below"),
    "collector.podcgroups._Walk": ("seen", "pods"),
    "collector.podcgroups._PodDir": ("listing", "containers"),
    "collector.podcgroups._Containers": ("pods", "pod_dirs", "containers"),
    "collector.podcgroups._Made": ("found", "locations"),
    "collector.groups.Group": ("kind", "labels"),
    "collector.waits.NodeCPU": ("cpus", "busy_ns"),
    "collector.waits.NodeInterval": ("cpus", "interval_ns", "busy_ns"),
    "collector.model.CpuSet": ("cpus", "count"),
    "collector.model.Bandwidth": (
        "path", "inode", "periods", "throttled_periods", "throttled_ns", "quota_ns", "period_ns",
    ),
    "collector.model.CgroupLine": ("hierarchy", "controllers", "path"),
    "collector.model.CgroupReading": ("identity", "usage_ns", "pressure", "bandwidth"),
    "collector.model.IOBytes": ("read_bytes", "write_bytes"),
    "collector.model.Pressure": ("some_us", "full_us"),
    "collector.model.ProcessReading": (
        "pid", "comm", "start_ticks", "at_ns", "utime_ticks", "stime_ticks", "major_faults",
        "rss_bytes", "cgroup", "threads",
    ),
    "collector.model.SchedStat": ("on_cpu_ns", "run_delay_ns", "timeslices"),
    "collector.model.Stat": (
        "pid", "comm", "state", "num_threads", "start_ticks", "utime_ticks", "stime_ticks",
        "major_faults", "rss_pages",
    ),
    "collector.model.Switches": ("voluntary", "nonvoluntary"),
    "collector.model.ThreadReading": (
        "tid", "start_ticks", "on_cpu_ns", "run_delay_ns", "timeslices", "voluntary_switches",
        "nonvoluntary_switches", "read_bytes", "write_bytes",
    ),
    "collector.readings.Carried": ("cgroup", "readings", "threads", "rss_bytes"),
    "collector.readings.Footprint": ("pid", "cgroup", "threads", "rss_bytes"),
    "collector.processes.Row": ("pid", "comm", "group", "threads", "fields"),
    "collector.reading._Block": ("carried", "inos", "due"),
    "collector.reading._Probe": ("listing", "schedstats", "quiet"),
    "collector.reading._ProcessSeen": ("ino", "reading", "threads", "ran", "io_totals"),
    "collector.reading._ThreadSeen": ("tid", "ino", "schedstat", "reading"),
    "collector.reading._Threads": ("readings", "seen", "ran", "io_totals"),
    "collector.top.threads.ThreadRow": (
        "pid", "tid", "comm", "on_cpu_nanos", "run_delay_nanos", "voluntary_switches",
        "nonvoluntary_switches",
    ),
    "collector.top.threads._ThreadLast": ("pid", "start_ticks", "counters"),
    "collector.tracker.ProcessDelta": ("reading", "fields", "born"),
    "collector.tracker.CarriedDelta": ("block", "readings", "observed_ns"),
    "collector.closing.ExitDelta": ("record", "fields", "process", "ppid"),
    "collector.tracker._Kept": ("readings", "instant"),
    "collector.tracker._LeftBehind": ("read_until_ns", "readings", "since", "slept_ns"),
    "collector.exits.ProcessEnd": ("tgid", "ppid", "start_ns", "received_ns", "waited_ns"),
    "collector.lineage.Life": (
        "began_from_ns", "began_by_ns", "gone_from_ns", "gone_by_ns", "cgroup", "ppid",
    ),
}  # fmt: skip


def named_tuples() -> dict[str, tuple[str, ...]]:
    found = {}
    for module_info in pkgutil.walk_packages(collector.__path__, "collector."):
        if module_info.name == "collector.__main__" or module_info.name.startswith(
            "collector.bench"
        ):
            continue
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, tuple)
                and hasattr(value, "_fields")
                and value.__module__ == module.__name__
            ):
                found[f"{module.__name__}.{name}"] = value._fields
    return found


def test_every_named_tuple_keeps_its_field_order():
    assert named_tuples() == PINNED
