"""Property-based tests of the parsers and the guard (Hypothesis). Random bytes for every
parser (they almost never parse: the refusal path), and, so that the parsing and delta
arithmetic are exercised too, valid files from the fixture tree mutated as real files go
wrong (a field cut, a number grown
past any width, a name holding `) (`), and pass sequences in which births, reused PIDs,
continuations and fallen counters are all common. Nothing raises but the one error type;
a refused delta is never emitted, an emitted delta is never negative, a birth counts
whole, a continuation counts exactly new - old, a fallen counter drops the process."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.cgroupguard import CgroupTracker
from collector.fieldtable import PROCESS_FIELDS, THREAD_FIELDS, Field
from collector.groups import classify
from collector.model import (
    FIELD_NAMES,
    Bandwidth,
    CgroupReading,
    Malformed,
    Pressure,
    ProcessReading,
    ThreadReading,
)
from collector.parse import (
    parse_cgroup,
    parse_flat_keyed,
    parse_io,
    parse_pressure,
    parse_schedstat,
    parse_single_value,
    parse_start_ticks,
    parse_stat,
    parse_status_switches,
)
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.readings import Carried
from collector.tracker import Tracker
from tests.fixturetree import FIXTURES
from tests.readings import THREAD_COUNTERS, process_reading, thread_reading

PARSERS = [parse_stat, parse_start_ticks, parse_schedstat, parse_status_switches, parse_io,
           parse_cgroup, parse_flat_keyed, parse_single_value, parse_pressure]  # fmt: skip
HUGE = st.integers(min_value=0, max_value=2**128)


def _natural_fields(value) -> list[int]:
    if isinstance(value, dict):
        return list(value.values())
    return [v for v in value if isinstance(v, int)] if isinstance(value, tuple) else [value]


@settings(max_examples=400)
@given(data=st.binary(max_size=600))
def test_parsers_take_any_bytes(data):
    for parse in PARSERS:
        try:
            value = parse(data)
        except Malformed:
            continue
        if parse is parse_cgroup:
            assert value and all(line.path.startswith("/") for line in value)
        else:
            assert all(v >= 0 for v in _natural_fields(value))


@given(
    comm=st.binary(max_size=40),
    majflt=HUGE, utime=HUGE, stime=HUGE, threads=HUGE, start=HUGE, rss=HUGE,
    cut=st.integers(min_value=0, max_value=400),
)  # fmt: skip
def test_stat_with_any_name_and_huge_numbers(comm, majflt, utime, stime, threads, start, rss, cut):
    line = (
        b"4242 (" + comm + b") S 1 2 3 0 -1 4194560 500 0 "
        + f"{majflt} 0 {utime} {stime} 0 0 20 0 {threads} 0 {start} 1000 {rss} 1 2 3\n".encode()
    )  # fmt: skip
    stat = parse_stat(line)
    assert (stat.pid, stat.major_faults, stat.utime_ticks, stat.stime_ticks) == (
        4242, majflt, utime, stime,
    )  # fmt: skip
    assert (stat.num_threads, stat.start_ticks, stat.rss_pages) == (threads, start, rss)
    assert parse_start_ticks(line) == start
    truncated = line[:cut]
    try:
        parsed = parse_stat(truncated)
    except Malformed:
        return
    assert all(v >= 0 for v in _natural_fields(parsed))


@given(text=st.binary(max_size=300))
def test_classifier_takes_any_cgroup_text(text):
    try:
        classified = classify(text)
    except Malformed:
        return
    assert classified.pod is not None or classified.cgroup.startswith("/")


def _fixture_files(name: str) -> list[bytes]:
    """Every fixture file of this name (both passes, processes and threads)."""
    return sorted({p.read_bytes() for p in (FIXTURES / "proc").rglob(name) if p.is_file()})


VALID = {
    "stat": (_fixture_files("stat"), parse_stat),
    "schedstat": (_fixture_files("schedstat"), parse_schedstat),
    "status": (_fixture_files("status"), parse_status_switches),
    "io": (_fixture_files("io"), parse_io),
    "cgroup": (_fixture_files("cgroup"), parse_cgroup),
}


def _parses(parse, data):
    try:
        return parse(data)
    except Malformed:
        return None


@settings(max_examples=300)
@given(kind=st.sampled_from(sorted(VALID)), data=st.data())
def test_valid_files_with_a_number_grown_still_parse(kind, data):
    """A number of any width: each digit run of a valid file grown by up to 40 digits."""
    files, parse = VALID[kind]
    original = data.draw(st.sampled_from([f for f in files if _parses(parse, f) is not None]))
    runs = [m for m in re.finditer(rb"\d+", original)]
    run = data.draw(st.sampled_from(runs))
    digits = data.draw(st.text("0123456789", min_size=1, max_size=40)).encode()
    grown = original[: run.end()] + digits + original[run.end() :]
    value = _parses(parse, grown)
    assert value is not None, grown
    if kind != "cgroup":
        assert all(v >= 0 for v in _natural_fields(value))


@settings(max_examples=300)
@given(kind=st.sampled_from(sorted(VALID)), data=st.data())
def test_valid_files_with_a_field_cut_parse_or_refuse(kind, data):
    """One whitespace-separated field (or a line) removed: refused as Malformed, or still a
    well-formed value; never another exception, never a negative number."""
    files, parse = VALID[kind]
    original = data.draw(st.sampled_from(files))
    tokens = re.split(rb"([ \n])", original)
    index = data.draw(st.integers(0, len(tokens) - 1))
    value = _parses(parse, b"".join(tokens[:index] + tokens[index + 1 :]))
    if value is not None and kind != "cgroup":
        assert all(v >= 0 for v in _natural_fields(value))


@settings(max_examples=300)
@given(
    name=st.lists(st.sampled_from([b") (", b")", b"(", b" ", b"a", b"\n", b"\xff", b"1 2 3"]),
                  max_size=8).map(b"".join),
    data=st.data(),
)  # fmt: skip
def test_valid_stat_with_any_name_keeps_its_numbers(name, data):
    """A name holding `) (`, spaces, digits or a newline: the numbers are counted from the
    last `)`, so they are those of the file the name was put into."""
    files, parse = VALID["stat"]
    original = data.draw(st.sampled_from([f for f in files if _parses(parse, f) is not None]))
    head, rest = original.split(b" (", 1)
    tail = rest[rest.rindex(b")") :]
    renamed = head + b" (" + name + tail
    before, after = parse_stat(original), parse_stat(renamed)
    assert after._replace(comm=before.comm) == before


COUNTER = st.integers(min_value=0, max_value=2**70)


HZ = 100
TICK_NS = 10**9 // HZ
STEP = st.integers(0, 10**6)  # a counter's growth over a pass


@st.composite
def counters(draw, old: tuple[int, ...] | None, size: int) -> tuple[int, ...]:
    """Fresh counters, or the old ones grown; one in ten sequences has one fall."""
    if old is None:
        return tuple(draw(st.integers(0, 10**9)) for _ in range(size))
    grown = [value + draw(STEP) for value in old]
    if draw(st.integers(0, 9)) == 0:
        index = draw(st.integers(0, size - 1))
        grown[index] = draw(st.integers(0, old[index] - 1)) if old[index] else grown[index]
    return tuple(grown)


@st.composite
def pass_sequence(draw):
    """Up to 6 passes 1 s apart over PIDs 10, 20, 30. Each pass a PID is absent, goes on
    (the same start time, counters grown or once fallen), or is a new process: born
    since the previous listing (counted whole) or started long ago (a first sighting or
    a reused PID). Threads come, go and go on the same way."""
    passes, alive = [], {}
    for number in range(1, draw(st.integers(2, 6)) + 1):
        listed_at = number * 10**9
        at = listed_at + 5 * 10**8
        readings = []
        for pid in (10, 20, 30):
            choice = draw(st.sampled_from(["absent", "same", "same", "new"]))
            old = alive.get(pid)
            if choice == "absent" or (choice == "same" and old is None):
                alive.pop(pid, None)
                continue
            if choice == "same":
                start = old.start_ticks
            elif draw(st.booleans()):  # started at or after the previous pass began listing
                start = draw(st.integers((listed_at - 10**9) // TICK_NS, at // TICK_NS))
            else:
                start = draw(st.integers(0, 5))
            same = choice == "same"
            old_threads = {t.tid: t for t in old.threads} if same else {}
            threads = []
            for tid in sorted(draw(st.sets(st.sampled_from([pid, pid + 1, pid + 2]), min_size=1))):
                before = old_threads.get(tid)
                thread_start = (
                    before.start_ticks
                    if before
                    else max(start, draw(st.integers(0, at // TICK_NS)))
                )
                values = draw(counters(tuple(before[2:]) if before else None, len(THREAD_COUNTERS)))
                counters_of = dict(zip(THREAD_COUNTERS, values, strict=True))
                threads.append(thread_reading(tid=tid, start_ticks=thread_start, **counters_of))
            stat = draw(counters(tuple(getattr(old, a) for a in STAT) if same else None, len(STAT)))
            reading = process_reading(
                pid=pid,
                start_ticks=start,
                at_ns=at,
                threads=threads,
                **dict(zip(STAT, stat, strict=True)),
            )
            readings.append(reading)
            alive[pid] = reading
        passes.append((listed_at, readings))
    return passes


# From the field table (collector/fieldtable.py): a field added there is fuzzed here too.
STAT = tuple(field.reading or field.name for field in PROCESS_FIELDS)
THREAD_SUMS = {field.name: ThreadReading._fields.index(field.reading) for field in THREAD_FIELDS}


def in_interval(field: Field, value: int) -> int:
    """A process counter's value as the interval holds it: clock ticks to ns."""
    return value * TICK_NS if (field.reading or "").endswith("_ticks") else value


