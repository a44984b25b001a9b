"""Mutation testing of the shortcuts and the guards: does some test fail when a check breaks?

Each mutant below is one small edit to one file: a clause of a shortcut's predicate
dropped or negated, a comparison flipped, a predicate forced True or False, a guard's
check removed, the bound (every process and cgroup read whole once every K passes)
taken away. For each, the tests that cover those modules (`TEST_FILES`) are run against
a scratch copy of the repository with the mutant applied. A mutant that makes a test
fail is *killed*; one that passes every test *survives*, and is a finding: a missing
test, or a check that nothing needs (then say why, or remove it).

Run from the repository's root, with its venv:

    python -m tests.tools.mutation                  # every mutant, 2 workers
    python -m tests.tools.mutation --list           # the catalogue, with why each matters
    python -m tests.tools.mutation --only 'tracker/*' cgrouppass/holds-forced-true --jobs 1

The repository (its tracked and untracked, non-ignored files) is copied afresh under
/tmp once per worker at the start of a run, so files edited meanwhile do not matter.
Each mutant's edit is applied to the worker's copy, the tests run there (`-x -q -p
no:cacheprovider`, a fixed Hypothesis seed and no shrinking, a timeout), and the file
restored. The unmutated copies are run first: if they fail, no mutant's result would
mean anything, and the run stops (exit status 3).

A failing test is run again alone, up to 3 times; if it then passes, the failure was
the test's (a kernel test's timing, more so beside the other worker's load), not the
mutant's: the run is repeated without that test, and the test is reported as flaky. A
mutant killed only by a test on the real kernel (marked `kernel`), or by one flaky
elsewhere in the run, is listed for a second look (`--only NAME --jobs 1`, on a quiet
machine): a heavy load can fail such a test four times running.

A run of the whole catalogue takes about 10 minutes with 2 workers on a quiet 2-core
machine, up to 17 when others load it (each surviving mutant costs a full run of the
tests, 40 s to a minute; a killed one usually seconds). It is not part of CI: it is slow, and it
reports findings rather than pass or fail. Some tests need root and real cgroups
(tests/kernel/test_cgroup_kernel.py and the `*_live.py` files beside it), as in CI.

Every original snippet must occur exactly once in its file; one that does not (the code
changed under the catalogue) stops the run with exit status 2, so the catalogue cannot
rot silently. Otherwise the exit status is 0, survivors or not.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TEST_FILES = (
    # the pure guards and the readers' unit tests first: most mutants die in seconds
    "tests/unit/test_field_guards.py",
    "tests/unit/test_fieldtable.py",
    "tests/unit/test_tracker.py",
    "tests/unit/test_tracker_close.py",
    "tests/unit/test_identity_contract.py",
    "tests/unit/test_groups.py",
    "tests/unit/test_cgroupns.py",
    "tests/unit/test_cgroupguard.py",
    "tests/unit/test_reading.py",
    "tests/unit/test_aggregate.py",
    "tests/unit/test_engine.py",
    "tests/unit/test_cgroupfs.py",
    "tests/unit/test_quiet_cgroups.py",
    "tests/unit/test_bound.py",
    "tests/unit/test_guards.py",
    "tests/integration/test_exposition.py",
    "tests/unit/test_golden.py",
    "tests/unit/test_cgroup_golden.py",
    "tests/unit/test_incremental.py",
    "tests/unit/test_exits.py",
    "tests/unit/test_datagrams.py",
    "tests/unit/test_gone.py",
    "tests/unit/test_engine_exits.py",
    "tests/integration/test_oracle.py",
    "tests/unit/test_fuzz.py",
    "tests/kernel/test_cgroup_kernel.py",
    "tests/kernel/test_incremental_live.py",
    "tests/kernel/test_bound_live.py",
    "tests/kernel/test_cgroupns_live.py",
    "tests/unit/test_waits.py",
    "tests/integration/test_processes.py",
    "tests/unit/test_top_screen.py",
    "tests/unit/test_top_threads.py",
    "tests/integration/test_top_terminal.py",
    "tests/integration/test_top_remote.py",
    "tests/kernel/test_top_kernel.py",
    # serving: the listener's bounds, auth, TLS, health (loopback servers)
    "tests/integration/test_listener_requests.py",
    "tests/integration/test_listener_deadlines.py",
    "tests/integration/test_listener_bounds.py",
    "tests/integration/test_listener_logs.py",
    "tests/integration/test_listener_lifecycle.py",
    "tests/integration/test_webconfig_files.py",
    "tests/integration/test_webconfig_auth.py",
    "tests/integration/test_webconfig_tls.py",
    "tests/integration/test_serve.py",
)
"""The tests that cover the mutated modules, fastest first (`-x` stops at the first
failure), the loopback servers' last. Left out as too slow for a run per mutant:
test_load, test_reliability, test_container, test_end_to_end. A file missing from the copy
is skipped, and said."""

READING = "collector/reading.py"
CGROUPFS = "collector/cgroupfs.py"
PODCGROUPS = "collector/podcgroups.py"
ENGINE = "collector/engine.py"
CGROUPPASS = "collector/cgrouppass.py"
TRACKER = "collector/tracker.py"
EXITS = "collector/exits.py"
GONE = "collector/gone.py"
CLOSING = "collector/closing.py"
CGROUPGUARD = "collector/cgroupguard.py"
AGGREGATE = "collector/aggregate.py"
GROUPS = "collector/groups.py"
CGROUPNS = "collector/cgroupns.py"
LISTENER = "collector/listener.py"
ADMISSION = "collector/admission.py"
HTTP11 = "collector/http11.py"
EXPORTER = "collector/exporter.py"
PASSLOOP = "collector/passloop.py"
WEBCONFIG = "collector/webconfig.py"
WAITS = "collector/waits.py"
PROCESSES = "collector/processes.py"
TOP_CORE = "collector/top/core.py"
TOP_REMOTE = "collector/top/remote.py"
TOP_THREADS = "collector/top/threads.py"
TOP_TERMINAL = "collector/top/terminal.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository's root
    original: str  # must occur exactly once in the file
    replacement: str
    why: str  # what a test that kills it proves


def _mutants() -> Iterator[Mutant]:
    m = Mutant
    # -- collector/reading.py: the process reader's shortcuts ------------------------------
    yield m(
        "reading/same_thread-inode-dropped", READING,
        "return old is not None and old.ino == ino",
        "return old is not None",
        "a TID reused by a new thread (new inode) would inherit the old thread's start and reading",
    )  # fmt: skip
    yield m(
        "reading/same_thread-forced-false", READING,
        "return old is not None and old.ino == ino",
        "return False",
        "every thread's stat re-read, nothing carried: the shortcut is untested if this survives",
    )  # fmt: skip
    yield m(
        "reading/did_not_run-timeslices-dropped", READING,
        "return old.schedstat == schedstat and old.reading.timeslices > 0",
        "return old.schedstat == schedstat",
        "a kernel without sched_info prints `0 0 0` for a thread however much it ran",
    )  # fmt: skip
    yield m(
        "reading/did_not_run-schedstat-dropped", READING,
        "return old.schedstat == schedstat and old.reading.timeslices > 0",
        "return old.reading.timeslices > 0",
        "a thread whose schedstat moved would keep last pass's reading",
    )  # fmt: skip
    yield m(
        "reading/did_not_run-forced-false", READING,
        "return old.schedstat == schedstat and old.reading.timeslices > 0",
        "return False",
        "no idle thread or quiet process skipped: the shortcut is untested if this survives",
    )  # fmt: skip
    yield m(
        "reading/only_waited-on_cpu-dropped", READING,
        "return before.on_cpu_ns == on_cpu_ns and before.timeslices == timeslices > 0",
        "return before.timeslices == timeslices > 0",
        "a thread charged more CPU time (run count still) would keep its old switches and io",
    )  # fmt: skip
    yield m(
        "reading/only_waited-timeslices-dropped", READING,
        "return before.on_cpu_ns == on_cpu_ns and before.timeslices == timeslices > 0",
        "return before.on_cpu_ns == on_cpu_ns",
        "a thread picked and not yet charged (run count moved, CPU time not) keeps old switches",
    )  # fmt: skip
    yield m(
        "reading/only_waited-zero-run-count", READING,
        "return before.on_cpu_ns == on_cpu_ns and before.timeslices == timeslices > 0",
        "return before.on_cpu_ns == on_cpu_ns and before.timeslices == timeslices",
        "`0 0 <delay>` with no sched_info would prove a thread idle that ran",
    )  # fmt: skip
    yield m(
        "reading/only_waited-forced-false", READING,
        "return before.on_cpu_ns == on_cpu_ns and before.timeslices == timeslices > 0",
        "return False",
        "status and io read for every waiting thread: the shortcut is untested if this survives",
    )  # fmt: skip
    yield m(
        "reading/io_unmoved-none-dropped", READING,
        "return io_totals is not None and io_totals == previous.io_totals",
        "return io_totals == previous.io_totals",
        "two unread totals (None == None) would prove no thread did I/O",
    )  # fmt: skip
    yield m(
        "reading/io_unmoved-forced-false", READING,
        "return io_totals is not None and io_totals == previous.io_totals",
        "return False",
        "every running thread's io read: the shortcut is untested if this survives",
    )  # fmt: skip
    yield m(
        "reading/known_since-inode-dropped", READING,
        "return previous is not None and previous.ino == ino and confirmed",
        "return previous is not None and confirmed",
        "a new process under a reused PID (new <pid> inode) would be carried or probed as the old",
    )  # fmt: skip
    yield m(
        "reading/known_since-confirmed-dropped", READING,
        "return previous is not None and previous.ino == ino and confirmed",
        "return previous is not None and previous.ino == ino",
        "a process whose cgroup was read once (maybe before it was moved) would be carried",
    )  # fmt: skip
    yield m(
        "reading/known_since-forced-false", READING,
        "return previous is not None and previous.ino == ino and confirmed",
        "return False",
        "no process probed or carried: the whole-process shortcuts are untested if this survives",
    )  # fmt: skip
    yield m(
        "reading/in_quiet_cgroup-forced-true", READING,
        "return quiet(previous.reading.cgroup)",
        "return True",
        "every known process carried unread whenever any cgroup is quiet",
    )  # fmt: skip
    yield m(
        "reading/in_quiet_cgroup-forced-false", READING,
        "return quiet(previous.reading.cgroup)",
        "return False",
        "nothing carried by cgroup: the quiet-cgroup shortcut is untested if this survives",
    )  # fmt: skip
    yield m(
        "reading/bound-removed", READING,
        "    build,\n    whole_read_due,\n)",
        "    build,\n)\n\n\ndef whole_read_due(*_) -> bool:\n    return False\n",
        "no process is ever read whole: what a shortcut misses is never counted",
    )  # fmt: skip
    yield m(
        "reading/bound-removed-from-carry", READING,
        "whole_read_due(pid, passes, every)\n                or not known_since",
        "not known_since",
        "a process of a quiet cgroup is carried forever, even when due to be read whole",
    )  # fmt: skip
    yield m(
        "reading/bound-removed-from-block", READING,
        "due = block.due.get(due_now) if due_now is not None else None",
        "due = None",
        "a quiet cgroup's block is carried whole forever: none of it ever read whole",
    )  # fmt: skip
    yield m(
        "reading/block_stands-inode-dropped", READING,
        "return block.inos.items() <= listed and quiet(block.carried.cgroup)",
        "return quiet(block.carried.cgroup)",
        "a block carried on though a process of it exited or its PID now names a new one",
    )  # fmt: skip
    yield m(
        "reading/block_stands-quiet-dropped", READING,
        "return block.inos.items() <= listed and quiet(block.carried.cgroup)",
        "return block.inos.items() <= listed",
        "a block carried on unread after its cgroup ran",
    )  # fmt: skip
    yield m(
        "reading/bound-removed-from-read", READING,
        "whole = whole_read_due(pid, self._passes, self.whole_read_passes)",
        "whole = False",
        "a process read, not carried, still takes every shortcut when due to be read whole",
    )  # fmt: skip
    yield m(
        "reading/probe-ran-dropped", READING,
        "if known_since(previous, ino, confirmed) and not whole and not previous.ran:",
        "if known_since(previous, ino, confirmed) and not whole:",
        "a process that ran during its last read is probed: the threads' schedstat proves nothing",
    )  # fmt: skip
    yield m(
        "reading/probe-whole-dropped", READING,
        "if known_since(previous, ino, confirmed) and not whole and not previous.ran:",
        "if known_since(previous, ino, confirmed) and not previous.ran:",
        "a quiet process due to be read whole is carried by its probe instead",
    )  # fmt: skip
    yield m(
        "reading/probe-thread-count-dropped", READING,
        "if len(listing) != len(known) or not all(",
        "if not all(",
        "a probe ignores threads born or gone since last pass (zip(strict) then raises)",
    )  # fmt: skip
    yield m(
        "reading/probe-tid-dropped", READING,
        "old.tid == tid and same_thread(old, ino)",
        "same_thread(old, ino)",
        "a probe matches threads by inode only, not by TID",
    )  # fmt: skip
    yield m(
        "reading/pid-reuse-check-dropped", READING,
        "if previous is not None and previous.reading.start_ticks != stat.start_ticks:",
        "if False:",
        "a new process under a reused PID keeps the old one's cgroup and threads",
    )  # fmt: skip
    yield m(
        "reading/cgroup-carry-whole-dropped", READING,
        "if previous is not None and confirmed and not whole:",
        "if previous is not None and confirmed:",
        "a confirmed process's cgroup file is never read again: a move is never seen",
    )  # fmt: skip
    yield m(
        "reading/cgroup-carry-confirmed-dropped", READING,
        "if previous is not None and confirmed and not whole:",
        "if previous is not None and not whole:",
        "a process's cgroup read only at its first sighting (before its runtime moved it)",
    )  # fmt: skip
    yield m(
        "reading/cgroup-confirmed-without-equality", READING,
        "cgroup_confirmed = previous is not None and previous.reading.cgroup == cgroup",
        "cgroup_confirmed = previous is not None",
        "a cgroup that changed between two sightings counts as settled",
    )  # fmt: skip
    yield m(
        "reading/threads-whole-dropped", READING,
        "threads = self._read_threads(pid, stat, None if whole else previous, probe)",
        "threads = self._read_threads(pid, stat, previous, probe)",
        "a whole read still carries idle threads' readings: thread shortcuts are never bounded",
    )  # fmt: skip
    yield m(
        "reading/block-threads-as-processes", READING,
        "sum(len(r.threads) for r in readings.values()),",
        "len(readings),",
        "a carried block's footprint counts a process's threads as one",
    )  # fmt: skip
    yield m(
        "reading/block_stands-forced-false", READING,
        "return block.inos.items() <= listed and quiet(block.carried.cgroup)",
        "return False",
        "an idle pod's block looked at process by process every pass: untested if this survives",
    )  # fmt: skip
    yield m(
        "reading/confirmed-kept-on-read", READING,
        "confirmed.discard(pid)",
        "pass",
        "a PID naming a new process keeps the old one's settled cgroup: its move unseen",
    )  # fmt: skip
    yield m(
        "reading/gone-previous-kept", READING,
        "del previous_pass[pid]",
        "pass",
        "what the reader keeps of a gone process is never dropped: memory beyond the table",
    )  # fmt: skip
    yield m(
        "reading/gone-confirmed-kept", READING,
        "confirmed.difference_update(gone)",
        "pass",
        "a gone PID stays in the settled set: memory beyond the table",
    )  # fmt: skip
    # -- collector/cgroupfs.py: the cgroup reader's shortcuts ------------------------------
    yield m(
        "cgroupfs/bound-removed", CGROUPFS,
        "if whole_read_due(stagger, self._passes",
        "if False and whole_read_due(stagger, self._passes",
        "no cgroup is ever read whole: a late period or a tiny stall is never counted",
    )  # fmt: skip
    yield m(
        "cgroupfs/bandwidth-usage-none-dropped", CGROUPFS,
        "        usage_ns is not None\n        and usage_ns == previous.usage_ns",
        "        usage_ns == previous.usage_ns",
        "a group with no usage source (None == None) has its bandwidth carried forever",
    )  # fmt: skip
    yield m(
        "cgroupfs/bandwidth-usage-dropped", CGROUPFS,
        "\n        and usage_ns == previous.usage_ns",
        "",
        "a throttled, busy group's bandwidth counters carried unread",
    )  # fmt: skip
    yield m(
        "cgroupfs/bandwidth-identity-dropped", CGROUPFS,
        "\n        and identity == previous.identity",
        "",
        "a cgroup made anew with the same usage keeps the old one's bandwidth",
    )  # fmt: skip
    yield m(
        "cgroupfs/bandwidth-previous-none-dropped", CGROUPFS,
        "\n        and previous.bandwidth is not None",
        "",
        "a group whose bandwidth was unread last pass stays without it while idle",
    )  # fmt: skip
    yield m(
        "cgroupfs/bandwidth-forced-false", CGROUPFS,
        "    return (\n        usage_ns is not None\n",
        "    return False and (\n        usage_ns is not None\n",
        "bandwidth read every pass: the shortcut is untested if this survives",
    )  # fmt: skip
    yield m(
        "cgroupfs/pressure_unmoved-none-dropped", CGROUPFS,
        "return before is not None and before == now",
        "return before == now",
        "a parent without PSI files (None == None) proves its children did not stall",
    )  # fmt: skip
    yield m(
        "cgroupfs/pressure_unmoved-flipped", CGROUPFS,
        "return before is not None and before == now",
        "return before is not None and before != now",
        "children's PSI carried exactly when their parent's moved",
    )  # fmt: skip
    yield m(
        "cgroupfs/pressure_unmoved-forced-false", CGROUPFS,
        "return before is not None and before == now",
        "return False",
        "every PSI file read every pass: the shortcut is untested if this survives",
    )  # fmt: skip
    yield m(
        "cgroupfs/pressure-identity-dropped", CGROUPFS,
        "if previous is not None and v2.ident in previous.identity  # the same cgroup",
        "if previous is not None  # the same cgroup",
        "a v2 cgroup made anew keeps the old one's PSI totals",
    )  # fmt: skip
    yield m(
        "cgroupfs/stalled-without-parent-reading", CGROUPFS,
        "(True, True, True)\n                if before is None",
        "(False, False, False)\n                if before is None",
        "a parent first read this pass proves its children did not stall",
    )  # fmt: skip
    yield m(
        "cgroupfs/plan-kept-for-other-locations", CGROUPFS,
        "if plan is None or plan.locations != locations:",
        "if plan is None:",
        "a cgroup made anew (a new inode) is read as the old one: the guard subtracts across two",
    )  # fmt: skip
    # -- collector/podcgroups.py: the listing's shortcut ----------------------------------
    yield m(
        "podcgroups/pod-listing-kept-when-changed", PODCGROUPS,
        "if seen is None or seen.listing != listing:\n                changed = True\n"
        "                here: Found = []\n                below",
        "if seen is None:\n                changed = True\n"
        "                here: Found = []\n                below",
        "a pod made or removed under a directory listed before is never seen, or never let go",
    )  # fmt: skip
    yield m(
        "podcgroups/container-listing-kept-when-changed", PODCGROUPS,
        "if seen is None or seen.listing != listing:\n                changed = True\n"
        "                here: Found = []\n                for child, child_inode",
        "if seen is None:\n                changed = True\n"
        "                here: Found = []\n                for child, child_inode",
        "with --per-container, a container started in a pod listed before is never seen",
    )  # fmt: skip
    # -- collector/cgrouppass.py: which cgroups are quiet ----------------------------------
    yield m(
        "cgrouppass/quiet-read-early-dropped", CGROUPPASS,
        "                group in read_early\n                and ",
        "                ",
        "a group read after its processes last pass proves them quiet",
    )  # fmt: skip
    yield m(
        "cgrouppass/quiet-usage-none-dropped", CGROUPPASS,
        "\n                and now.usage_ns is not None",
        "",
        "a group without usage (None == None) is quiet forever",
    )  # fmt: skip
    yield m(
        "cgrouppass/quiet-usage-dropped", CGROUPPASS,
        "\n                and last.usage_ns == now.usage_ns",
        "",
        "a group whose usage moved is taken as quiet",
    )  # fmt: skip
    yield m(
        "cgrouppass/quiet-identity-dropped", CGROUPPASS,
        "\n                and last.identity == now.identity",
        "",
        "a cgroup made anew whose usage equals the old one's is taken as quiet",
    )  # fmt: skip
    yield m(
        "cgrouppass/holds-forced-true", CGROUPPASS,
        "    if path is None:\n        return False\n    return path == ",
        "    return True\n    return path == ",
        "a process of a quiet group's name, in another cgroup of the hierarchy, is carried",
    )  # fmt: skip
    yield m(
        "cgrouppass/holds-unplaced-true", CGROUPPASS,
        "    if path is None:\n        return False\n    return path == ",
        "    if path is None:\n        return True\n    return path == ",
        "a process whose path cannot be placed in the usage's hierarchy is carried",
    )  # fmt: skip
    yield m(
        "cgrouppass/holds-prefix-without-slash", CGROUPPASS,
        'path.startswith(directory + b"/")',
        "path.startswith(directory)",
        "a sibling cgroup whose name extends the quiet one's (`pod-a` and `pod-ab`) is held by it",
    )  # fmt: skip
    # -- collector/tracker.py: the process guard -------------------------------------------
    yield m(
        "tracker/pid-reuse-check-dropped", TRACKER,
        "same_process = old is not None and old.start_ticks == reading.start_ticks",
        "same_process = old is not None",
        "a new process under a reused PID is subtracted from the old one's counters",
    )  # fmt: skip
    yield m(
        "tracker/fell-instant-dropped", TRACKER,
        "new.at_ns < since_ns\n        or ",
        "",
        "a reading older than the cached one's instant gives a negative observed time",
    )  # fmt: skip
    yield m(
        "tracker/fell-utime-dropped", TRACKER,
        "\n        or new.utime_ticks < old.utime_ticks",
        "",
        "a utime that fell gives a negative user time",
    )  # fmt: skip
    yield m(
        "tracker/fell-stime-dropped", TRACKER,
        "\n        or new.stime_ticks < old.stime_ticks",
        "",
        "a stime that fell gives a negative system time",
    )  # fmt: skip
    yield m(
        "tracker/fell-faults-dropped", TRACKER,
        "\n        or new.major_faults < old.major_faults",
        "",
        "major faults that fell give a negative count",
    )  # fmt: skip
    yield m(
        "tracker/thread-reuse-check-dropped", TRACKER,
        "if old is not None and old[1] == start:",
        "if old is not None:",
        "a new thread under a reused TID is subtracted from the old one's counters",
    )  # fmt: skip
    for field, clause in (
        ("on_cpu", "cpu < old_cpu"),
        ("delay", "wait < old_wait"),
        ("voluntary", "vol < old_vol"),
        ("nonvoluntary", "nonvol < old_nonvol"),
        ("read", "read < old_read"),
        ("write", "write < old_write"),
    ):
        first = field == "on_cpu"
        yield m(
            f"tracker/thread-fell-{field}-dropped", TRACKER,
            f"{clause}\n                    or " if first else f"\n                    or {clause}",
            "",
            f"a thread whose {field} counter fell gives a negative delta",
        )  # fmt: skip
    yield m(
        "tracker/pending-faults-dropped", TRACKER,
        "pending.major_faults += record.major_faults",
        "pass",
        "a process born and gone loses the major faults of its tasks gone before its last",
    )  # fmt: skip
    yield m(
        "closing/whole-pending-faults-dropped", CLOSING,
        "fields.major_faults = record.major_faults + process_fields.major_faults",
        "fields.major_faults = record.major_faults",
        "a process born and gone counts its last task's major faults alone",
    )  # fmt: skip
    # -- collector/exits.py: the tasks folded as their records come ------------------------
    yield m(
        "exits/fold-faults-dropped", EXITS,
        "fold.major_faults += majflt",
        "pass",
        "a thread no pass read, folded as it came, loses its major faults",
    )  # fmt: skip
    yield m(
        "exits/queued-times-swapped", EXITS,
        "write_bytes, utime_us, stime_us, majflt, waited,",
        "write_bytes, stime_us, utime_us, majflt, waited,",
        "a last task's record, queued for the pass, takes its user time for its system time",
    )  # fmt: skip
    yield m(
        "exits/fold-switches-swapped", EXITS,
        "fold.nonvoluntary_switches += nonvoluntary",
        "fold.nonvoluntary_switches += voluntary",
        "two fields of a fold's sums are taken from each other's members",
    )  # fmt: skip
    yield m(
        "exits/pass-read-ends-no-gather", EXITS,
        "        self._nudged.set()  # what the socket holds is taken now",
        "        pass  # what the socket holds is taken now",
        "a pass that read every process waits out the listener's gather: the threads begun "
        "after it are queued as ones it may have read",
    )  # fmt: skip
    yield m(
        "exits/close-waits-out-a-gather", EXITS,
        "        self._closed.set()\n        self._nudged.set()",
        "        self._closed.set()",
        "a listener closed mid-gather goes on until the gather ends",
    )  # fmt: skip
    yield m(
        "exits/gather-after-a-pass-not-short", EXITS,
        "                if self._gather(gather):  # a pass has read every process\n"
        "                    gather = first",
        "                self._gather(gather)",
        "after a pass has read every process, the next batch waits as long as the last",
    )  # fmt: skip
    yield m(
        "exits/gather-not-ramped", EXITS,
        "    return min(high, _RAMP * last, max(low, _BATCH * elapsed / came))",
        "    return min(high, max(low, _BATCH * elapsed / came))",
        "a storm that begins after a quiet spell waits out the longest gather in the socket",
    )  # fmt: skip
    yield m(
        "exits/cut-slots-never-grow", EXITS,
        "                    reader = self._reader = self._wider(reader)",
        "                    pass",
        "where a kernel's messages outgrow the slots, every such record is refused for good",
    )  # fmt: skip
    # -- collector/gone.py: processes born and gone, counted by parent --------------------
    yield m(
        "gone/parent-begun-after-the-child", GONE,
        "fits_as_parent(parent, group_start, received - waited)",
        "fits_as_parent(parent, received, received - waited)",
        "a holder of the parent's PID begun after the child (a PID taken again) is its parent",
    )  # fmt: skip
    yield m(
        "gone/parent-gone-before-the-child", GONE,
        "fits_as_parent(parent, group_start, received - waited)",
        "fits_as_parent(parent, group_start, None)",
        "a holder of the parent's PID gone before the child was is its parent",
    )  # fmt: skip
    yield m(
        "gone/threads-taken", GONE,
        "not raw[_LAST]\n",
        "False\n",
        "a thread's record is counted as a whole process's",
    )  # fmt: skip
    yield m(
        "gone/init-a-parent", GONE,
        "or ppid <= 1  #",
        "or ppid < 1  #",
        "init, which reaps orphans begun anywhere, is taken as their parent",
    )  # fmt: skip
    yield m(
        "gone/rows-lost-when-summed", GONE,
        "rows[:] = [tuple(map(sum, zip(*rows, strict=True)))]",
        "rows[:] = rows[-1:]",
        "a cgroup's rows, summed as they pile up, lose all but the last",
    )  # fmt: skip
    # -- collector/engine.py: a parent's life, as far as its sources know it ---------------
    yield m(
        "engine/held-parent-end-from-records-dropped", ENGINE,
        "((e.gone_from_ns, e.gone_by_ns) for e in own if _meets(e, life))",
        "((e.gone_from_ns, e.gone_by_ns) for e in own if gone and _meets(e, life))",
        "a parent read alive whose record came in this pass is a parent past its end",
    )  # fmt: skip
    yield m(
        "engine/held-parent-end-from-earlier-records-dropped", ENGINE,
        "end = self.tracker.ended(pid, reading.start_ticks)",
        "end = None",
        "a parent whose record came a pass before is a parent past its end",
    )  # fmt: skip
    yield m(
        "engine/gone-parent-kept-under-loss", ENGINE,
        "                elif gone is not None and lost_lately:\n                    continue\n",
        "",
        "where records were lost, a parent gone without its record is still a parent",
    )  # fmt: skip
    yield m(
        "engine/fold-parent-never-gone", ENGINE,
        "fold.start_ns, seen - waited, seen, None, fold.ppid)",
        "fold.start_ns, None, None, None, fold.ppid)",
        "a fold's parent may have been gone before the fold's first thread exited",
    )  # fmt: skip
    yield m(
        "tracker/unread-pending-not-asked", TRACKER,
        "            self._pending,\n        )",
        "        )",
        "a born process's last record is counted by parent without its gone tasks' times",
    )  # fmt: skip
    yield m(
        "tracker/birth-lower-bound-inclusive", TRACKER,
        "return previous < start_ns <= at_ns",
        "return previous <= start_ns <= at_ns",
        "a process started at the very instant the last pass listed counts as born",
    )  # fmt: skip
    yield m(
        "tracker/birth-upper-bound-strict", TRACKER,
        "return previous < start_ns <= at_ns",
        "return previous < start_ns < at_ns",
        "a process read at the tick it started is refused instead of born",
    )  # fmt: skip
    yield m(
        "tracker/birth-upper-bound-dropped", TRACKER,
        "return previous < start_ns <= at_ns",
        "return previous < start_ns",
        "a start time later than the reading's instant (observed < 0) counts as a birth",
    )  # fmt: skip
    yield m(
        "tracker/birth-lower-bound-dropped", TRACKER,
        "return previous < start_ns <= at_ns",
        "return start_ns <= at_ns",
        "every first sighting counts as born: its whole past counted in one interval",
    )  # fmt: skip
    yield m(
        "tracker/carried-identity-dropped", TRACKER,
        "if old is None or reading is not old:",
        "if old is None:",
        "a carried reading that is not the cached one is summed as a zero delta, not guarded",
    )  # fmt: skip
    yield m(
        "tracker/carried-instant-check-dropped", TRACKER,
        "if at_ns < since_ns:",
        "if False:",
        "a carry at an instant before the last one gives a negative observed time",
    )  # fmt: skip
    yield m(
        "tracker/carried-instant-ignored", TRACKER,
        "since_ns = old.at_ns if since is None else since.ns",
        "since_ns = old.at_ns",
        "a process carried in a new block counts from its last reading, not its last carry",
    )  # fmt: skip
    yield m(
        "tracker/read-after-carry-instant-ignored", TRACKER,
        "since_ns = old.at_ns if instant is None else instant.ns",
        "since_ns = old.at_ns",
        "a process read after being carried counts the carried span twice",
    )  # fmt: skip
    yield m(
        "tracker/block-identity-dropped", TRACKER,
        "map(is_, map(members.__getitem__, common),",
        "map(lambda *_: True, map(members.__getitem__, common),",
        "a process a block kept under another reading is summed as a carry, never guarded",
    )  # fmt: skip
    yield m(
        "tracker/block-instant-check-dropped", TRACKER,
        "if last is not None and last.instant.ns <= at_ns:",
        "if last is not None:",
        "a block carried again at an earlier instant gives a negative observed time",
    )  # fmt: skip
    yield m(
        "tracker/block-leaving-instant-shared", TRACKER,
        "carry.instants.append((pid, _Instant(instant.ns)))",
        "pass",
        "a process leaving a block to be read counts from the block's new instant: its span lost",
    )  # fmt: skip
    yield m(
        "tracker/refused-kept-in-block", TRACKER,
        "if refused:",
        "if False:",
        "a reading refused from a block is kept in it: the next pass counts it from the block",
    )  # fmt: skip
    yield m(
        "tracker/gone-instant-kept", TRACKER,
        "instant = since_of.pop(pid, None)",
        "instant = since_of.get(pid)",
        "the instant of a gone process is never dropped: memory beyond the table",
    )  # fmt: skip
    yield m(
        "tracker/read-written-midway", TRACKER,
        "            instant = since_of.get(pid)\n",
        "            instant = since_of.get(pid)\n            cache[pid] = reading\n",
        "a process read is cached before the pass is taken: a failed pass leaves it cached",
    )  # fmt: skip
    yield m(
        "tracker/read-instant-kept", TRACKER,
        "                del since_of[pid]\n",
        "                pass\n",
        "a process read keeps the instant it was carried to: its next span counted from there",
    )  # fmt: skip
    yield m(
        "tracker/blocks-kept-on-failure", TRACKER,
        "        if others or not isinstance(",
        "        self._blocks = carry.blocks\n        if others or not isinstance(",
        "a failed pass's blocks are kept: the next pass counts them from the failed instant",
    )  # fmt: skip
    yield m(
        "tracker/iterator-read-once", TRACKER,
        "if others or not isinstance(readings, (list, tuple)):",
        "if others:",
        "readings given as an iterator are used up by the guard: none is kept",
    )  # fmt: skip
    yield m(
        "tracker/pid-instants-written-midway", TRACKER,
        "            carry.instants.append((pid, instant))\n",
        "            carry.instants.append((pid, instant))\n            since_of[pid] = instant\n",
        "a failed pass leaves a process that joined a block standing for the block's instant",
    )  # fmt: skip
    yield m(
        "tracker/instant-moved-midway", TRACKER,
        "        carry.moves.append((instant, at_ns))\n",
        "        carry.moves.append((instant, at_ns))\n        instant.ns = at_ns\n",
        "a block's instant moved before the pass is taken: one leaving it is read from there",
    )  # fmt: skip
    # -- collector/aggregate.py: the sums ---------------------------------------------------
    yield m(
        "aggregate/malformed-read-parsed-again", AGGREGATE,
        "            group_of_pid[seen.pid] = None\n            continue\n",
        "            continue\n",
        "a read process's malformed cgroup file is parsed again for its delta: the pass raises",
    )  # fmt: skip
    yield m(
        "aggregate/carried-delta-dropped", AGGREGATE,
        "group = group_of_pid[delta.reading.pid] = _group_of_carried(\n"
        "                grouper, delta.reading.cgroup\n            )",
        "continue",
        "the delta of a carried reading the guard had not accepted is lost",
    )  # fmt: skip
    yield m(
        "aggregate/carried-observed-dropped", AGGREGATE,
        "interval.observed_nanos += delta.observed_ns",
        "pass",
        "a carried block's processes add to the count, not to the observed time",
    )  # fmt: skip
    # -- collector/cgroupguard.py: the cgroup guard ----------------------------------------
    yield m(
        "cgroupguard/identity-check-dropped", CGROUPGUARD,
        "if old.identity != new.identity:",
        "if False:",
        "a cgroup made anew is subtracted from the old one's counters",
    )  # fmt: skip
    yield m(
        "cgroupguard/fell-check-dropped", CGROUPGUARD,
        "    if new < old:\n        raise _Fell\n",
        "",
        "a counter that fell gives a negative delta instead of dropping the group's",
    )  # fmt: skip
    yield m(
        "cgroupguard/bandwidth-inode-dropped", CGROUPGUARD,
        "if last is None or last.inode != entry.inode:",
        "if last is None:",
        "a child cgroup made anew under the same path is subtracted from the old one",
    )  # fmt: skip

    # -- the groups' and the namespace's guards -----------------------------------------------
    yield m(
        "groups/nested-kubepods-guaranteed-dropped", GROUPS,
        'if parent == "kubepods" or parent.endswith("kubepods"):',
        'if parent == "kubepods":',
        "a guaranteed pod under a nested kubelet's prefixed kubepods gets qos=\"\"",
    )  # fmt: skip
    yield m(
        "cgroupns/complete-without-roots", CGROUPNS,
        "return self.roots is None or (bool(self.roots) and not self.missing)",
        "return self.roots is None or not self.missing",
        "a private namespace with no hierarchy mounted reports cgroup_namespace_root available",
    )  # fmt: skip
    # -- collector/listener.py: what a client can hold --------------------------------------
    yield m(
        "listener/head-deadline-dropped", LISTENER,
        '        self._wait(listener.limits.header_timeout, "no whole request in time")\n',
        "",
        "a connection that sends nothing (or an unfinished TLS handshake) is held for ever",
    )  # fmt: skip
    yield m(
        "listener/head-deadline-per-byte", LISTENER,
        'if not self.buffer and not self.busy and self.timer_reason == "idle":',
        "if not self.busy:",
        "the deadline restarts at every byte (a per-read timeout): a trickled head holds on",
    )  # fmt: skip
    yield m(
        "admission/max-requests-dropped", ADMISSION,
        "if 0 < self.limits.max_requests <= self.in_flight:",
        "if False:",
        "no bound on the requests answered at once: no 503",
    )  # fmt: skip
    yield m(
        "listener/write-deadline-dropped", LISTENER,
        'listener.limits.write_timeout, self._expired, "response not taken in time"',
        '3600, self._expired, "response not taken in time"',
        "a client that asks and never reads holds its place among --web.max-requests for ever",
    )  # fmt: skip
    yield m(
        "admission/eviction-dropped", ADMISSION,
        "if self.connections > self.limits.max_connections and self.waiting:",
        "if False:",
        "a flood holds as many connections as the open files limit allows",
    )  # fmt: skip
    yield m(
        "http11/unterminated-head-buffered", HTTP11,
        "            if len(data) > MAX_HEAD_BYTES:\n                return plain(431",
        "            if False:\n                return plain(431",
        "a head with no end is buffered on until its deadline: gigabytes in 10 s",
    )  # fmt: skip
    yield m(
        "listener/pipelined-unpaused", LISTENER,
        "over = len(self.buffer) > MAX_HEAD_BYTES",
        "over = False",
        "a client pipelining behind a request in flight fills the server's memory",
    )  # fmt: skip
    yield m(
        "admission/gates-unbounded", ADMISSION,
        "if self.gates >= (self.limits.max_requests or MAX_GATES):",
        "if False:",
        "clients without the password queue bcrypt checks without bound",
    )  # fmt: skip
    # -- collector/exporter.py: the routes' guards ------------------------------------------
    yield m(
        "exporter/healthz-unguarded", EXPORTER,
        "known = web.remembered(header)",
        'known = True if request.path == "/healthz" else web.remembered(header)',
        "/healthz answers without credentials under basic auth",
    )  # fmt: skip
    yield m(
        "exporter/auth-check-holds-a-place", EXPORTER,
        "gate=True,  # holds no --web.max-requests place while it waits",
        "gate=False,",
        "clients without the password take every --web.max-requests place: scrapes get 503",
    )  # fmt: skip
    yield m(
        "passloop/failed-pass-refreshes-health", PASSLOOP,
        "            self._publish(self._render(completed_at=self.snapshot().completed_at))\n"
        "            return None",
        "            self._publish(self._render(completed_at=self.monotonic()))\n"
        "            return None",
        "/healthz stays green while every pass fails: kubelet never restarts the pod",
    )  # fmt: skip
    # -- collector/webconfig.py: TLS and basic auth -----------------------------------------
    yield m(
        "webconfig/tls-minimum-tls10", WEBCONFIG,
        'tls.get("min_version", "TLS12")',
        'tls.get("min_version", "TLS10")',
        "TLS 1.0 and 1.1 accepted unless min_version says otherwise",
    )  # fmt: skip
    yield m(
        "webconfig/dummy-hash-dropped", WEBCONFIG,
        "if hashed is None:\n            checks = [self._dummies[highest]]",
        "if hashed is None:\n            return False",
        "an unknown user is answered at once: the time tells which users exist",
    )  # fmt: skip
    yield m(
        "webconfig/unknown-user-admitted", WEBCONFIG,
        "if not ok or hashed is None:",
        "if not ok:",
        "a password that matches the dummy hash lets an unknown user in",
    )  # fmt: skip
    yield m(
        "webconfig/long-password-not-cut", WEBCONFIG,
        "password = password[:BCRYPT_MAX_BYTES]\n        hashed = self.users.get(user)",
        "hashed = self.users.get(user)",
        "a user whose password is longer than 72 bytes can never log in",
    )  # fmt: skip
    yield m(
        "webconfig/bcrypt-not-serialized", WEBCONFIG,
        "with self._bcrypt:",
        "with threading.Lock():",
        "wrong passwords take every core, not one",
    )  # fmt: skip
    yield m(
        "webconfig/request-client-cert-verifies", WEBCONFIG,
        '"RequestClientCert": None,',
        '"RequestClientCert": ssl.CERT_OPTIONAL,',
        "RequestClientCert fails the handshake of a client whose certificate no CA verifies",
    )  # fmt: skip
    yield m(
        "webconfig/require-any-verifies", WEBCONFIG,
        '"RequireAnyClientCert": None,',
        '"RequireAnyClientCert": ssl.CERT_REQUIRED,',
        "RequireAnyClientCert without client_ca_file refuses every client",
    )  # fmt: skip
    yield m(
        "webconfig/require-any-not-required", WEBCONFIG,
        'required=auth == "RequireAnyClientCert",',
        "required=False,",
        "RequireAnyClientCert lets in a client without a certificate",
    )  # fmt: skip
    # -- collector/waits.py and its reading in the engine: the run delay split by cause ---
    yield m(
        "waits/throttled-uncapped", WAITS,
        "throttled = min(delay, cgroup.cpu_throttled_nanos or 0)",
        "throttled = cgroup.cpu_throttled_nanos or 0",
        "a pod throttled at two levels (pod and container quotas) explains more wait than it had",
    )  # fmt: skip
    yield m(
        "waits/own-threads-uncapped", WAITS,
        "own = min(left, max(0, runnable - (cpus or node.cpus) * node.interval_ns))",
        "own = max(0, runnable - (cpus or node.cpus) * node.interval_ns)",
        "the own-threads part counts wait the quota already explained, twice",
    )  # fmt: skip
    yield m(
        "waits/neighbours-uncapped", WAITS,
        "return throttled, own, min(left, others)",
        "return throttled, own, left",
        "a pod waits while the rest of the node was idle, and its neighbours are blamed",
    )  # fmt: skip
    yield m(
        "waits/own-cpu-not-the-cgroups", WAITS,
        "used = max(fields.on_cpu_nanos, cgroup.cgroup_cpu_nanos or 0)",
        "used = fields.on_cpu_nanos",
        "a pod's short-lived processes' CPU is counted as its neighbours' use",
    )  # fmt: skip
    yield m(
        "waits/busy-with-idle", WAITS,
        "_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)",
        "_BUSY_COLUMNS = (0, 1, 2, 3, 5, 6, 7)",
        "idle time counted as the node's busy time: the neighbours' cap never binds",
    )  # fmt: skip
    yield m(
        "waits/fell-busy-taken", WAITS,
        "    if busy < 0:\n        return None\n",
        "",
        "a node reading that fell (a reboot's, another /proc's) caps the neighbours below 0",
    )  # fmt: skip
    yield m(
        "engine/node-reading-moved-by-a-failed-pass", ENGINE,
        "            node = node_interval(self._node_before, node_now, interval_ns)\n",
        "            node = node_interval(self._node_before, node_now, interval_ns)\n"
        "            self._node_before = node_now\n",
        "a pass that fails after its node reading leaves the next one a shorter busy time",
    )  # fmt: skip
    # -- collector/processes.py: the processes view -------------------------------------
    yield m(
        "processes/carried-left-out", PROCESSES,
        "            if not matches(group) or not members:",
        "            if True:",
        "an idle pod's processes vanish from the view and its rows no longer sum to the pod",
    )  # fmt: skip
    yield m(
        "processes/carried-share-remainder-lost", PROCESSES,
        "fields = Fields(1, share + (index < extra))",
        "fields = Fields(1, share)",
        "the carried processes' observed time falls short of their group's",
    )  # fmt: skip
    yield m(
        "processes/smallest-first", PROCESSES,
        "return -getattr(row.fields, name), row.pid",
        "return getattr(row.fields, name), row.pid",
        "the processes that wait least are listed first, and the limit cuts the ones that wait",
    )  # fmt: skip
    yield m(
        "processes/filters-ignored", PROCESSES,
        "return all(labels.get(name) == value for name, value in self.filters)",
        "return True",
        "a pod's view lists every process on the node",
    )  # fmt: skip
    yield m(
        "processes/unsummed-listed", PROCESSES,
        "        if group is None:\n            return False\n",
        "        if group is None:\n            return not query.filters\n",
        "processes left out of the sums (--pods-only, unplaced) are listed as a group's",
    )  # fmt: skip
    yield m(
        "exporter/view-on-the-event-loop", EXPORTER,
        "        return Deferred(answer, aside=True)",
        "        return answer()",
        "a slow view holds the event loop, and every scrape of /metrics waits for it",
    )  # fmt: skip
    yield m(
        "listener/view-in-the-auth-thread", LISTENER,
        "executor = listener.slow if deferred.gate else listener.views",
        "executor = listener.slow",
        "a slow view holds back every basic auth check, and so the scrapes that need one",
    )  # fmt: skip
    yield m(
        "admission/views-unbounded", ADMISSION,
        "            if self.aside >= MAX_ASIDE:",
        "            if False:",
        "a flood of /processes queues views without bound behind the one views thread",
    )  # fmt: skip
    yield m(
        "exporter/view-holds-a-place", EXPORTER,
        "        return Deferred(answer, aside=True)",
        "        return Deferred(answer)",
        "a burst of /processes takes every --web.max-requests place: scrapes and probes get 503",
    )  # fmt: skip
    yield m(
        "passloop/pass-makes-the-view", PASSLOOP,
        "            PassView.of(result),\n            result.cpusets,\n        )\n",
        "            PassView.of(result),\n            result.cpusets,\n        )\n"
        "        self._data.view.document(Query(limit=None))\n",
        "every pass pays for a view nobody asked for",
    )  # fmt: skip
    yield m(
        "processes/groups-only-of-listed-rows", PROCESSES,
        "        if query.filters:\n            groups = self.table.groups(query)",
        "        if False:\n            groups = self.table.groups(query)",
        "a pod whose processes have no delta loses its own cgroup's line (its throttling)",
    )  # fmt: skip
    # -- collector/top/: procdelta top ------------------------------------------------------
    yield m(
        "top/pod-without-its-namespace", TOP_CORE,
        'return (("namespace", self.pod[0]), ("pod", self.pod[1]))',
        'return (("pod", self.pod[1]),)',
        "--pod prod/web-0 shows staging/web-0's processes too",
    )  # fmt: skip
    yield m(
        "top/from-drops-the-sort", TOP_REMOTE,
        '        params["sort"] = selection.sort\n',
        "",
        "--from --sort on_cpu_nanos shows the server's run-delay cut: the busiest may be missing",
    )  # fmt: skip
    yield m(
        "top/threads-delta-on-first-sight", TOP_THREADS,
        "                before = self._seen.get(tid)\n",
        "                before = self._seen.get(tid)"
        " or _ThreadLast(pid, stat.start_ticks, (0, 0, 0, 0))\n",
        "a thread's first sight shows its whole life as one interval's wait",
    )  # fmt: skip
    yield m(
        "top/threads-reused-tid", TOP_THREADS,
        "                    or before.start_ticks != reading.start_ticks\n",
        "",
        "a TID reused by a new thread shows the difference of two threads' counters",
    )  # fmt: skip
    yield m(
        "top/threads-counter-fell", TOP_THREADS,
        "                    or any(n < b for n, b in"
        " zip(counters, before.counters, strict=True))\n",
        "",
        "a counter that fell gives a negative delta",
    )  # fmt: skip
    yield m(
        "top/terminal-kept-on-an-error", TOP_TERMINAL,
        "    except (KeyboardInterrupt, _Stop):\n        pass\n    finally:\n",
        "    except (KeyboardInterrupt, _Stop):\n        pass\n    if True:\n",
        "an error leaves the terminal in cbreak mode, without echo",
    )  # fmt: skip
    yield m(
        "top/terminal-kept-on-sigterm", TOP_TERMINAL,
        "        with _signals_stop(), _resizes() as resized:",
        "        with contextlib.nullcontext(), _resizes() as resized:",
        "a SIGTERM or a hangup (kubectl exec closed) leaves the terminal in cbreak mode",
    )  # fmt: skip


MUTANTS: tuple[Mutant, ...] = tuple(_mutants())


# -- checking and applying ------------------------------------------------------------------


def problems_in(mutants: tuple[Mutant, ...], root: Path) -> list[str]:
    """One line per mutant whose original snippet is not exactly once in its file, or
    whose edit does not compile (it would be killed by a SyntaxError, proving nothing)."""
    problems = []
    for mutant in mutants:
        path = root / mutant.path
        text = path.read_text() if path.is_file() else ""
        count = text.count(mutant.original)
        if count != 1:
            problems.append(f"{mutant.name}: snippet found {count} times in {mutant.path}")
            continue
        try:
            compile(text.replace(mutant.original, mutant.replacement), mutant.path, "exec")
        except SyntaxError as error:
            problems.append(f"{mutant.name}: the mutated file does not compile: {error}")
    return problems


def copy_repository(root: Path, target: Path) -> None:
    """The tracked and untracked, non-ignored files of `root`, as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True,
    ).stdout  # fmt: skip
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        source = root / name
        if not source.is_file() and not source.is_symlink():
            continue  # deleted in the work tree
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination, follow_symlinks=False)


