"""Per-group sums of a pass (`group_pass`), and running totals: accumulated from the
guarded deltas, forgotten after a group is gone."""

from collector.aggregate import Totals, group_pass
from collector.groups import Group, Grouper
from collector.model import CgroupFields, Fields
from collector.podnames import PodNames
from collector.readings import Carried, Footprint
from collector.tracker import CarriedDelta, ProcessDelta, Tracker
from tests.unit.test_groups import CID, UID_, v2
from tests.unit.test_tracker import HZ, SEC, proc

POD = Group("pod", (("namespace", "a"), ("pod", "b"), ("uid", "u"), ("qos", "burstable")))
HOST = Group("cgroup", (("cgroup", "/system.slice"),))


def test_totals_accumulate_and_are_forgotten_three_passes_after_the_last_sighting():
    totals = Totals(forget_after=3)
    totals.add_pass(
        {POD: Fields(processes=1, on_cpu_nanos=5), HOST: Fields(processes=1, read_bytes=9)},
        [POD, HOST],
    )
    totals.add_pass({POD: Fields(processes=1, on_cpu_nanos=7)}, [POD])
    assert totals.snapshot()[POD]["on_cpu_nanos"] == 12
    assert totals.snapshot()[HOST]["read_bytes"] == 9
    assert "processes" not in totals.snapshot()[POD]  # no `_total` for processes
    # seen with no delta (its process is idle or new): kept, unchanged
    totals.add_pass({}, [POD])
    assert totals.snapshot()[POD]["on_cpu_nanos"] == 12
    assert HOST in totals.snapshot()  # last seen two passes ago
    totals.add_pass({}, [POD])
    assert HOST not in totals.snapshot()  # three passes after its last sighting
    # gone: kept for two more passes, forgotten at the third
    totals.add_pass({}, [])
    totals.add_pass({}, [])
    assert POD in totals.snapshot()
    totals.add_pass({}, [])
    assert POD not in totals.snapshot()
    # back again: it starts from zero, a counter reset that rate() handles
    totals.add_pass({POD: Fields(processes=1, on_cpu_nanos=1)}, [POD])
    assert totals.snapshot()[POD]["on_cpu_nanos"] == 1


def test_a_delta_of_a_carried_process_reaches_its_group_by_its_cgroup_file():
    """A carried process has no footprint of its own (its block has), yet the guard may
    give it a `ProcessDelta`: a reading carried that is not the one the guard cached (a
    pass failed after the reader took it) is guarded as read. Its delta is summed into
    the group of its cgroup file, as a read process's is, never dropped."""
    grouper = Grouper(PodNames("/nonexistent", "/nonexistent"))
    idle = proc(10, 5_000, 100 * SEC)._replace(cgroup=b"0::/system.slice/idle.service\n")
    read = proc(20, 5_000, 100 * SEC)._replace(cgroup=b"0::/system.slice/busy.service\n")
    moved = Fields(processes=1, observed_nanos=10 * SEC, cpu_user_nanos=7)
    grouped = group_pass(
        [ProcessDelta(idle, moved, False), ProcessDelta(read, Fields(processes=1), False)],
        [Footprint(20, read.cgroup, 1, 0)],
        grouper,
        [CarriedDelta(Carried(idle.cgroup, {10: idle}, 1, 0), {}, 0)],  # 10 refused
    )
    idle_group = grouper.group_of(idle.cgroup)
    assert grouped.intervals[idle_group] == moved
    assert grouped.footprints[idle_group].processes == 1
    assert grouped.intervals[grouper.group_of(read.cgroup)].processes == 1


def test_carried_blocks_add_their_processes_and_observed_time_to_their_group():
    """A block's footprint sums and its deltas (processes, observed time: nothing else of
    it moved) are summed into its cgroup's group, beside a process read in that group."""
    grouper = Grouper(PodNames("/nonexistent", "/nonexistent"))
    cgroup = b"0::/system.slice/idle.service\n"
    idle = [proc(pid, 5_000, 100 * SEC)._replace(cgroup=cgroup) for pid in (10, 11)]
    read = proc(12, 5_000, 100 * SEC)._replace(cgroup=cgroup)
    block = Carried(cgroup, {r.pid: r for r in idle}, 3, 8192)
    grouped = group_pass(
        [ProcessDelta(read, Fields(processes=1, observed_nanos=10 * SEC, on_cpu_nanos=3), False)],
        [Footprint(12, cgroup, 4, 100)],
        grouper,
        [CarriedDelta(block, block.readings, 2 * 10 * SEC)],
    )
    group = grouper.group_of(cgroup)
    assert grouped.intervals == {
        group: Fields(processes=3, observed_nanos=3 * 10 * SEC, on_cpu_nanos=3)
    }
    footprint = grouped.footprints[group]
    assert (footprint.processes, footprint.threads, footprint.rss_bytes) == (3, 7, 8292)


