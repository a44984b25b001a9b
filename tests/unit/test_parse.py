"""The pure parsers, on literal bytes of the files the kernel writes."""

from contextlib import suppress

import pytest

from collector.model import CgroupLine, IOBytes, Malformed, Pressure, SchedStat, Stat, Switches
from collector.parse import (
    parse_cfs_quota,
    parse_cgroup,
    parse_cpu_max,
    parse_flat_keyed,
    parse_io,
    parse_pressure,
    parse_schedstat,
    parse_single_value,
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


# Fields 3 to 21 of TAIL: a `stat` cut just before field 22, the start time.
BEFORE_START = b" ".join(TAIL.split()[:19])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"1736 a R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22\n",
        b"1735 (cat) R 1 2 3\n",
        b"1736 (a) " + BEFORE_START + b"\n",
        b"1736 (a) " + BEFORE_START + b" 52x2 1 2\n",
    ],
    ids=["empty", "no paren", "short", "cut before the start", "start not a number"],
)
def test_stat_start_ticks_malformed_names_the_file(data):
    """A thread's `stat` that holds no start time, however it is cut, is refused as
    `Malformed` (a process unreadable, the pass goes on), never another error (which would
    fail the whole pass)."""
    with pytest.raises(Malformed) as caught:
        parse_start_ticks(data)
    assert caught.value.what == "stat"


def test_stat_start_ticks_needs_no_field_after_it():
    """Only field 22 is needed: a `stat` that ends with it gives it."""
    assert parse_start_ticks(b"1736 (a) " + BEFORE_START + b" 5272\n") == 5272


def test_stat_state_that_is_not_ascii_is_replaced_not_an_error():
    """The state is one ASCII letter; another byte there is replaced, the counters read."""
    stat = parse_stat(b"1735 (cat) \xff" + TAIL[1:])
    assert stat.state == "\ufffd" and stat.start_ticks == 5272


def test_cgroup_controllers_that_are_not_utf8_are_replaced_not_an_error():
    """Controller names are the kernel's (ASCII); bytes that are not UTF-8 there are
    replaced, never an error, and the path is kept as it is."""
    assert parse_cgroup(b"3:c\xffu:/x\n") == (CgroupLine(3, ("c\ufffdu",), "/x"),)


PSI_SOME = b"some avg10=0.12 avg60=1.50 avg300=12.00 total=5\n"
PSI_FULL = b"full avg10=0.00 avg60=0.25 avg300=3.00 total=3\n"


def test_pressure_in_the_kernels_layout():
    assert parse_pressure(PSI_SOME + PSI_FULL) == Pressure(5, 3)
    assert parse_pressure(PSI_SOME) == Pressure(5, None)  # a kernel without `full`


@pytest.mark.parametrize(
    ("data", "totals"),
    [
        (PSI_SOME + PSI_FULL.rstrip(b"\n"), (5, 3)),
        (PSI_SOME.rstrip(b"\n"), (5, None)),
        (b"some avg10=1.5 avg60=0.250 avg300=0 total=5\n", (5, None)),
        (PSI_FULL + b"\n" + PSI_SOME, (5, 3)),
        (b"some total=5\nfull total=3\n", (5, 3)),
    ],
    ids=["no final newline", "some alone, no newline", "other averages", "full first",
         "totals alone"],
)  # fmt: skip
def test_pressure_in_another_layout_is_read_the_general_way(data, totals):
    """A PSI file not in the kernel's exact layout (no final newline, averages of other
    widths, the lines in another order or apart, no averages) is read line by line:
    the totals of `some` and `full`, each by its own key."""
    assert parse_pressure(data) == Pressure(*totals)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\n",
        PSI_FULL,
        b"some avg10=0.00 avg60=0.00 avg300=0.00\n",
        b"some total=x\n",
        b"some total=-5\n",
        b"some\n",
        PSI_SOME + b"other total=7\n",
    ],
    ids=["empty", "blank", "full alone", "no total", "total not a number", "negative",
         "a key alone", "another key"],
)  # fmt: skip
def test_pressure_malformed_names_the_file(data):
    """A PSI file that gives no `some` total, or holds a line that is not `some` or
    `full` with a total, is `Malformed` (that field has no series this pass), never
    another error."""
    with pytest.raises(Malformed) as caught:
        parse_pressure(data, "cpu.pressure")
    assert caught.value.what == "cpu.pressure"


CPU_STAT = {b"usage_usec": 5, b"nr_periods": 2, b"throttled_usec": 0}