def expected_thread_sum(reading, old, previous_listing: int, index: int) -> int:
    """The oracle for one thread field of a continuing process: Σ new - old over the
    threads that go on without a fall of an exported field, plus the whole of threads
    born since the previous listing; other threads add nothing."""
    olds = {t.tid: t for t in old.threads}
    total = 0
    for thread in reading.threads:
        before = olds.get(thread.tid)
        if before is not None and before.start_ticks == thread.start_ticks:
            if not any(thread[i] < before[i] for i in THREAD_SUMS.values()):
                total += thread[index] - before[index]
        elif previous_listing < thread.start_ticks * TICK_NS <= reading.at_ns:
            total += thread[index]
    return total


def fell(new, old, names) -> bool:
    return any(getattr(new, n) < getattr(old, n) for n in names)


def test_guard_on_births_continuations_and_falls():
    """Every rule is reached across the examples (checked after them)."""
    exercised: set[str] = set()

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(passes=pass_sequence())
    def check(passes):
        tracker = Tracker(hz=HZ)
        previous: dict[int, ProcessReading] = {}
        previous_listing = None
        for listed_at, readings in passes:
            result = tracker.advance(readings, listed_at)
            deltas = {d.reading.pid: d for d in result.deltas}
            for reading in readings:
                old = previous.get(reading.pid)
                same = old is not None and old.start_ticks == reading.start_ticks
                born = (
                    not same
                    and previous_listing is not None
                    and previous_listing < reading.start_ticks * TICK_NS <= reading.at_ns
                )
                delta = deltas.get(reading.pid)
                if same and fell(reading, old, STAT):
                    assert delta is None  # the whole process dropped, never clamped
                    exercised.add("fell")
                    continue
                if not same and not born:
                    assert delta is None  # first sighting or reused PID
                    continue
                assert delta is not None and delta.born == born
                fields = delta.fields
                assert all(getattr(fields, name) >= 0 for name in FIELD_NAMES), delta
                if born:  # counted whole
                    exercised.add("born")
                    assert fields.observed_nanos == reading.at_ns - reading.start_ticks * TICK_NS
                    for field in PROCESS_FIELDS:
                        whole = in_interval(field, getattr(reading, field.reading or ""))
                        assert getattr(fields, field.name) == whole, field.name
                    for name, index in THREAD_SUMS.items():
                        # every thread of a process born since the last pass is new too
                        born_threads = [
                            t for t in reading.threads if t.start_ticks * TICK_NS > previous_listing
                        ]
                        assert getattr(fields, name) == sum(t[index] for t in born_threads)
                else:  # a continuation: exactly new - old
                    exercised.add("same")
                    assert fields.observed_nanos == reading.at_ns - old.at_ns
                    for field in PROCESS_FIELDS:
                        attribute = field.reading or ""
                        moved = getattr(reading, attribute) - getattr(old, attribute)
                        assert getattr(fields, field.name) == in_interval(field, moved), field.name
                    for name, index in THREAD_SUMS.items():
                        expected = expected_thread_sum(reading, old, previous_listing, index)
                        assert getattr(fields, name) == expected, name
            assert sum(result.refused.values()) + len(result.deltas) == len(readings)
            previous = {r.pid: r for r in readings}
            previous_listing = listed_at

    check()
    assert exercised == {"born", "same", "fell"}


