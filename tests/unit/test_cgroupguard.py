"""The cgroup guard as a table of passes, one row per pass: every rule of docs/reference.md §7."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from collector.cgroupguard import CgroupAdvance, CgroupTracker
from collector.model import Bandwidth, CgroupReading, Pressure
from collector.waits import with_waits

POD = "pod"


class Guarded:
    """The guard, then the one place the causes are formed (`with_waits`), as a pass runs
    them; with no process interval and no node interval, so causes on the kernel's account
    only."""

    def __init__(self) -> None:
        self.guard: CgroupTracker[str] = CgroupTracker()

    def advance(self, readings: dict[str, CgroupReading]) -> CgroupAdvance[str]:
        outcome = self.guard.advance(readings)
        outcome.deltas = with_waits({}, outcome.deltas, outcome.throttled_wall_ns, None)
        return outcome

    @property
    def tracked(self) -> int:
        return self.guard.tracked


def reading(
    usage=None,
    bandwidth=None,
    cpu=None,
    memory=None,
    io=None,
    identity=(("v2", 7),),
) -> CgroupReading:
    return CgroupReading(identity, usage, (cpu, memory, io), bandwidth)


def bw(path: bytes, inode: int, periods: int, throttled: int, ns: int) -> Bandwidth:
    return Bandwidth(path, inode, periods, throttled, ns)


@dataclass
class Row:
    why: str
    readings: dict[str, CgroupReading]
    deltas: dict[str, dict[str, int | None]]
    refused: dict[str, int] = field(default_factory=dict)


PASSES = [
    Row(
        "first sighting: no delta",
        {POD: reading(usage=1000, bandwidth=(bw(b"", 7, 10, 1, 100),), cpu=Pressure(5, 2))},
        {},
        {"first_seen": 1},
    ),
    Row(
        "counters moved: new minus cached; a container made since counts whole; pressure µs→ns",
        {
            POD: reading(
                usage=4000,
                bandwidth=(bw(b"", 7, 15, 1, 100), bw(b"/c1", 8, 3, 3, 900)),
                cpu=Pressure(9, 3),
            )
        },
        {
            POD: {
                "cgroup_cpu_nanos": 3000,
                "cpu_periods": 5 + 3,
                "cpu_throttled_periods": 0 + 3,
                "cpu_throttled_nanos": 0 + 900,
                "cpu_pressure_waiting_nanos": 4000,
                "cpu_pressure_stalled_nanos": 1000,
                "memory_pressure_waiting_nanos": None,
                "io_pressure_stalled_nanos": None,
                # why it waited, from `full` and `some`: the throttled time (no quota
                # read: one run queue at a time) out of `full`, the rest its neighbours'
                "cpu_stalled_throttled_nanos": 900,
                "cpu_stalled_neighbours_nanos": 100,
                "cpu_waiting_own_threads_nanos": 3000,
                "run_delay_neighbours_nanos": None,  # the interval split is not this basis
            }
        },
    ),
    Row(
        "nothing moved: every field it has at 0, the others None",
        {
            POD: reading(
                usage=4000,
                bandwidth=(bw(b"", 7, 15, 1, 100), bw(b"/c1", 8, 3, 3, 900)),
                cpu=Pressure(9, 3),
            )
        },
        {
            POD: {
                "cgroup_cpu_nanos": 0,
                "cpu_periods": 0,
                "cpu_pressure_stalled_nanos": 0,
                "io_pressure_waiting_nanos": None,
                "cpu_stalled_neighbours_nanos": 0,
                "cpu_waiting_own_threads_nanos": 0,
            }
        },
    ),
    Row(
        "a container restarted under the same name (new inode): counted whole",
        {
            POD: reading(
                usage=5000,
                bandwidth=(bw(b"", 7, 16, 1, 100), bw(b"/c1", 9, 2, 2, 50)),
                cpu=Pressure(9, 3),
            )
        },
        {POD: {"cgroup_cpu_nanos": 1000, "cpu_periods": 1 + 2, "cpu_throttled_nanos": 50}},
    ),
    Row(
        "a container's counter fell (same inode): the group's whole delta is dropped",
        {
            POD: reading(
                usage=6000,
                bandwidth=(bw(b"", 7, 17, 1, 100), bw(b"/c1", 9, 1, 2, 50)),
                cpu=Pressure(9, 3),
            )
        },
        {},
        {"counter_fell": 1},
    ),
    Row(
        "usage fell: dropped, never clamped",
        {POD: reading(usage=10, bandwidth=(bw(b"", 7, 18, 1, 100),), cpu=Pressure(9, 3))},
        {},
        {"counter_fell": 1},
    ),
    Row(
        "PSI `some` fell: dropped",
        {POD: reading(usage=20, bandwidth=(bw(b"", 7, 18, 1, 100),), cpu=Pressure(8, 3))},
        {},
        {"counter_fell": 1},
    ),
    Row(
        "the directory was made anew under the same path: no delta",
        {POD: reading(usage=50, identity=(("v2", 70),))},
        {},
        {"recreated": 1},
    ),
    Row(
        "a source that appears (PSI turned on): None for this pass, no error",
        {POD: reading(usage=80, identity=(("v2", 70),), io=Pressure(1, None))},
        {POD: {"cgroup_cpu_nanos": 30, "io_pressure_waiting_nanos": None}},
    ),
    Row(
        "a kernel without PSI `full`: stalled is None, waiting is counted",
        {POD: reading(usage=80, identity=(("v2", 70),), io=Pressure(4, None))},
        {
            POD: {
                "io_pressure_waiting_nanos": 3000,
                "io_pressure_stalled_nanos": None,
                "cpu_stalled_neighbours_nanos": None,  # no CPU `full`: no such causes
            }
        },
    ),
    Row("a group not read is forgotten", {}, {}),
    Row(
        "... so its next sighting is a first one",
        {POD: reading(usage=90, identity=(("v2", 70),))},
        {},
        {"first_seen": 1},
    ),
]


def test_guard_table():
    tracker = Guarded()
    for row in PASSES:
        outcome = tracker.advance(row.readings)
        assert dict(outcome.refused) == row.refused, row.why
        assert set(outcome.deltas) == set(row.deltas), row.why
        for group, expected in row.deltas.items():
            got = outcome.deltas[group].as_dict()
            for name, value in expected.items():
                assert got[name] == value, (row.why, name)
        assert tracker.tracked == len(row.readings), row.why


@pytest.mark.parametrize("usage", [None, 5])
def test_equal_readings_give_zeros_of_their_own_shape(usage):
    tracker = Guarded()
    same = reading(usage=usage, memory=Pressure(1, 1))
    tracker.advance({POD: same})
    delta = tracker.advance({POD: same}).deltas[POD].as_dict()
    assert delta["cgroup_cpu_nanos"] == (None if usage is None else 0)
    assert delta["memory_pressure_waiting_nanos"] == delta["memory_pressure_stalled_nanos"] == 0
    assert delta["cpu_periods"] is None and delta["cpu_pressure_waiting_nanos"] is None
    assert delta["cpu_stalled_neighbours_nanos"] is None  # no CPU pressure: no such cause
    with_cpu = reading(usage=usage, cpu=Pressure(4, 2))
    tracker.advance({POD: with_cpu})
    delta = tracker.advance({POD: with_cpu}).deltas[POD].as_dict()
    assert delta["cpu_stalled_throttled_nanos"] == delta["cpu_stalled_neighbours_nanos"] == 0
    assert delta["cpu_waiting_own_threads_nanos"] == 0


S = 1_000_000_000


def quota(path: bytes, inode: int, throttled: int, ns: int, quota_ms: int) -> Bandwidth:
    return Bandwidth(path, inode, 30, throttled, ns, quota_ms * 1_000_000, 100_000_000)


def test_throttled_time_over_several_cpus_is_taken_out_of_full_as_wall_time():
    """4 busy threads on 2 CPUs under a 1-CPU quota for 3 s, beside a neighbour that held
    both CPUs 0.2 s more (measured alone on 6.18: `full` 1.50 s, throttled time 2.99 s,
    30 periods of 30): the quota's 1.5 s of wall time come out of `full`, not its 3 s of
    run-queue time, and the neighbour's 0.2 s are left."""
    tracker = Guarded()
    tracker.advance(
        {POD: reading(usage=0, bandwidth=(quota(b"", 7, 0, 0, 100),), cpu=Pressure(0, 0))}
    )
    now = reading(
        usage=3 * S,
        bandwidth=(quota(b"", 7, 30, 3 * S, 100),),
        cpu=Pressure(3_000_000, 1_700_000),
    )
    delta = tracker.advance({POD: now}).deltas[POD]
    assert delta.cpu_throttled_nanos == 3 * S
    assert delta.cpu_stalled_throttled_nanos == 1_500_000_000
    assert delta.cpu_stalled_neighbours_nanos == 200_000_000
    assert delta.cpu_waiting_own_threads_nanos == 1_300_000_000


