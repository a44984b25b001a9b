"""`procdelta bench`: what a pass costs, as ratios to a naive reader measured in the same run.

For each synthetic process table (tables.py, collector/synthetic.py) it measures,
interleaved over rounds (rounds.py): (a) procdelta's pass; (b) the naive floor (floor.py),
a lean reader of every file a full pass needs (`stat` and `cgroup` per process;
`schedstat`, `status` and `io` per thread) with minimal parsing; (c) where Debian's
prometheus-process-exporter is installed (peers.py), its CPU per scrape of the same table.
Medians; ratios to (b). Then, over the same table, what a node pays for the whole
collector: (d) a real `procdelta serve` in a process of its own (serve.py), scraped once a
pass as Prometheus scrapes it, its whole CPU per pass (the pass, building, rendering and
compressing the page, garbage collection, answering the scrape), as a ratio to the same
floor; (e) what a request of its processes view (`/processes`, the default query and every
process) costs that process, against the floor measured beside each request (served.py);
and what it ships: series and bytes per pod on its page, for each switch (sizes.py). Then
the RSS of a real `procdelta serve` (N=1000 and N=5000, memory.py) and the latency of
`/metrics` with 1000 groups while passes run (latency.py). Then (not with `--quick`) what
the kernel's exit records cost a served process: the same serve without and with
`--collector.exits`, alternately, beside a storm of exits at a fixed rate (exitcost.py,
collector/storm.py). report.py prints it all.
Machines are noisy: read the ratios, not the absolute times.
"""

from collector.bench.report import run

__all__ = ["run"]