# -- running --------------------------------------------------------------------------------

ALONE_RUNS = 3
"""How many times a failing test is run alone, looking for a pass that shows it flaky."""


@dataclass
class Outcome:
    mutant: Mutant | None  # None: the unmutated copy
    killed: bool
    seconds: float
    killer: str = ""  # the first failing test id (or what stopped the run)
    flaky: tuple[str, ...] = ()  # tests that failed in a run, passed alone, and were set aside

    @property
    def test_file(self) -> str:
        return self.killer.split("::")[0] if "::" in self.killer else ""


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def python() -> str:
    """The project's venv python, where it is (else the one running this)."""
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def pytest_configure(config: object) -> None:
    """A pytest hook, for the test runs only (`-p tests.tools.mutation`): Hypothesis stops at
    its first failing example, unshrunk. A killed mutant needs no minimal example, and
    shrinking one took minutes, run after run."""
    from hypothesis import Phase, settings

    settings.register_profile("mutation", phases=(Phase.explicit, Phase.reuse, Phase.generate))
    settings.load_profile("mutation")


def run_tests(
    copy: Path, tests: list[str], timeout: float, deselect: tuple[str, ...] = ()
) -> tuple[bool, str]:
    """(whether every test passed, the first failing test id or what went wrong)."""
    shutil.rmtree(copy / ".hypothesis", ignore_errors=True)  # no example replayed across runs
    command = [
        python(), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
        "-p", "tests.tools.mutation", "--hypothesis-seed=0", *tests,
        *(f"--deselect={test}" for test in deselect),
    ]  # fmt: skip
    environment = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    with subprocess.Popen(
        command, cwd=copy, env=environment, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    ) as process:  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return False, f"timeout after {timeout:.0f}s"
    if process.returncode == 0:
        return True, ""
    (copy / "last-failure.txt").write_text(output)
    failed = _FAILED.search(output)
    if failed:
        return False, failed.group(1)
    last = output.strip().splitlines()[-1:] or [""]
    return False, f"exit status {process.returncode}: {last[0][:100]}"