def test_a_container_made_since_the_last_pass_counts_its_throttled_wall_time_whole():
    """A container cgroup made within the interval, throttled at once across two CPUs under
    its 1-CPU quota: its throttled time counts whole, and as wall time by its own quota
    (3 s of run-queue time, 1.5 s of wall), not as the run-queue time."""
    tracker = Guarded()
    pod = quota(b"", 7, 0, 0, 400)
    tracker.advance({POD: reading(usage=0, bandwidth=(pod,), cpu=Pressure(0, 0))})
    now = reading(
        usage=3 * S,
        bandwidth=(pod, quota(b"/c1", 8, 30, 3 * S, 100)),
        cpu=Pressure(2_000_000, 1_600_000),
    )
    delta = tracker.advance({POD: now}).deltas[POD]
    assert delta.cpu_throttled_nanos == 3 * S
    assert delta.cpu_stalled_throttled_nanos == 1_500_000_000
    assert delta.cpu_stalled_neighbours_nanos == 100_000_000


def test_bandwidth_counters_that_appear_give_no_causes_that_pass():
    """Throttling unknown in one of two readings: no part of `full` is called the
    neighbours' for want of it; with counters in neither (no quota of its own), none is
    its quota's."""
    tracker = Guarded()
    tracker.advance({POD: reading(usage=0, cpu=Pressure(0, 0))})
    appeared = reading(usage=S, bandwidth=(quota(b"", 7, 10, S, 20),), cpu=Pressure(9000, 8000))
    delta = tracker.advance({POD: appeared}).deltas[POD]
    assert delta.cpu_pressure_stalled_nanos == 8_000_000
    assert delta.cpu_stalled_neighbours_nanos is None and delta.cpu_stalled_throttled_nanos is None
    tracker = Guarded()
    tracker.advance({POD: reading(usage=0, cpu=Pressure(0, 0))})
    delta = tracker.advance({POD: reading(usage=S, cpu=Pressure(9000, 8000))}).deltas[POD]
    assert (delta.cpu_stalled_throttled_nanos, delta.cpu_stalled_neighbours_nanos) == (
        0,
        8_000_000,
    )