def test_carried_blocks_count_each_process_from_its_own_last_instant():
    """Pass sequences shaped as the reader makes them: each process is read (it ran), or
    carried in its cgroup's block (last pass's very reading), or gone; a block is given
    as last pass's very object where it holds the same processes, else as a new mapping
    of the same readings, so that blocks stand, shrink, grow and change whole. Whatever
    the path a block takes through the tracker, each process counts from the instant it
    last stood for (its read, or its last carry) to the instant it stands for now, the
    way a tracker taking every process one by one would: per cgroup, the carried
    processes and their observed time; per process read, its delta."""
    exercised: set[str] = set()

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def check(data):
        tracker = Tracker(hz=HZ)
        cgroups = (b"0::/a\n", b"0::/b\n")
        last: dict[int, tuple[ProcessReading, int]] = {}  # pid -> (reading, its instant)
        blocks: dict[bytes, dict[int, ProcessReading]] = {}
        now = 10**12
        for _ in range(data.draw(st.integers(2, 12))):
            now += data.draw(st.integers(10**4, 10**10))
            listed_at, carried_at = now, now + 1000
            read: list[ProcessReading] = []
            members: dict[bytes, dict[int, ProcessReading]] = {c: {} for c in cgroups}
            for pid in range(10, 16):
                before = last.get(pid)
                choice = data.draw(
                    st.sampled_from(["read", "carry", "carry", "carry", "gone"])
                    if before
                    else st.sampled_from(["read", "absent"])
                )
                if choice == "read":
                    cgroup = before[0].cgroup if before else data.draw(st.sampled_from(cgroups))
                    user = before[0].utime_ticks + data.draw(st.integers(0, 3)) if before else 0
                    reading = process_reading(
                        pid=pid, at_ns=now + 2000 + pid, utime_ticks=user, cgroup=cgroup,
                        threads=(thread_reading(tid=pid, timeslices=1),),
                    )  # fmt: skip
                    read.append(reading)
                elif choice == "carry":
                    members[before[0].cgroup][pid] = before[0]
                else:
                    last.pop(pid, None)
            given_blocks = []
            for cgroup, now_members in members.items():
                if not now_members:
                    blocks.pop(cgroup, None)
                    continue
                kept = blocks.get(cgroup)
                if kept is not None and kept == now_members:
                    exercised.add("same object")
                    now_members = kept
                elif kept is not None and now_members.keys() & kept.keys():
                    exercised.add("changed")
                blocks[cgroup] = now_members
                given_blocks.append(Carried(cgroup, now_members, len(now_members), 0))
            outcome = tracker.advance(read, listed_at, given_blocks, carried_at)
            expected: dict[bytes, list[int]] = {}
            for cgroup, now_members in members.items():
                for pid, reading in now_members.items():
                    total = expected.setdefault(cgroup, [0, 0])
                    total[0] += 1
                    total[1] += carried_at - last[pid][1]
                    last[pid] = (reading, carried_at)
            carried = {d.cgroup: [len(d.readings), d.observed_ns] for d in outcome.carried}
            assert carried == expected
            deltas = {d.reading.pid: d.fields for d in outcome.deltas}
            for reading in read:
                before = last.get(reading.pid)
                if before is not None:
                    fields = deltas[reading.pid]
                    assert fields.observed_nanos == reading.at_ns - before[1]
                    assert (
                        fields.cpu_user_nanos
                        == (reading.utime_ticks - before[0].utime_ticks) * TICK_NS
                    )
                last[reading.pid] = (reading, reading.at_ns)
            assert tracker.tracked_processes == len(last)

    check()
    assert exercised == {"same object", "changed"}


