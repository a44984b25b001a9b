"""What is shipped: the page of a real `procdelta serve` over a pods table, weighed per
pod with the default switches and with each one turned (`page_sizes`), and its report
(`echo_sizes`).
"""

from __future__ import annotations

import http.client
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from collector.bench.serve import SERVED_WARMUP, Page, serve_process, until_passes
from collector.bench.tables import pod_ids, pod_names

# The switches whose page the bench weighs: the default, then each turned the other way,
# then the chart's fleet profile (its two switches together)
FLEET = "--no-export.interval-gauges --collector.cgroup.pressure.cpu-only"
SWITCHES: tuple[str, ...] = (
    "--no-export.interval-gauges",
    "--no-export.totals",
    "--no-collector.cgroup",
    "--no-collector.cgroup.pressure",
    "--per-container",
    FLEET,
)


@dataclass
class PageSize:
    """What one page of `procdelta serve` ships for the pods of a table."""

    switch: str  # "default", or the one switch turned
    pods: int
    series: int  # sample lines carrying the uid of one of the table's pods
    line_bytes: int  # their bytes, newlines included
    page_bytes: int  # the whole page, uncompressed
    shipped_bytes: int  # the whole page as sent (gzip)
    per_group: Counter[int] = field(default_factory=Counter)  # series of a group -> groups
    failed: str | None = None  # why there is no page (serve refused the switch, or stopped)

    @property
    def groups(self) -> int:
        return sum(self.per_group.values())


_UID = re.compile(rb'[{,]uid="([^"]*)"')


def page_size(page: Page, switch: str, uids: set[str]) -> PageSize:
    """Series and bytes of the pods whose uid is in `uids` (another pod on the node, or the
    node's own groups, not counted); a group is one label set."""
    groups: Counter[bytes] = Counter()
    series = line_bytes = 0
    wanted = {uid.encode() for uid in uids}
    for line in page.text.split(b"\n"):
        found = _UID.search(line)
        if found is None or line.startswith(b"#") or found[1] not in wanted:
            continue
        series += 1
        line_bytes += len(line) + 1
        groups[line[line.index(b"{") : line.rindex(b"}") + 1]] += 1
    return PageSize(
        switch, len(uids), series, line_bytes, len(page.text), page.shipped,
        Counter(groups.values()),
    )  # fmt: skip


def page_sizes(
    pods_file: str, switches: Sequence[str] = SWITCHES, passes: int = SERVED_WARMUP
) -> list[PageSize]:
    """The page of a real `procdelta serve` over the pods of `pods_file` (named as kubelet
    names them: `pod_names`), as Prometheus fetches it, once `passes` passes completed
    (every shape of series is there from the second): with the default switches, then with
    each of `switches` turned (one of several, separated by spaces, turned together)."""
    uids = {uid for uid, _ in pod_ids(pods_file)}
    sizes = []
    with pod_names(pods_file) as (pod_logs, container_logs):
        names = ["--path.pod-logs", pod_logs, "--path.container-logs", container_logs]
        for switch in ("default", *switches):
            try:
                args = [*names, *([] if switch == "default" else switch.split())]
                with serve_process(args) as (_, scraper):
                    sizes.append(page_size(until_passes(scraper, passes), switch, uids))
            except (RuntimeError, OSError, http.client.HTTPException) as error:
                sizes.append(PageSize(switch, len(uids), 0, 0, 0, 0, failed=str(error)))
    return sizes


def echo_sizes(table: str, sizes: list[PageSize], echo: Callable[[str], None]) -> None:
    """What is shipped, per switch: series and bytes per pod (and per 110 pods, a node's
    default maximum), the label sets' series, the whole page plain and gzipped."""
    pods = sizes[0].pods
    echo("")
    echo(f"What is shipped: the page of procdelta serve over the {table} table ({pods} pods,")
    echo("named as kubelet names a Deployment's pods), fetched as Prometheus 3 fetches it")
    echo("(OpenMetrics, gzip), with the default switches and with each one turned. series, bytes:")
    echo("the sample lines carrying one of the table's pod uids (per pod, and for 110 pods);")
    echo("groups: their label sets (with --per-container, one per container); page: all of it.")
    width = max(31, *(len(size.switch) for size in sizes))
    echo(
        f"{'switches':<{width}} {'series/pod':>10} {'bytes/pod':>9} {'series/110':>10} "
        f"{'groups/pod':>10} {'series/group':>14} {'page bytes':>10} {'gzip bytes':>10}"
    )
    for size in sizes:
        if size.failed is not None:
            echo(f"{size.switch:<{width}} {'failed':>10} (below)")
            continue
        per_group = ",".join(str(n) for n in sorted(size.per_group, reverse=True))
        echo(
            f"{size.switch:<{width}} {size.series / size.pods:10.1f} "
            f"{size.line_bytes / size.pods:9.0f} {size.series * 110 / size.pods:10.0f} "
            f"{size.groups / size.pods:10.1f} {per_group:>14} {size.page_bytes:>10} "
            f"{size.shipped_bytes:>10}"
        )
    for size in sizes:
        if len(size.per_group) > 1:
            counts = ", ".join(
                f"{groups} of {series}" for series, groups in sorted(size.per_group.items())
            )
            echo(f"{size.switch}: groups of series: {counts} (a container holding no process,")
            echo("as the table's pause containers, exports its cgroup's fields only)")
        if size.failed is not None:
            echo(f"{size.switch}: no page: {size.failed}")
