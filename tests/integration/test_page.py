"""The page served pass after pass (`PageRenderer`) is byte for byte a fresh render of
the same pass (`build_families` + `render_both`), in both formats and gzipped, while
groups appear, change, go quiet and go away; and it renders only what changed."""

from __future__ import annotations

import gzip
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector import exposition
from collector.aggregate import FootprintSums
from collector.exposition import (
    GroupFamily,
    Page,
    PageRenderer,
    SelfState,
    Shapes,
)
from collector.groups import Group
from collector.model import CGROUP_FIELD_NAMES, COUNTER_FIELD_NAMES, CgroupFields, CpuSet, Fields
from tests.pageoracle import build_families, render_both

SHAPES = [
    Shapes(),
    Shapes(interval_gauges=False),
    Shapes(totals=False),
    Shapes(cgroup=False),
]


def pod(n: int) -> Group:
    labels = (("namespace", "ns"), ("pod", f'p"{n}\\x'), ("uid", f"{n:08d}"), ("qos", "burstable"))
    return Group("pod", labels)


def service(n: int) -> Group:
    return Group("cgroup", (("cgroup", f"/system.slice/s{n}.service"),))


class Node:
    """Each group's state, changed pass after pass at random."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.groups: dict[Group, dict] = {}

    def _state(self) -> dict:
        rng = self.rng
        fields = Fields(*(rng.randrange(0, 10**12) for _ in range(11)))
        cgroup = CgroupFields(*(rng.choice((None, rng.randrange(0, 10**9))) for _ in range(10)))
        names = COUNTER_FIELD_NAMES + CGROUP_FIELD_NAMES
        totals = {n: rng.randrange(0, 10**15) for n in names if rng.random() < 0.9}
        footprint = FootprintSums(rng.randrange(1, 50), rng.randrange(1, 500), rng.randrange(10**9))
        cpuset = CpuSet(*rng.choice((("all", 8), ("0-1", 2), ("2-3,6", 3))))
        return {
            "interval": fields if rng.random() < 0.8 else None,  # no interval: a new process
            "cgroup": cgroup if rng.random() < 0.8 else None,
            "totals": totals,
            "footprint": footprint,
            "cpuset": cpuset if rng.random() < 0.7 else None,  # none of it ran
        }

    def step(self) -> None:
        """Some groups come, some go, some change, most stay as they were."""
        rng = self.rng
        for group in list(self.groups):
            roll = rng.random()
            if roll < 0.1:
                del self.groups[group]
            elif roll < 0.35:
                self.groups[group] = self._state()
            elif roll < 0.45:  # one value of one kind changed
                state = dict(self.groups[group])
                state["totals"] = {**state["totals"], "on_cpu_nanos": rng.randrange(10**15)}
                self.groups[group] = state
        for _ in range(rng.randrange(0, 4)):
            n = rng.randrange(0, 40)
            self.groups[pod(n) if n % 3 else service(n)] = self._state()

    def mappings(self):
        g = self.groups
        intervals = {k: s["interval"] for k, s in g.items() if s["interval"] is not None}
        cgroups = {k: s["cgroup"] for k, s in g.items() if s["cgroup"] is not None}
        totals = {k: s["totals"] for k, s in g.items()}
        footprints = {k: s["footprint"] for k, s in g.items()}
        cpusets = {k: s["cpuset"] for k, s in g.items() if s["cpuset"] is not None}
        return intervals, totals, footprints, cgroups, cpusets


def state(passes: int) -> SelfState:
    return SelfState(
        version="9.8.7",
        passes=passes,
        dropped={"first_seen": passes},
        interval_seconds=15.0 + passes / 7,
        last_pass_timestamp=1.7e9 + passes,
        tracked_processes=passes * 3,
    )


@pytest.mark.parametrize("shapes", SHAPES, ids=["default", "no-gauges", "no-totals", "no-cg"])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_page_pass_after_pass_is_a_fresh_render(shapes, seed):
    rng = random.Random(seed)
    node = Node(rng)
    renderer = PageRenderer(shapes)
    for n in range(12):
        node.step()
        intervals, totals, footprints, cgroups, cpusets = node.mappings()
        page = renderer.render(intervals, totals, footprints, state(n), cgroups, cpusets)
        fresh = build_families(intervals, totals, footprints, state(n), cgroups, shapes, cpusets)
        text, openmetrics = render_both(fresh)
        formats = [(False, text), (True, openmetrics)]
        rng.shuffle(formats)  # a scraper asks for either first
        for openmetrics_wanted, expected in formats:
            assert page.body(openmetrics_wanted) == expected, f"pass {n}"
            assert gzip.decompress(page.body(openmetrics_wanted, True)) == expected


def test_an_unchanged_group_is_not_rendered_again(monkeypatch):
    """Of 110 groups, one changes: only its lines are rendered anew; a pass where none
    changed renders no line at all."""
    groups = {pod(n): Fields(processes=1, on_cpu_nanos=n) for n in range(110)}
    totals = {g: {"on_cpu_nanos": f.on_cpu_nanos} for g, f in groups.items()}
    footprints = {g: FootprintSums(1, 1, 4096) for g in groups}
    renderer = PageRenderer()
    renderer.render(groups, totals, footprints, state(1))
    rendered: list[Group] = []
    real = GroupFamily.line

    def counting(self, group, value):
        rendered.append(group)
        return real(self, group, value)

    monkeypatch.setattr(GroupFamily, "line", counting)
    renderer.render(groups, totals, footprints, state(2))
    assert rendered == []
    busy = pod(7)
    groups = {**groups, busy: Fields(processes=1, on_cpu_nanos=10**9)}
    totals = {**totals, busy: {"on_cpu_nanos": 10**9 + 7}}
    page = renderer.render(groups, totals, footprints, state(3))
    assert rendered == [busy, busy]  # its on-CPU interval line and its on-CPU total
    assert page.text == render_both(build_families(groups, totals, footprints, state(3)))[0]


def test_a_format_is_joined_only_when_asked_for():
    page = PageRenderer().render({}, {}, {}, state(1))
    assert isinstance(page, Page) and page._bodies == {}
    page.body(False, True)  # text, gzipped, as Prometheus asks by default
    assert set(page._bodies) == {(False, False), (False, True)}


def test_the_page_is_compressed_by_isal_where_it_installs():
    """The package asks for python-isal (ISA-L's deflate, ~3.5x zlib's level 1 on the page):
    installed, it is what compresses; without it, zlib does, and either is plain gzip."""
    from isal import isal_zlib

    assert exposition.deflate is isal_zlib
    page = b'procdelta_interval_on_cpu_nanos{pod="a"} 1\n' * 1000
    assert gzip.decompress(exposition.gzip_member(page)) == page
    fallback = subprocess.run(
        [sys.executable, "-c",
         "import sys, gzip; sys.modules['isal'] = None\n"
         "from collector import exposition\n"
         "assert exposition.deflate.__name__ == 'zlib', exposition.deflate\n"
         "assert gzip.decompress(exposition.gzip_member(b'x 1\\n' * 99)) == b'x 1\\n' * 99"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert fallback.returncode == 0, fallback.stderr