def kernel_tests(copy: Path, tests: list[str]) -> set[str]:
    """The ids of the tests marked `kernel`: real processes in real cgroups, whose
    timing the other worker's load (or anyone's) can upset."""
    listed = subprocess.run(
        [python(), "-m", "pytest", "--collect-only", "-q", "-m", "kernel",
         "-p", "no:cacheprovider", *tests],
        cwd=copy, env=dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    return {line.strip() for line in listed.splitlines() if "::" in line}


def judge(mutant: Mutant | None, copy: Path, tests: list[str], timeout: float) -> Outcome:
    """Run the tests on the copy as it is. A failing test is run again alone (up to
    `ALONE_RUNS` times): if it then passes, the failure was the test's, not the code's
    (some kernel tests depend on timing, more so beside the other worker's load), and
    the run is repeated without it."""
    began = time.monotonic()
    flaky: tuple[str, ...] = ()
    while True:
        passed, killer = run_tests(copy, tests, timeout, flaky)
        if passed or "::" not in killer or killer in flaky:
            break
        if not any(run_tests(copy, [killer], timeout)[0] for _ in range(ALONE_RUNS)):
            break
        flaky += (killer,)
    return Outcome(mutant, not passed, time.monotonic() - began, killer, flaky)


def try_mutant(mutant: Mutant, copy: Path, tests: list[str], timeout: float) -> Outcome:
    path = copy / mutant.path
    original = path.read_text()
    path.write_text(original.replace(mutant.original, mutant.replacement, 1))
    try:
        return judge(mutant, copy, tests, timeout)
    finally:
        path.write_text(original)


def run(mutants: tuple[Mutant, ...], jobs: int, timeout: float | None) -> int:
    began = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="procdelta-mutation-"))
    workers = [scratch / f"worker-{worker}" for worker in range(jobs)]
    for copy in workers:
        copy_repository(ROOT, copy)
    first = workers[0]
    problems = problems_in(mutants, first)
    if problems:
        print("stale mutants (the code changed under the catalogue):", *problems, sep="\n  ")
        shutil.rmtree(scratch, ignore_errors=True)
        return 2
    tests = [t for t in TEST_FILES if (first / t).is_file()]
    missing = [t for t in TEST_FILES if t not in tests]
    print(f"copied {ROOT} to {scratch} ({jobs} workers)")
    print(f"tests: {' '.join(Path(t).name for t in tests)}")
    if missing:
        print(f"missing, skipped: {' '.join(missing)}")
    copies: queue.Queue[Path] = queue.Queue()  # the copies not in use
    for copy in workers:
        copies.put(copy)

    with ThreadPoolExecutor(jobs) as pool:
        baselines = list(pool.map(lambda copy: judge(None, copy, tests, timeout or 600), workers))
        for copy, outcome in zip(workers, baselines, strict=True):
            if outcome.killed:
                print(f"the unmutated tests fail ({outcome.killer}): no mutant was run")
                print(f"their output: {copy / 'last-failure.txt'}")
                return 3
        slowest = max(outcome.seconds for outcome in baselines)
        limit = timeout or max(120.0, 3 * slowest)
        print(f"unmutated: passed in {slowest:.0f}s; timeout per mutant {limit:.0f}s")
        for test in sorted({test for outcome in baselines for test in outcome.flaky}):
            print(f"  flaky on the unmutated code (failed, then passed alone): {test}")
        print()

        def one(mutant: Mutant) -> Outcome:
            copy = copies.get()
            try:
                outcome = try_mutant(mutant, copy, tests, limit)
            finally:
                copies.put(copy)
            print(line(outcome), flush=True)
            return outcome

        outcomes = list(pool.map(one, mutants))
    timing = kernel_tests(first, tests)
    shutil.rmtree(scratch, ignore_errors=True)
    report(outcomes, baselines, timing, time.monotonic() - began)
    return 0


