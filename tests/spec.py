"""Names from docs/reference.md §3 and §7, spelled out here (not imported from the code
under test)."""

FIELDS = [
    "processes",
    "observed_nanos",
    "on_cpu_nanos",
    "run_delay_nanos",
    "cpu_user_nanos",
    "cpu_system_nanos",
    "major_faults",
    "voluntary_switches",
    "nonvoluntary_switches",
    "read_bytes",
    "write_bytes",
]

CGROUP_FIELDS = [
    "cgroup_cpu_nanos",
    "cpu_periods",
    "cpu_throttled_periods",
    "cpu_throttled_nanos",
    "cpu_pressure_waiting_nanos",
    "cpu_pressure_stalled_nanos",
    "memory_pressure_waiting_nanos",
    "memory_pressure_stalled_nanos",
    "io_pressure_waiting_nanos",
    "io_pressure_stalled_nanos",
    "cpu_stalled_throttled_nanos",
    "cpu_stalled_neighbours_nanos",
    "cpu_waiting_own_threads_nanos",
    "run_delay_throttled_nanos",
    "run_delay_own_threads_nanos",
    "run_delay_neighbours_nanos",
    "run_delay_runnable_nanos",
]
"""docs/reference.md §7, in its table's order."""