@pytest.mark.parametrize(
    ("data", "values"),
    [
        (b"usage_usec 5\nnr_periods 2\nthrottled_usec 0\n", CPU_STAT),
        (b"usage_usec 5\nnr_periods 2\nthrottled_usec 0", CPU_STAT),
        (b"usage_usec 5", {b"usage_usec": 5}),
        (b"usage_usec 5\n\nnr_periods 2\nthrottled_usec 0\n", CPU_STAT),
        (b"usage_usec\t5\nnr_periods  2\nthrottled_usec 0\n", CPU_STAT),
    ],
    ids=["kernel", "no final newline", "one line, no newline", "a blank line", "other spaces"],
)
def test_flat_keyed(data, values):
    """`cpu.stat`: every `key value` line, whatever spaces part them or lines are blank."""
    assert parse_flat_keyed(data) == values


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\n",
        b"usage_usec\n",
        b"usage_usec",
        b"usage_usec 5 6\n",
        b"usage_usec x\n",
        b"usage_usec -5\n",
        b"usage_usec 5\nnr_periods x\n",
        b"usage_usec 5\nnr_periods",
    ],
    ids=["empty", "blank", "a key alone", "a key alone, no newline", "three words",
         "not a number", "negative",
         "a later value not a number", "a later key alone"],
)  # fmt: skip
def test_flat_keyed_malformed_names_the_file(data):
    """A line that is not one key and one number makes the whole file `Malformed` (its
    group's fields from it have no series this pass), never another error."""
    with pytest.raises(Malformed) as caught:
        parse_flat_keyed(data, "cpu.stat")
    assert caught.value.what == "cpu.stat"


# Each parser with a number of 5000 digits where the kernel writes at most 20 (a u64).
_LONG = b"1" * 5000
_TOO_LONG = [
    (parse_stat, b"1735 (cat) " + TAIL.replace(b" 56 ", b" " + _LONG + b" ", 1)),
    (parse_start_ticks, b"1735 (cat) " + TAIL.replace(b" 5272 ", b" " + _LONG + b" ", 1)),
    (parse_schedstat, _LONG + b" 1 1\n"),
    (parse_status_switches, STATUS_FULL.replace(b"1502", _LONG)),
    (parse_io, IO.replace(b"4096", _LONG)),
    (parse_cgroup, _LONG + b"::/\n"),
    (parse_flat_keyed, b"usage_usec " + _LONG + b"\n"),
    (parse_single_value, _LONG + b"\n"),
    (parse_pressure, b"some avg10=0.00 avg60=0.00 avg300=0.00 total=" + _LONG + b"\n"),
    (parse_cpu_max, b"max " + _LONG + b"\n"),
    (parse_cfs_quota, _LONG + b"\n"),
]


@pytest.mark.parametrize(("parse", "data"), _TOO_LONG, ids=[p.__name__ for p, _ in _TOO_LONG])
def test_a_number_too_long_for_int_raises_nothing_but_malformed(parse, data):
    """Every parser raises `Malformed` on anything it cannot read exactly (the module's
    contract): a number longer than `int()` converts (4300 digits) is either read or
    `Malformed`, never a `ValueError` that the pass does not catch."""
    with suppress(Malformed):
        parse(data)


@pytest.mark.parametrize(
    ("parse", "data", "what"),
    [
        (parse_flat_keyed, b"usage_usec 5\n\nnr_periods " + _LONG + b"\n", "cpu.stat"),
        (parse_cpu_max, _LONG + b" 100000\n", "cpu.max"),
    ],
    ids=["flat keyed, read line by line", "cpu.max quota"],
)
def test_a_number_too_long_for_int_where_it_is_read_last_is_malformed_by_name(parse, data, what):
    """The number `int()` refuses (over 4300 digits) on the paths the other cases do not
    reach — a flat keyed file read line by line (a blank line in it), a quota of
    `cpu.max` — is `Malformed` naming its file, never another error."""
    with pytest.raises(Malformed) as caught:
        parse(data)
    assert caught.value.what == what


def test_a_blank_line_in_a_cgroup_file_hides_no_line_after_it():
    """The kernel writes no blank line in `/proc/<pid>/cgroup` (it refuses a cgroup name
    with a LF), but one read is skipped alone, as in `parse_flat_keyed`: every line after
    it is still read."""
    assert parse_cgroup(b"11:cpu:/a\n\n0::/b\n") == (
        CgroupLine(11, ("cpu",), "/a"),
        CgroupLine(0, (), "/b"),
    )