def line(outcome: Outcome) -> str:
    assert outcome.mutant is not None
    verdict = "killed  " if outcome.killed else "SURVIVED"
    aside = f"  (set aside as flaky: {', '.join(outcome.flaky)})" if outcome.flaky else ""
    return f"{verdict} {outcome.mutant.name:<45} {outcome.seconds:5.0f}s  {outcome.killer}{aside}"


def report(
    outcomes: list[Outcome], baselines: list[Outcome], timing: set[str], seconds: float
) -> None:
    killed = [o for o in outcomes if o.killed]
    survived = [o for o in outcomes if not o.killed]
    print(f"\n{len(outcomes)} mutants: {len(killed)} killed, {len(survived)} survived")
    by_file: dict[str, int] = {}
    for outcome in killed:
        name = outcome.test_file or outcome.killer
        by_file[name] = by_file.get(name, 0) + 1
    for name, count in sorted(by_file.items(), key=lambda item: -item[1]):
        print(f"  {count:3} killed by {name}")
    flaky: dict[str, int] = {}
    for outcome in outcomes + baselines:
        for test in outcome.flaky:
            flaky[test] = flaky.get(test, 0) + 1
    for test, count in sorted(flaky.items()):
        print(f"  flaky: {test} failed, then passed alone, in {count} runs")
    doubtful = [o for o in killed if o.killer in flaky or o.killer in timing]
    if doubtful:
        print("\nkilled only by a test on the real kernel, or one flaky in this run: a load")
        print("can fail those; check each with --only NAME --jobs 1 on a quiet machine:")
        for outcome in doubtful:
            assert outcome.mutant is not None
            print(f"  {outcome.mutant.name}: {outcome.killer}")
    if survived:
        print("\nsurvivors:")
        for outcome in survived:
            assert outcome.mutant is not None
            print(f"  {outcome.mutant.name} ({outcome.mutant.path})")
            print(f"      {outcome.mutant.why}")
    print(f"\ntime taken: {seconds / 60:.1f} min")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.tools.mutation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these mutants (shell patterns)")
    parser.add_argument("--jobs", type=int, default=2, help="workers, each with its copy (2)")
    parser.add_argument("--timeout", type=float, help="seconds per mutant (3x the unmutated run)")
    args = parser.parse_args(argv)
    mutants = MUTANTS
    if args.only:
        mutants = tuple(m for m in MUTANTS if any(fnmatch.fnmatch(m.name, p) for p in args.only))
        if not mutants:
            parser.error(f"no mutant matches {' '.join(args.only)}")
    problems = problems_in(MUTANTS, ROOT)
    if args.list:
        for mutant in mutants:
            print(f"{mutant.name:<45} {mutant.path}\n    {mutant.why}")
        print(f"{len(mutants)} mutants")
    if problems:
        print("stale mutants (the code changed under the catalogue):", *problems, sep="\n  ")
        return 2
    if args.list:
        return 0
    return run(mutants, max(1, args.jobs), args.timeout)


if __name__ == "__main__":
    sys.exit(main())
