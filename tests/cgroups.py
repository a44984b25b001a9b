"""Real cgroups for the tests, laid out like kubelet's, and processes placed in them.

The hierarchies are found in /proc/self/mountinfo. A missing hierarchy fails the test
that needs it: these tests prove what fixtures cannot and must not silently skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

WORKLOAD = Path(__file__).parent / "workload.py"


def mounts() -> dict[str, str]:
    """{"v2": mount point of cgroup2, "cpu"/"cpuacct"/"cpuset"/"memory": those of the v1
    controllers}."""
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            before, _, after = line.partition(" - ")
            point = before.split()[4]
            fstype, _source, options = after.split()[:3]
            if fstype == "cgroup2":
                found.setdefault("v2", point)
            elif fstype == "cgroup":
                for controller in ("cpu", "cpuacct", "cpuset", "memory"):
                    if controller in options.split(","):
                        found.setdefault(controller, point)
    return found


def hierarchy(kind: str) -> str:
    point = mounts().get(kind)
    assert point is not None, f"no cgroup {kind} hierarchy mounted: these tests need one (as root)"
    return point


# The directories these tests made and have not removed yet, a line each with the PID of
# the test process that made it: test runs side by side (the mutation runner's jobs)
# share the parents they make (`kubepods/...`), and the last one out of a parent removes
# it. A run killed before its cleanup (SIGKILL) leaves its directories listed; the next
# test to make one removes those of dead processes that are empty (`_sweep`). Nothing
# else is ever removed.
_MADE = os.path.join(tempfile.gettempdir(), "procdelta-test-cgroups")


@contextlib.contextmanager
def _made() -> Iterator[dict[str, int]]:
    """The directories made by tests, each with its maker's PID, under an exclusive lock;
    written back after."""
    with open(_MADE + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            made: dict[str, int] = {}
            try:
                with open(_MADE) as registry:
                    for line in registry.read().splitlines():
                        pid, _, path = line.partition(" ") if line[:1] != "/" else ("", "", line)
                        if path:
                            made[path] = int(pid) if pid.isdigit() else 0  # 0: no maker known
            except FileNotFoundError:
                pass
            yield made
            with open(_MADE, "w") as registry:
                registry.write("".join(f"{made[path]} {path}\n" for path in sorted(made)))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _sweep(made: dict[str, int]) -> None:
    """Remove what killed test runs left: the listed directories whose maker is gone and
    that hold no process and no cgroup, the deepest first; any other stays listed."""
    for path in sorted(made, key=lambda p: p.count("/"), reverse=True):
        if _alive(made[path]):
            continue
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:
            continue  # holds a process, or a cgroup of a live test
        del made[path]


def _remove(path: str) -> bool:
    """rmdir `path`, waiting for the processes just killed in it to leave; False where it
    still holds a cgroup (another test's) or a process."""
    for _ in range(50):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if any(entry.is_dir() for entry in os.scandir(path)):
                return False
            time.sleep(0.05)
    return False


@contextlib.contextmanager
def cgroup(kind: str, relative: str):
    """Create `<mount>/<relative>` (and its parents); on exit empty what we made and remove
    it, with each parent a test made that no other test still uses."""
    root = hierarchy(kind)
    created: list[str] = []
    path = root
    with _made() as made:
        _sweep(made)
        for part in relative.strip("/").split("/"):
            path = os.path.join(path, part)
            if not os.path.isdir(path):
                os.mkdir(path)
                created.append(path)
                made[path] = os.getpid()
    try:
        yield path
    finally:
        with _made() as made:
            for directory in reversed(created):
                _evict(directory, root)
            while path != root and path in made and _remove(path):
                del made[path]
                path = os.path.dirname(path)


@contextlib.contextmanager
def cgroups(kinds: tuple[str, ...], relative: str):
    """The same path made in several hierarchies, as a container runtime does on a host
    with more than one (a hybrid host: the v1 controllers and the v2 tree): {kind: path}.
    Co-mounted controllers (`cpu,cpuacct`) share one directory."""
    with contextlib.ExitStack() as stack:
        made: dict[str, str] = {}
        for kind in kinds:
            if hierarchy(kind) in (hierarchy(k) for k in made):
                made[kind] = next(p for k, p in made.items() if hierarchy(k) == hierarchy(kind))
                continue
            made[kind] = stack.enter_context(cgroup(kind, relative))
        yield made


def _evict(path: str, root: str) -> None:
    """Kill what is left in a cgroup we made, and move any survivor to the root."""
    try:
        with open(os.path.join(path, "cgroup.procs")) as procs:
            pids = [int(p) for p in procs.read().split()]
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError), open(os.path.join(root, "cgroup.procs"), "w") as out:
            out.write(str(pid))


def enter(paths: str | list[str]) -> str:
    """A shell command that moves the shell into every cgroup of `paths`."""
    if isinstance(paths, str):
        paths = [paths]
    return " && ".join(
        f'echo $$ > "{os.path.join(p, "cgroup.procs")}"' for p in dict.fromkeys(paths)
    )


class Workload:
    """tests/workload.py started inside a cgroup, or the same path in several hierarchies
    (before its first instruction runs)."""

    def __init__(self, cgroup_path: str | list[str], *args: str):
        command = f'{enter(cgroup_path)} && exec "{sys.executable}" "{WORKLOAD}" ' + " ".join(args)
        self.process = subprocess.Popen(
            ["sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.process.stdout.readline().split()
        assert ready and ready[0] == "ready", f"workload did not start: {ready}"
        self.pid = int(ready[1])

    def ask(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        assert answer, f"workload died answering {command!r}"
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def weighed(cpu_dir: str, shares: int) -> Iterator[None]:
    """`cpu.shares` on a v1 `cpu` cgroup and on each of its ancestors below the hierarchy's
    root, put back as they were after. A weight counts only against its siblings: a pod's
    request outweighs the tasks at the root (where processes of no v1 cgroup run) only where
    every level above it carries it, as kubelet's kubepods, QoS and pod cgroups do."""
    root = Path(hierarchy("cpu"))
    path, before = Path(cpu_dir), []
    while root in path.parents:
        before.append((path / "cpu.shares", (path / "cpu.shares").read_text()))
        path = path.parent
    try:
        for file, _ in before:
            file.write_text(str(shares))
        yield
    finally:
        for file, value in before:
            with contextlib.suppress(OSError):  # removed meanwhile: nothing to put back
                file.write_text(value)
