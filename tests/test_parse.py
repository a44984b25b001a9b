"""The pure parsers, on literal bytes of the files the kernel writes."""

import pytest

from collector.model import CgroupLine, IOBytes, Malformed, SchedStat, Stat, Switches
from collector.parse import (
    parse_cgroup,
    parse_io,
    parse_schedstat,
    parse_start_ticks,
    parse_stat,
    parse_status_switches,
)

# Fields after comm of a real line: state ... majflt=7 (12) utime=56 (14) stime=3 (15)
# num_threads=4 (20) starttime=5272 (22) rss=393 (24).
TAIL = (
    b"R 1731 1731 1077 0 -1 4194304 98 0 7 0 56 3 0 0 20 0 4 0 5272 3133440 393 "
    b"18446744073709551615 94219643420672 94219643440553 140725900552368 0 0 0 0 0 0 0 0 "
    b"0 17 0 0 0 0 0 0 94219643456560 94219643458176 94220309131264 140725900561122 "
    b"140725900561142 140725900561142 140725900562411 0\n"
)


@pytest.mark.parametrize(
    ("comm_bytes", "comm"),
    [
        (b"cat", "cat"),
        (b"a) (b", "a) (b"),
        (b")", ")"),
        (b"(", "("),
        (b"x y z", "x y z"),
        (b"", ""),
        (b") 1 2 3 (", ") 1 2 3 ("),
        (b"caf\xc3\xa9", "café"),
        (b"bad\xff\xfe", "bad\\xff\\xfe"),
    ],
)
def test_stat_counts_fields_from_the_last_paren(comm_bytes, comm):
    stat = parse_stat(b"1735 (" + comm_bytes + b") " + TAIL)
    assert stat == Stat(
        pid=1735,
        comm=comm,
        state="R",
        num_threads=4,
        start_ticks=5272,
        utime_ticks=56,
        stime_ticks=3,
        major_faults=7,
        rss_pages=393,
    )


def test_stat_start_ticks_alone():
    assert parse_start_ticks(b"1736 (a) (b) " + TAIL) == 5272


def test_stat_huge_counters_are_exact():
    big = 2**64 - 1
    tail = TAIL.replace(b" 56 3 ", f" {big} 3 ".encode(), 1)
    assert parse_stat(b"9 (x) " + tail).utime_ticks == big


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"1735 cat R 1 2 3",
        b"1735 (cat R 1 2 3",
        b"1735 (cat) R 1 2 3\n",
        b"x (cat) " + TAIL,
        b"1735 (cat) " + TAIL.replace(b" 56 ", b" -56 ", 1),
        b"1735 (cat) " + TAIL.replace(b" 5272 ", b" 52x2 ", 1),
        b")1735 (cat " + TAIL,
    ],
)
def test_stat_malformed_names_the_file_and_text(data):
    with pytest.raises(Malformed) as caught:
        parse_stat(data)
    assert caught.value.what == "stat"
    assert "malformed stat" in str(caught.value)


def test_schedstat():
    assert parse_schedstat(b"567486406 261723 18\n") == SchedStat(567486406, 261723, 18)


@pytest.mark.parametrize("data", [b"", b"1 2\n", b"1 2 3 4\n", b"1 -2 3\n", b"a b c\n"])
def test_schedstat_malformed(data):
    with pytest.raises(Malformed):
        parse_schedstat(data)


STATUS_FULL = b"""Name:\tpython3
Umask:\t0022
State:\tS (sleeping)
Tgid:\t1077
Pid:\t1078
Threads:\t3
voluntary_ctxt_switches:\t1502
nonvoluntary_ctxt_switches:\t31
"""

STATUS_OTHER_OPTIONAL_LINES = b"""Name:\tkworker/0:1
State:\tI (idle)
Tgid:\t7
Ngid:\t0
Pid:\t7
Seccomp:\t2
Seccomp_filters:\t1
Speculation_Store_Bypass:\tthread vulnerable
SpeculationIndirectBranch:\tconditional enabled
Cpus_allowed_list:\t0-1
Mems_allowed_list:\t0
x86_Thread_features:\t
x86_Thread_features_locked:\t
voluntary_ctxt_switches:\t0
nonvoluntary_ctxt_switches:\t0
"""


def test_status_switches():
    assert parse_status_switches(STATUS_FULL) == Switches(1502, 31)


def test_status_with_other_optional_lines_and_empty_values():
    assert parse_status_switches(STATUS_OTHER_OPTIONAL_LINES) == Switches(0, 0)


def test_status_without_switch_lines_is_malformed():
    without = b"".join(
        line for line in STATUS_FULL.splitlines(keepends=True) if b"ctxt" not in line
    )
    with pytest.raises(Malformed):
        parse_status_switches(without)


def test_status_garbage_value_is_malformed():
    with pytest.raises(Malformed):
        parse_status_switches(STATUS_FULL.replace(b"1502", b"15x2"))


IO = b"""rchar: 6976
wchar: 123
syscr: 10
syscw: 1
read_bytes: 4096
write_bytes: 8388608
cancelled_write_bytes: 777
"""


def test_io_reads_storage_bytes_never_rchar_or_cancelled():
    assert parse_io(IO) == IOBytes(read_bytes=4096, write_bytes=8388608)


def test_io_missing_line_is_malformed():
    with pytest.raises(Malformed):
        parse_io(IO.replace(b"write_bytes: 8388608\n", b""))


def test_cgroup_v2_and_v1():
    text = b"12:cpu,cpuacct:/kubepods/burstable/podx/abc\n1:name=systemd:/a:b:c\n0::/user.slice\n"
    assert parse_cgroup(text) == (
        CgroupLine(12, ("cpu", "cpuacct"), "/kubepods/burstable/podx/abc"),
        CgroupLine(1, ("name=systemd",), "/a:b:c"),
        CgroupLine(0, (), "/user.slice"),
    )


@pytest.mark.parametrize("data", [b"", b"\n", b"0:/\n", b"x::/\n", b"0::relative\n"])
def test_cgroup_malformed(data):
    with pytest.raises(Malformed):
        parse_cgroup(data)


def test_keys_inside_longer_keys_are_not_taken_for_them():
    io = b"cancelled_write_bytes: 5\nrchar: 1\nwrite_bytes: 7\nread_bytes: 3\n"
    assert parse_io(io) == IOBytes(read_bytes=3, write_bytes=7)
    status = b"nonvoluntary_ctxt_switches:\t9\nvoluntary_ctxt_switches:\t4"
    assert parse_status_switches(status) == Switches(voluntary=4, nonvoluntary=9)


def test_a_key_only_inside_a_longer_key_is_missing():
    with pytest.raises(Malformed):
        parse_io(b"cancelled_write_bytes: 5\nread_bytes: 3\n")
