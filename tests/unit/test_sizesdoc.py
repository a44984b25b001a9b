"""docs/performance.md's bytes a pod and page sizes against the bench's latest recorded run
(docs/bench.md): what `python -m tests.tools.sizesdoc` writes."""

from __future__ import annotations

from tests.tools.sizesdoc import DOCS, kilobytes, weighed, written


def test_the_bytes_per_pod_are_the_benchs():
    performance = (DOCS / "performance.md").read_text()
    bench = (DOCS / "bench.md").read_text()
    assert written(performance, bench) == performance


def test_every_switch_the_bench_weighed_has_a_row_with_its_figures():
    """Not a table the writer skips: each switch the bench weighed is a row, figures and all."""
    performance = (DOCS / "performance.md").read_text()
    sizes = weighed((DOCS / "bench.md").read_text())
    assert {"default", "--no-collector.cgroup", "--per-container"} <= sizes.keys()
    for per_pod, page, gzipped in sizes.values():
        assert kilobytes(per_pod, 1) in performance
        assert f"{kilobytes(page, 0)} / {kilobytes(gzipped, 0)}" in performance


def test_a_figure_changed_in_the_bench_is_written_into_the_table():
    performance = (DOCS / "performance.md").read_text()
    bench = (DOCS / "bench.md").read_text().replace("7997", "9123", 1)
    assert "~9.1 KB" in written(performance, bench)
    assert "~9.1 KB" not in performance