def test_a_block_the_guard_accepted_none_of_counts_its_footprint_and_no_interval():
    """Every member of a block is present on the node, accepted as a carry or not: its
    footprint counts them all. A block of which the guard accepted none adds no interval
    (no group of 0 processes); its group is known to the processes view by its cgroup
    file, as any carried block's is, and a block of a group left out is not."""
    grouper = Grouper(PodNames("/nonexistent", "/nonexistent"))
    cgroup = b"0::/system.slice/idle.service\n"
    idle = proc(10, 5_000, 100 * SEC)._replace(cgroup=cgroup)
    left_out = proc(11, 5_000, 100 * SEC)._replace(cgroup=b"garbage\n")
    grouped = group_pass(
        [],
        [],
        grouper,
        [
            CarriedDelta(Carried(cgroup, {10: idle}, 2, 4096), {}, 0),
            CarriedDelta(Carried(left_out.cgroup, {11: left_out}, 1, 0), {11: left_out}, SEC),
        ],
    )
    group = grouper.group_of(cgroup)
    assert grouped.intervals == {}
    footprint = grouped.footprints[group]
    assert (footprint.processes, footprint.threads, footprint.rss_bytes) == (1, 2, 4096)
    assert grouped.group_of_cgroup == {cgroup: group}


def test_a_process_read_with_a_malformed_cgroup_file_is_counted_once_and_left_out():
    """A process read whose cgroup file does not parse is named among the malformed and
    left out of every sum; its delta is dropped with it, its cgroup file parsed once (not
    again as if it were carried), and the pass goes on."""
    grouper = Grouper(PodNames("/nonexistent", "/nonexistent"))
    bad = proc(10, 5_000, 100 * SEC)._replace(cgroup=b"garbage\n")
    good = proc(20, 5_000, 100 * SEC)._replace(cgroup=b"0::/system.slice/busy.service\n")
    parsed: list[bytes] = []
    group_of = grouper.group_of

    def counting(cgroup: bytes):
        parsed.append(cgroup)
        return group_of(cgroup)

    grouper.group_of = counting
    grouped = group_pass(
        [ProcessDelta(bad, Fields(processes=1, on_cpu_nanos=5), False),
         ProcessDelta(good, Fields(processes=1, on_cpu_nanos=7), False)],
        [Footprint(10, bad.cgroup, 1, 0), Footprint(20, good.cgroup, 1, 0)],
        grouper,
    )  # fmt: skip
    assert grouped.malformed_pids == {10}
    assert grouped.intervals == {group_of(good.cgroup): Fields(processes=1, on_cpu_nanos=7)}
    assert parsed.count(bad.cgroup) == 1


def test_by_default_totals_are_forgotten_three_passes_after_the_last_sighting():
    """docs/reference.md §5: a group's `_total` series are gone three passes after its
    last process; that is `Totals()`'s own default, the one the engine is built with."""
    totals = Totals()
    totals.add_pass({POD: Fields(processes=1, on_cpu_nanos=5)}, [POD])
    totals.add_pass({}, [])
    totals.add_pass({}, [])
    assert totals.snapshot()[POD]["on_cpu_nanos"] == 5  # two passes gone: still there
    totals.add_pass({}, [])
    assert POD not in totals.snapshot()


def test_a_group_seen_but_never_given_a_delta_is_forgotten_like_any_other():
    """A group every pass saw without a delta (its processes first seen, or its cgroup
    read and refused) has no totals: forgetting it three passes after its last sighting
    lets go of the sighting alone, and the pass that does so completes (no totals to
    drop is not an error); nothing of it is ever in the snapshot."""
    totals = Totals(forget_after=3)
    totals.add_pass({}, [HOST])
    totals.add_pass({POD: Fields(processes=1, on_cpu_nanos=5)}, [HOST, POD])
    for _ in range(3):
        totals.add_pass({}, [])
        assert HOST not in totals.snapshot()
    assert totals.snapshot() == {}
    totals.add_pass({}, [])  # and the passes after it go on
    assert totals.snapshot() == {}


