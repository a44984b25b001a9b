"""Which of the privileges a full read needs this process lacks, said once at start-up.

`/proc/<pid>/io` of another user's process is mode 0400 (passing it takes
CAP_DAC_READ_SEARCH) and guarded by the kernel's ptrace-read check (passing that for
a process with privileges the reader lacks takes CAP_SYS_PTRACE).
"""

from __future__ import annotations

from collector.model import Malformed

NEEDED = {
    2: "CAP_DAC_READ_SEARCH",
    19: "CAP_SYS_PTRACE",
}


def parse_effective_capabilities(status: bytes) -> int:
    """The `CapEff:` bit mask of a `status` file."""
    for line in status.splitlines():
        if line.startswith(b"CapEff:"):
            try:
                return int(line.split(b":", 1)[1].strip(), 16)
            except ValueError:
                break
    raise Malformed("status CapEff", status)


def missing_capabilities(effective: int) -> list[str]:
    return [name for bit, name in sorted(NEEDED.items()) if not effective & (1 << bit)]


def own_missing_capabilities(status_path: str = "/proc/self/status") -> list[str]:
    """The needed capabilities this process does not hold (all of them if unknowable)."""
    try:
        with open(status_path, "rb") as status:
            return missing_capabilities(parse_effective_capabilities(status.read()))
    except (OSError, Malformed):
        return list(NEEDED.values())


def refused_reads(denied: int, missing: list[str]) -> str:
    """The line that says processes were left out for want of privileges, and the fix."""
    many = denied != 1
    line = (
        f"{denied} {'processes' if many else 'process'} refused a read (permission denied): "
        f"{'their deltas are' if many else 'its delta is'} left out of the sums"
    )
    if missing:
        grant = ", ".join(name.removeprefix("CAP_") for name in missing)
        line += f"; run as root, or grant {grant} (this process lacks {' and '.join(missing)})"
    return line