FILES = ["stat", "cgroup", "task/{pid}/schedstat", "task/{pid}/status", "task/{pid}/io"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contents=st.lists(st.binary(max_size=200), min_size=5, max_size=5),
       keep=st.lists(st.booleans(), min_size=5, max_size=5))  # fmt: skip
def test_a_pass_over_random_files_never_raises(contents, keep):
    root = tempfile.mkdtemp(prefix="procdelta-fuzz-")
    try:
        for pid in (7, 8):
            for name, data, present in zip(FILES, contents, keep, strict=True):
                path = os.path.join(root, str(pid), name.format(pid=pid))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if present or pid == 8:
                    with open(path, "wb") as out:
                        out.write(data)
        reader = Reader(ProcFS(root), clock=lambda: 10**12, page_size=4096)
        for _ in range(2):
            readings = reader.read_pass()
            assert len(readings.processes) + readings.vanished + readings.unreadable == 2
    finally:
        shutil.rmtree(root)


@given(
    some=HUGE,
    full=st.one_of(st.none(), HUGE),
    averages=st.lists(st.floats(0, 100), min_size=6, max_size=6),
    cut=st.integers(min_value=0, max_value=200),
)
def test_pressure_with_huge_totals_and_any_averages(some, full, averages, cut):
    lines = [f"some avg10={averages[0]:.2f} avg60={averages[1]:.2f} avg300={averages[2]:.2f} "
             f"total={some}\n"]  # fmt: skip
    if full is not None:
        lines.append(
            f"full avg10={averages[3]:.2f} avg60={averages[4]:.2f} avg300={averages[5]:.2f} "
            f"total={full}\n"
        )
    data = "".join(lines).encode()
    assert parse_pressure(data) == (some, full)
    try:
        truncated = parse_pressure(data[:cut])
    except Malformed:
        return
    assert truncated.some_us >= 0


