"""Names from SPEC §3, spelled out here (not imported from the code under test)."""

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
