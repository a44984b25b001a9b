"""The page's oracle: every family of docs/reference.md §5 (and §7) built and rendered
whole from one pass's sums, the plain way. `collector.exposition.PageRenderer` renders
the same bytes pass after pass, reusing what did not change; tests/integration/test_page.py holds it
to this, and tests/integration/test_exposition.py renders single families with it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from collector.aggregate import FootprintSums
from collector.exposition import (
    CPUSET_MEMBER_HELP,
    Family,
    Page,
    SelfState,
    Shapes,
    _row_getter,
    _sample_block,
    _self_families,
    _sorted,
    group_families,
)
from collector.groups import Group
from collector.model import CgroupFields, CpuSet, Fields


def build_families(
    intervals: Mapping[Group, Fields],
    totals: Mapping[Group, Mapping[str, int]],
    footprints: Mapping[Group, FootprintSums],
    state: SelfState,
    cgroup_intervals: Mapping[Group, CgroupFields] | None = None,
    shapes: Shapes | None = None,
    cpusets: Mapping[Group, CpuSet] | None = None,
) -> list[Family]:
    """Every family of docs/reference.md §5 (and §7), series in a stable order: the page
    rendered whole (`PageRenderer` renders the same bytes, pass after pass, reusing what
    did not change)."""
    sources = {
        "intervals": intervals,
        "cgroup_intervals": cgroup_intervals or {},
        "totals": totals,
        "footprints": footprints,
        "cpusets": cpusets or {},
    }
    families: list[Family] = []
    for family in group_families(shapes or Shapes()):
        mapping = sources[family.source]
        get = _row_getter(family.source, (family.field,))
        samples = tuple(
            (family.suffix, *_labelled(family.label, g.labels, value))
            for g in _sorted(mapping)
            if (value := get(mapping[g])[0]) is not None
        )
        families.append(Family(family.name, family.kind, family.help, samples))
    if (shapes or Shapes()).cgroup:
        families.append(_cpuset_members(cpusets or {}))
    families.extend(_self_families(state))
    return families


def _cpuset_members(cpusets: Mapping[Group, CpuSet]) -> Family:
    """Each CPU of each distinct list but `all`, the lists in text order, CPUs in number
    order: read off the list's ranges."""
    samples = []
    for cpus in sorted({s.cpus for s in cpusets.values()} - {"all"}):
        numbers: list[int] = []
        for part in cpus.split(","):
            low, _, high = part.partition("-")
            numbers += range(int(low), int(high or low) + 1)
        samples += [("", (("cpus", cpus), ("cpu", str(n))), 1) for n in sorted(numbers)]
    return Family("procdelta_cpuset_member", "gauge", CPUSET_MEMBER_HELP, tuple(samples))


def _labelled(label: str, labels: tuple, value):
    """A family with a label of its own (`procdelta_cpuset_cpus`'s `cpus`) takes its value
    with the sample's: (its value, the number)."""
    if not label:
        return labels, value
    return (*labels, (label, value[0])), value[1]


def render_both(families: Iterable[Family]) -> tuple[bytes, bytes]:
    """(Prometheus text 0.0.4, OpenMetrics 1.0 without its closing `# EOF`)."""
    page = Page(tuple((f.name, f.kind, f.help, _sample_block(f)) for f in families))
    return page.text, page.openmetrics


def render_text(families: Iterable[Family]) -> bytes:
    """The Prometheus text format, version 0.0.4."""
    return render_both(families)[0]


def render_openmetrics(families: Iterable[Family], eof: bool = True) -> bytes:
    """OpenMetrics 1.0 text. Without `eof`, for a page that other families follow."""
    body = render_both(families)[1]
    return body + b"# EOF\n" if eof else body
