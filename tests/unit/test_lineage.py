"""Lineage (collector/lineage.py): a task born and gone counts in its nearest ancestor's group,
each ancestor a holder of the PID its child names whose life fits the child's."""

from __future__ import annotations

import pytest

from collector.lineage import MAX_DEPTH, PENDING, Life, ancestor_cgroup, parent_in

S = 1_000_000_000


def life(began: float, gone: float | None, cgroup: bytes | None = None, ppid: int = 0,
         window: float = 0.0) -> Life:  # fmt: skip
    """A life begun at `began` s (within `window` s before it) and gone at `gone` s (None:
    alive)."""
    start, spread = int(began * S), int(window * S)
    end = None if gone is None else int(gone * S)
    return Life(start - spread, start, None if end is None else end - spread, end, cgroup, ppid)


CHILD = life(10.0, 12.0, ppid=42)


@pytest.mark.parametrize(
    ("holder", "fits"),
    [
        (life(5.0, None, b"a"), True),  # alive, begun before: the parent
        (life(5.0, 13.0), True),  # gone after the child
        (life(5.0, 12.0), True),  # gone as the child was
        (life(5.0, 11.9), False),  # gone before the child: no parent at its exit
        (life(10.5, None, b"b"), False),  # begun after the child: a PID taken again
        (life(10.0, None, b"c"), True),  # the same instant as far as the source knows
        (life(10.05, None, b"d", window=0.1), True),  # a tick's window meets the child's start
    ],
)
def test_a_holder_is_the_parent_only_where_its_life_fits_the_childs(holder, fits):
    assert (parent_in([holder], CHILD) is holder) is fits


def test_of_holders_that_fit_the_latest_begun_and_its_cgroup_from_a_reading_of_it():
    older = life(1.0, 11.95)
    latest = life(5.0, 13.0, ppid=7)  # from its record: no cgroup
    reading = life(5.0, None, b"pod", window=0.01)  # the same process, read by a pass
    assert parent_in([older, latest], CHILD) is latest
    assert parent_in([older, latest, reading], CHILD) is reading
    elsewhere = life(4.0, None, b"other", window=0.01)  # another start: not that process
    assert parent_in([latest, elsewhere], CHILD) is latest


def sources_of(table: dict[int, list[Life]]):
    return lambda pid: [table.get(pid, [])]


def test_a_chain_of_short_lived_parents_is_followed_to_one_a_pass_read():
    """cc1 (its record) ← gcc (its record) ← make (read by a pass): make's cgroup."""
    cc1 = life(10.0, 12.0, ppid=30)
    table = {
        30: [life(9.0, 12.5, ppid=20)],  # gcc
        20: [life(1.0, None, b"/pod/make")],  # make
    }
    assert ancestor_cgroup(cc1, sources_of(table)) == b"/pod/make"


def test_an_ancestor_not_known_is_pending_init_and_no_parent_are_none():
    assert ancestor_cgroup(life(10.0, 12.0, ppid=99), sources_of({})) is PENDING
    assert ancestor_cgroup(life(10.0, 12.0, ppid=1), sources_of({})) is None
    assert ancestor_cgroup(life(10.0, 12.0, ppid=0), sources_of({})) is None
    reaped = {30: [life(9.0, 12.5, ppid=1)]}  # a parent that init reaped
    assert ancestor_cgroup(life(10.0, 12.0, ppid=30), sources_of(reaped)) is None


def test_a_reused_pid_in_the_chain_is_never_followed():
    """gcc's PID taken again by a process of another group after the child began: the chain
    stops there (pending its own record), never in the newer holder's group."""
    table = {30: [life(11.0, None, b"/victim")]}
    assert ancestor_cgroup(life(10.0, 12.0, ppid=30), sources_of(table)) is PENDING


def test_sources_are_asked_in_order_the_first_that_fits_answers():
    asked = []

    def sources(pid):
        asked.append("records")
        yield [life(11.0, None, b"/late")]  # does not fit
        asked.append("proc")
        yield [life(1.0, None, b"/proc-now")]
        asked.append("held")
        yield [life(1.0, None, b"/held")]

    assert ancestor_cgroup(life(10.0, 12.0, ppid=5), sources) == b"/proc-now"
    assert asked == ["records", "proc"]


def test_a_chain_longer_than_the_bound_or_a_loop_ends_unplaced():
    loop = {5: [life(1.0, 13.0, ppid=6)], 6: [life(1.0, 13.0, ppid=5)]}
    assert ancestor_cgroup(life(10.0, 12.0, ppid=5), sources_of(loop)) is None
    chain = {pid: [life(1.0, 13.0, ppid=pid + 1)] for pid in range(2, MAX_DEPTH + 3)}
    assert ancestor_cgroup(life(10.0, 12.0, ppid=2), sources_of(chain)) is None