def test_a_pod_with_two_throttled_containers_sums_the_throttling_of_both():
    """The bandwidth counters are the kernel's per cgroup: a pod's are the sum over its
    own cgroup and every container below it, each one's difference added to the others'
    (periods, throttled periods, throttled time, and the wall time each quota throttled
    it, the part of `full` that is the quota's), never only the last container's."""
    tracker = Guarded()
    tracker.advance(
        {
            POD: reading(
                usage=0,
                bandwidth=(bw(b"", 7, 10, 0, 0), bw(b"/c1", 8, 10, 2, 100),
                           bw(b"/c2", 9, 10, 3, 300)),
                cpu=Pressure(0, 0),
            )
        }
    )  # fmt: skip
    now = reading(
        usage=S,
        bandwidth=(bw(b"", 7, 20, 0, 0), bw(b"/c1", 8, 20, 5, 400), bw(b"/c2", 9, 25, 7, 1000)),
        cpu=Pressure(10, 5),
    )
    outcome = tracker.advance({POD: now})
    assert dict(outcome.refused) == {}
    delta = outcome.deltas[POD]
    assert delta.cpu_periods == 10 + 10 + 15
    assert delta.cpu_throttled_periods == 0 + 3 + 4
    assert delta.cpu_throttled_nanos == 0 + 300 + 700
    # no quota read: each container's throttled time is its wall time (collector/waits.py)
    assert delta.cpu_stalled_throttled_nanos == 300 + 700
    assert delta.cpu_stalled_neighbours_nanos == 5000 - 1000