def test_a_gone_groups_cgroup_totals_are_forgotten_with_it():
    """A deleted pod's cgroup counters (§7) go as its process counters do: three passes
    after the last pass that saw it (its processes or its cgroup), no series of it is
    left, whether a process of it ever contributed or its cgroup alone gave deltas."""
    totals = Totals(forget_after=3)
    usage = CgroupFields(cgroup_cpu_nanos=7, cpu_periods=3)
    totals.add_pass(
        {POD: Fields(processes=1, on_cpu_nanos=5)}, [POD, HOST], {POD: usage, HOST: usage}
    )
    assert totals.snapshot()[POD]["cgroup_cpu_nanos"] == 7
    assert totals.snapshot()[HOST] == {"cgroup_cpu_nanos": 7, "cpu_periods": 3}
    totals.add_pass({}, [])
    totals.add_pass({}, [])
    assert {POD, HOST} <= totals.snapshot().keys()
    totals.add_pass({}, [])
    assert totals.snapshot() == {}


def test_a_malformed_cgroup_file_hides_no_process_after_it():
    """A process whose cgroup file does not parse is left out alone: every process after
    it in the pass is still placed, its footprint summed into its group."""
    grouper = Grouper(PodNames("/nonexistent", "/nonexistent"))
    cgroup = b"0::/system.slice/busy.service\n"
    grouped = group_pass(
        [],
        [Footprint(10, b"garbage\n", 1, 0), Footprint(20, cgroup, 3, 4096),
         Footprint(21, cgroup, 1, 100)],
        grouper,
    )  # fmt: skip
    group = grouper.group_of(cgroup)
    assert grouped.malformed_pids == {10}
    footprint = grouped.footprints[group]
    assert (footprint.processes, footprint.threads, footprint.rss_bytes) == (2, 4, 4196)
    assert grouped.group_of_pid == {10: None, 20: group, 21: group}


def test_a_block_accepted_in_part_counts_each_of_its_processes_once():
    """A carried block the guard accepted in part: its accepted members are counted by
    the block, its refused one by its own delta (guarded as read), so the group's
    `processes` is the block's size, never the block's size plus the refused ones, and
    its observed time is each member's once."""
    grouper = Grouper(PodNames("/nonexistent", "/nonexistent"))
    cgroup = b"0::/system.slice/idle.service\n"

    def reading(pid, at, user):
        return proc(pid, 5_000, at, user=user)._replace(cgroup=cgroup)

    tracker = Tracker(HZ)
    tracker.advance([reading(10, 100 * SEC, 1), reading(11, 100 * SEC, 1)], 100 * SEC)
    cached = [reading(10, 200 * SEC, 2), reading(11, 200 * SEC, 2)]
    tracker.advance(cached, 200 * SEC)
    # 10 carried as cached; 11 carried with a reading the guard never had (its cached one
    # is last pass's): refused as a carry, guarded as read
    moved = reading(11, 250 * SEC, 4)
    block = Carried(cgroup, {10: cached[0], 11: moved}, 2, 0)
    advance = tracker.advance([], 300 * SEC, [block], 300 * SEC)
    assert [dict(d.readings) for d in advance.carried] == [{10: cached[0]}]
    assert [d.reading.pid for d in advance.deltas] == [11]
    grouped = group_pass(advance.deltas, [], grouper, advance.carried)
    interval = grouped.intervals[grouper.group_of(cgroup)]
    assert interval.processes == 2
    assert interval.observed_nanos == 100 * SEC + 50 * SEC
    assert interval.cpu_user_nanos == 2 * 10_000_000
    assert grouped.footprints[grouper.group_of(cgroup)].processes == 2


def test_a_carried_block_of_a_group_left_out_hides_no_block_after_it():
    """Under `--pods-only` a carried block of a non-pod cgroup is left out alone: a pod's
    block after it in the pass is still summed, its processes, observed time and
    footprint."""
    grouper = Grouper(PodNames("/nonexistent", "/nonexistent"), pods_only=True)
    host = proc(10, 5_000, 100 * SEC)._replace(cgroup=b"0::/system.slice/idle.service\n")
    pod_dir = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
    pod = proc(20, 5_000, 100 * SEC)._replace(cgroup=v2(f"{pod_dir}/cri-containerd-{CID}.scope"))
    blocks = [Carried(r.cgroup, {r.pid: r}, 2, 4096) for r in (host, pod)]
    grouped = group_pass([], [], grouper, [CarriedDelta(b, b.readings, 10 * SEC) for b in blocks])
    group = grouper.group_of(pod.cgroup)
    assert grouped.intervals == {group: Fields(processes=1, observed_nanos=10 * SEC)}
    footprint = grouped.footprints[group]
    assert (footprint.processes, footprint.threads, footprint.rss_bytes) == (1, 2, 4096)
    assert grouped.group_of_cgroup == {pod.cgroup: group}
