"""Property-based tests: random and truncated bytes for every parser, random pass
sequences for the guard, random files for a whole pass. Nothing raises but the one
error type, a refused delta is never emitted, an emitted delta is never negative."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.groups import classify
from collector.model import FIELD_NAMES, Malformed, ProcessReading, ThreadReading
from collector.parse import (
    parse_cgroup,
    parse_io,
    parse_schedstat,
    parse_start_ticks,
    parse_stat,
    parse_status_switches,
)
from collector.procfs import ProcFS
from collector.reading import Reader
from collector.tracker import Tracker

PARSERS = [parse_stat, parse_start_ticks, parse_schedstat, parse_status_switches, parse_io,
           parse_cgroup]  # fmt: skip
HUGE = st.integers(min_value=0, max_value=2**128)


def _natural_fields(value) -> list[int]:
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
            assert len(readings.readings) + readings.vanished + readings.unreadable == 2
    finally:
        shutil.rmtree(root)
