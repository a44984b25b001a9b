"""The one table of the interval fields (collector/fieldtable.py) against what says it again:
the model's `Fields` and its order, the spec's list, docs/reference.md §3, and the kernel's
`struct taskstats` at its own offsets, read by both of the listener's ways."""

from __future__ import annotations

import struct

import pytest

from collector.exits import ExitListener, parse_stats
from collector.fieldtable import FIELDS, Field, markdown_table
from collector.model import FIELD_NAMES, Fields
from tests import spec
from tests.exitrecords import FAMILY, Netlink, exit_message, taskstats
from tests.tools.fieldsdoc import REFERENCE, documented

# include/uapi/linux/taskstats.h, x86-64 (offsetof): the members an interval field is read
# from, written here again as the kernel lays them out, not taken from collector/exits.py
OFFSETS = {
    "cpu_delay_total": 24,
    "cpu_run_virtual_total": 72,
    "ac_utime": 152,
    "ac_stime": 160,
    "ac_majflt": 176,
    "read_bytes": 248,
    "write_bytes": 256,
    "nvcsw": 272,
    "nivcsw": 280,
}
IN_RECORDS = [field for field in FIELDS if field.taskstats]


def test_the_table_is_the_models_fields_in_their_order():
    """`Fields` is built by position on the hot path: the table's order is its order, and
    both are the spec's (tests/spec.py, written apart from the code)."""
    assert tuple(field.name for field in FIELDS) == FIELD_NAMES == tuple(spec.FIELDS)


def test_fields_add_sums_every_field():
    ones = Fields(**dict.fromkeys(FIELD_NAMES, 1))
    total = Fields(**{name: k for k, name in enumerate(FIELD_NAMES)})
    total.add(ones)
    assert total.as_dict() == {name: k + 1 for k, name in enumerate(FIELD_NAMES)}


def test_the_references_table_is_the_tables():
    """Else `python -m tests.tools.fieldsdoc` writes it."""
    text = REFERENCE.read_text()
    start, end = documented(text)
    assert text[start:end] == markdown_table()


def test_every_field_has_its_words():
    for field in FIELDS:
        assert field.help and field.meaning and field.column.isupper(), field.name
        assert field.unit in ("ns", "count", "bytes"), field.name
        assert field.name.endswith("_nanos") == (field.unit == "ns"), field.name
    assert len({field.column for field in FIELDS}) == len(FIELDS)


def a_record(field: Field, value: int, *, last: bool) -> bytes:
    """A thread's record (pid 11 of process 10, or the last task of process 11), every
    counter 0 but the field's member, set at the kernel's offset."""
    assert field.taskstats is not None
    data = bytearray(
        taskstats(11, 10 if not last else 11, last=last, lived_us=10, group_lived_us=10)
    )
    struct.pack_into("=Q", data, OFFSETS[field.taskstats], value)
    return bytes(data)


def counters_of(source: object) -> dict[str | None, int]:
    return {f.record: getattr(source, f.record or "") for f in IN_RECORDS}


@pytest.mark.parametrize("field", IN_RECORDS, ids=[f.name for f in IN_RECORDS])
def test_each_member_is_read_where_the_kernel_puts_it_by_every_way(field):
    """The same value, in the table's record attribute, whichever way a record is taken:
    parsed (`parse_stats`: those that came while registering), taken off the socket and
    queued for a pass (a process's last task), or folded as it came (`Fold`: a thread no
    pass read)."""
    value = 123_456_789
    expected = {f.record: value if f is field else 0 for f in IN_RECORDS}
    assert counters_of(parse_stats(a_record(field, value, last=True), 10**12)) == expected

    sock = Netlink()
    sock.settimeout(0.0)
    listener = ExitListener(clock=lambda: 10**12, sock=sock, family=FAMILY)
    try:
        listener.pass_read(0)  # a pass read every process at 0: later tasks are folded
        sock.send(exit_message(a_record(field, value, last=True), 11))
        sock.send(exit_message(a_record(field, value, last=False), 11))
        assert listener._drain() == 2
        (queued,), (fold,) = listener.take()
        assert counters_of(queued) == expected and counters_of(fold) == expected
    finally:
        listener.close()