@given(
    pairs=st.dictionaries(st.sampled_from([b"usage_usec", b"nr_periods", b"nr_throttled",
                                           b"throttled_usec", b"x.y_z"]), HUGE),
    cut=st.integers(min_value=0, max_value=200),
)  # fmt: skip
def test_flat_keyed_with_huge_values_and_cuts(pairs, cut):
    data = b"".join(key + b" " + str(value).encode() + b"\n" for key, value in pairs.items())
    if pairs:
        assert parse_flat_keyed(data) == pairs
    try:
        truncated = parse_flat_keyed(data[:cut])
    except Malformed:
        return
    assert all(value >= 0 for value in truncated.values())


_COUNTER = st.integers(min_value=0, max_value=50)
_PSI = st.one_of(st.none(), st.builds(Pressure, _COUNTER, st.one_of(st.none(), _COUNTER)))
# Every field drawn as a kernel writes it (`st.builds` would also draw the optional quota
# and period with any integer, negative ones included: no cpu.max holds those).
_QUOTA = st.one_of(st.none(), st.integers(1_000_000, 100_000_000))  # cpu.max's quota, ns
_PERIOD = st.one_of(st.none(), st.integers(1_000_000, 1_000_000_000))  # its period, ns
_BANDWIDTH = st.one_of(
    st.none(),
    st.lists(
        st.builds(
            Bandwidth,
            path=st.sampled_from([b"", b"/a", b"/b"]),
            inode=st.integers(1, 2),
            periods=_COUNTER,
            throttled_periods=_COUNTER,
            throttled_ns=_COUNTER,
            quota_ns=_QUOTA,
            period_ns=_PERIOD,
        ),
        max_size=3,
        unique_by=lambda b: b.path,
    ).map(tuple),
)
_CGROUP_READING = st.builds(
    CgroupReading,
    st.sampled_from([(("v2", 1),), (("v2", 2),), (("cpu", 1), ("cpuacct", 1))]),
    st.one_of(st.none(), _COUNTER),
    st.tuples(_PSI, _PSI, _PSI),
    _BANDWIDTH,
)


@settings(max_examples=300)
@given(passes=st.lists(st.dictionaries(st.sampled_from("ab"), _CGROUP_READING), max_size=8))
def test_cgroup_guard_on_random_pass_sequences(passes):
    tracker = CgroupTracker()
    previous: dict = {}
    for readings in passes:
        outcome = tracker.advance(readings)
        assert sum(outcome.refused.values()) + len(outcome.deltas) == len(readings)
        for group, delta in outcome.deltas.items():
            old, new = previous[group], readings[group]
            assert old.identity == new.identity  # never across a recreated cgroup
            values = delta.as_dict()
            assert all(v is None or v >= 0 for v in values.values())
            if new.usage_ns is not None and old.usage_ns is not None:
                assert values["cgroup_cpu_nanos"] == new.usage_ns - old.usage_ns
        previous = dict(readings)
