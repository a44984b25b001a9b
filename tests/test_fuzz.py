"""Property-based tests: random and truncated bytes for every parser, random pass
sequences for the guard, random files for a whole pass. Nothing raises but the one
error type, a refused delta is never emitted, an emitted delta is never negative."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.cgroupguard import CgroupTracker
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
from collector.tracker import Tracker

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


COUNTER = st.integers(min_value=0, max_value=2**70)


@st.composite
def thread_reading(draw, tid):
    return ThreadReading(
        tid, draw(st.integers(0, 60)), draw(COUNTER), draw(COUNTER), draw(COUNTER),
        draw(COUNTER), draw(COUNTER), draw(COUNTER), draw(COUNTER),
    )  # fmt: skip


@st.composite
def process_reading(draw, pid, at_ns):
    tids = draw(st.sets(st.integers(pid, pid + 5), min_size=1, max_size=4))
    return ProcessReading(
        pid, "p", draw(st.integers(0, 60)), at_ns, draw(COUNTER), draw(COUNTER),
        draw(COUNTER), 0, b"0::/\n", tuple(draw(thread_reading(t)) for t in sorted(tids)),
    )  # fmt: skip


@st.composite
def pass_sequence(draw):
    passes = []
    for number in range(draw(st.integers(1, 6))):
        at = (number + 1) * 10**9  # 1 s apart; ticks are 10 ms, starts 0..60 ticks
        pids = draw(st.sets(st.sampled_from([10, 20, 30]), max_size=3))
        passes.append((at - 5, [draw(process_reading(pid, at)) for pid in sorted(pids)]))
    return passes


def fell(new, old, names) -> bool:
    return any(getattr(new, n) < getattr(old, n) for n in names)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(passes=pass_sequence())
def test_guard_never_emits_a_refused_or_negative_delta(passes):
    tracker = Tracker(hz=100)
    previous: dict[int, ProcessReading] = {}
    for listed_at, readings in passes:
        result = tracker.advance(readings, listed_at)
        for delta in result.deltas:
            assert all(getattr(delta.fields, name) >= 0 for name in FIELD_NAMES), delta
            reading, old = delta.reading, previous.get(delta.reading.pid)
            if not delta.born:
                assert old is not None and old.start_ticks == reading.start_ticks
                assert not fell(reading, old, ("utime_ticks", "stime_ticks", "major_faults"))
        emitted = {d.reading.pid for d in result.deltas}
        for reading in readings:
            old = previous.get(reading.pid)
            same = old is not None and old.start_ticks == reading.start_ticks
            if same and fell(reading, old, ("utime_ticks", "stime_ticks", "major_faults")):
                assert reading.pid not in emitted
        refused = sum(result.refused.values())
        assert refused + len(result.deltas) == len(readings)
        previous = {r.pid: r for r in readings}


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
_BANDWIDTH = st.one_of(
    st.none(),
    st.lists(
        st.builds(
            Bandwidth,
            st.sampled_from([b"", b"/a", b"/b"]),
            st.integers(1, 2),
            _COUNTER,
            _COUNTER,
            _COUNTER,
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