def test_a_container_cgroup_that_disappears_loses_only_its_own_last_interval():
    """A container whose cgroup is gone since the last pass (it exited, its cgroup was
    removed) loses its last interval, as an exited process does: the pod's delta is
    still given, from its own cgroup and the containers still there, and nothing is
    refused (a container gone is no counter that fell)."""
    tracker = Guarded()
    tracker.advance(
        {
            POD: reading(
                usage=1000,
                bandwidth=(bw(b"", 7, 10, 1, 100), bw(b"/c1", 8, 10, 2, 200),
                           bw(b"/c2", 9, 10, 3, 300)),
            )
        }
    )  # fmt: skip
    outcome = tracker.advance(
        {POD: reading(usage=3000, bandwidth=(bw(b"", 7, 12, 1, 100), bw(b"/c1", 8, 14, 4, 500)))}
    )
    assert dict(outcome.refused) == {}
    delta = outcome.deltas[POD]
    assert delta.cgroup_cpu_nanos == 2000
    assert (delta.cpu_periods, delta.cpu_throttled_periods, delta.cpu_throttled_nanos) == (
        2 + 4,
        0 + 2,
        0 + 300,
    )


def test_two_groups_refused_for_one_reason_in_one_pass_count_two():
    """`procdelta_dropped_cgroup_deltas_total{reason}` counts groups: two groups refused
    for the same reason in one pass count two, for each reason, and the second group is
    guarded as the first is (the refusal of one does not end the pass's loop)."""
    tracker = Guarded()
    other = "other pod"
    outcome = tracker.advance({POD: reading(usage=10), other: reading(usage=10)})
    assert dict(outcome.refused) == {"first_seen": 2}
    made_anew = (("v2", 70),)
    outcome = tracker.advance(
        {POD: reading(usage=20, identity=made_anew), other: reading(usage=20, identity=made_anew)}
    )
    assert dict(outcome.refused) == {"recreated": 2}
    outcome = tracker.advance(
        {POD: reading(usage=5, identity=made_anew), other: reading(usage=5, identity=made_anew)}
    )
    assert dict(outcome.refused) == {"counter_fell": 2}
    assert outcome.deltas == {}
    assert tracker.tracked == 2


def test_the_guard_forms_no_cause_and_says_where_the_kernels_account_holds():
    """The guard gives deltas without causes; the wall time a group's quotas throttled it
    only where its causes can be the kernel's: a CPU `full` line, and bandwidth counters
    in both readings or in neither (a quota set or removed within the interval: no such
    causes, as `with_waits` would otherwise split a stall it cannot apportion)."""
    guard: CgroupTracker[str] = CgroupTracker()
    pod = quota(b"", 7, 0, 0, 100)
    guard.advance(
        {
            "full": reading(usage=0, bandwidth=(pod,), cpu=Pressure(0, 0)),
            "some only": reading(usage=0, cpu=Pressure(0, None)),
            "quota set": reading(usage=0, cpu=Pressure(0, 0)),
            "still": reading(usage=0, cpu=Pressure(0, 0)),
        }
    )
    outcome = guard.advance(
        {
            "full": reading(
                usage=S, bandwidth=(quota(b"", 7, 30, 3 * S, 100),), cpu=Pressure(3000, 2000)
            ),
            "some only": reading(usage=S, cpu=Pressure(5000, None)),
            "quota set": reading(usage=S, bandwidth=(pod,), cpu=Pressure(3000, 2000)),
            "still": reading(usage=0, cpu=Pressure(0, 0)),
        }
    )
    assert outcome.throttled_wall_ns == {"full": 1_500_000_000, "still": 0}
    for delta in outcome.deltas.values():
        causes = (delta.cpu_stalled_throttled_nanos, delta.cpu_stalled_neighbours_nanos,
                  delta.cpu_waiting_own_threads_nanos, delta.run_delay_throttled_nanos)  # fmt: skip
        assert causes == (None,) * 4
