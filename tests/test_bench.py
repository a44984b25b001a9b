"""`procdelta bench` runs end to end and prints its table (its numbers are not judged
here: speed is read from the benchmark's ratios, never from a timed test)."""

import re
import subprocess
import sys


def test_quick_bench_prints_a_ratio_per_table_and_the_metrics_latency():
    result = subprocess.run(
        [sys.executable, "-m", "collector", "bench", "--quick", "--rounds", "3",
         "--pause", "0.1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("table")).split()
    assert header[:3] == ["table", "procs", "threads"] and header[-3:] == ["ms", "p-e", "ratio"]
    rows = {
        line[:15].strip(): line[15:].split()
        for line in lines
        if line.startswith(("default", "busy"))
    }
    assert set(rows) == {"default N=200", "busy N=200"}
    for name, cells in rows.items():
        procs, threads = int(cells[0]), int(cells[1])
        assert procs >= 200 and threads >= 200 + 20 * 19, name  # the table was there
        # procs threads cpu-ms wall-ms µs/proc µs/thr naive-ms ratio spread p-e-ms p-e-ratio
        assert len(cells) == 11, name
        low, high = (float(x) for x in cells[8].split("-"))
        assert 0 < low <= float(cells[7]) <= high < 10, name
    assert re.search(
        r"/metrics with 1000 groups while passes run: p50 [\d.]+ ms, p99 [\d.]+ ms", result.stdout
    )
