"""Running totals: accumulated from the guarded deltas, forgotten after a group is gone."""

from collector.aggregate import Totals
from collector.groups import Group
from collector.model import Fields

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
