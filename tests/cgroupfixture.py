"""Literal cgroupfs fixture trees, changed in place between passes as the kernel does.

A cgroup's identity is its path and its directory's inode (docs/reference.md §7), so a
fixture cannot
swap one directory tree for another between passes, as the proc fixture does: every
inode would change. A `CgroupTree` writes pass 1's files into a temporary directory,
then rewrites them in place for pass 2: files are overwritten, cgroups that pass 2 does
not have are removed, and only the directories listed as recreated are removed and made
again (a new inode under the same path, like a restarted systemd service).

`LAYOUTS` holds one small node per kind of host (pure v1, pure v2, a hybrid, paths seen
from another cgroup namespace, kind's nested kubelet), each with its own process table
written by `write_proc`, for tests/unit/test_cgroup_golden.py. `MAIN` is the cgroupfs that
goes with the literal proc fixture (tests/fixtures/proc).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from collector.cgroupfs import CgroupFS
from collector.podcgroups import PodCgroups

Files = dict[str, str]


_LISTINGS: weakref.WeakKeyDictionary[CgroupFS, PodCgroups] = weakref.WeakKeyDictionary()


def pod_cgroups(fs: CgroupFS, per_container: bool = False) -> dict:
    """The pod (or container) cgroups in `fs`'s hierarchies, listed by one `PodCgroups`
    per reader, kept from call to call as the engine keeps its own."""
    listing = _LISTINGS.get(fs)
    if listing is None:
        listing = _LISTINGS[fs] = PodCgroups(fs.hierarchies)
    return listing.pods(per_container)


def read_group(fs: CgroupFS, locations, previous=None):
    """One group's reading (`CgroupFS.read_groups` of it alone), given its last."""
    return fs.read_groups({0: locations}, {} if previous is None else {0: previous}).get(0)


def v1_stat(periods: int, throttled: int, throttled_ns: int) -> str:
    return (
        f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_time {throttled_ns}\n"
        "nr_bursts 0\nburst_time 0\n"
    )


def v2_stat(
    usage_us: int, periods: int | None = None, throttled: int = 0, throttled_us: int = 0
) -> str:
    text = f"usage_usec {usage_us}\nuser_usec {usage_us // 2}\nsystem_usec {usage_us // 2}\n"
    text += "nice_usec 0\n"
    if periods is not None:  # the cpu controller is on for this cgroup
        text += (
            f"nr_periods {periods}\nnr_throttled {throttled}\nthrottled_usec {throttled_us}\n"
            "nr_bursts 0\nburst_usec 0\n"
        )
    return text


def psi(some_us: int, full_us: int | None = 0) -> str:
    text = f"some avg10=0.00 avg60=0.00 avg300=0.00 total={some_us}\n"
    if full_us is not None:
        text += f"full avg10=0.00 avg60=0.00 avg300=0.00 total={full_us}\n"
    return text


def pressure(directory: str, cpu: tuple[int, int], memory=(0, 0), io=(0, 0)) -> Files:
    return {
        f"{directory}/cpu.pressure": psi(*cpu),
        f"{directory}/memory.pressure": psi(*memory),
        f"{directory}/io.pressure": psi(*io),
    }


@dataclass
class Layout:
    """A node's cgroupfs over two passes (and, for the per-layout goldens, its processes)."""

    passes: tuple[Files, Files]
    links: dict[str, str] = field(default_factory=dict)  # symlink → target, as on v1 hosts
    recreated: tuple[str, ...] = ()  # directories made anew between the passes
    processes: tuple[Process, ...] = ()
    pod_logs: tuple[str, ...] = ()  # <namespace>_<pod>_<uid>
    container_logs: tuple[str, ...] = ()  # <pod>_<namespace>_<container>-<id>.log
    # where the reader's own cgroup namespace is rooted on the host (its v2 path), when the
    # processes' paths are written as such a reader sees them
    namespace_root: str | None = None


class CgroupTree:
    """A layout written under `root` (a new temporary directory unless given)."""

    def __init__(self, layout: Layout, root: str | None = None):
        self.layout = layout
        self._tmp = None if root else tempfile.TemporaryDirectory(prefix="procdelta-cgroupfs-")
        self.root = Path(root or self._tmp.name)
        self._write(layout.passes[0])
        for link, target in layout.links.items():
            (self.root / link).symlink_to(target)

    def next_pass(self) -> None:
        """Change the tree in place into the second pass's."""
        wanted = self.layout.passes[1]
        # A recreated cgroup gets a new inode number: kernfs allocates them cyclically. A
        # file system may hand a freed number straight back, so the old directory is moved
        # aside until the new one exists.
        aside = self.root.parent / f"{self.root.name}.recreated"
        for index, relative in enumerate(self.layout.recreated):
            aside.mkdir(exist_ok=True)
            (self.root / relative).rename(aside / str(index))
        for path in sorted(self._files(), reverse=True):
            if path not in wanted:
                (self.root / path).unlink()
        for directory in sorted(self._dirs(), key=len, reverse=True):
            if not any((self.root / directory).iterdir()):
                (self.root / directory).rmdir()
        self._write(wanted)
        shutil.rmtree(aside, ignore_errors=True)

    def _write(self, files: Files) -> None:
        for relative, text in files.items():
            path = self.root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as out:  # in place: the same inode, as a kernel file
                out.write(text)

    def _files(self) -> list[str]:
        return [
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if p.is_file() and not p.is_symlink() and not _under_link(p, self.root)
        ]

    def _dirs(self) -> list[str]:
        return [
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if p.is_dir() and not p.is_symlink() and not _under_link(p, self.root)
        ]


def _under_link(path: Path, root: Path) -> bool:
    return any(
        parent.is_symlink() for parent in path.relative_to(root).parents if str(parent) != "."
    )


# -- a small process table for the per-layout goldens ---------------------------------


@dataclass(frozen=True)
class Process:
    """A single-threaded process: its cgroup file and its counters at each pass."""

    pid: int
    comm: str
    cgroup: str
    on_cpu_ns: tuple[int, int]
    run_delay_ns: tuple[int, int]
    utime_ticks: tuple[int, int] = (0, 0)
    start_ticks: int = 100
    rss_pages: int = 100


def write_proc(
    root: Path, processes: tuple[Process, ...], index: int, in_place: bool = False
) -> None:
    """`root` as /proc at pass `index` (0 or 1): one directory per process, written anew,
    or `in_place`: files rewritten, a process's directory kept (its inode too, as the
    kernel keeps a live process's) and removed when it is gone."""
    if root.exists() and not in_place:
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "loadavg").write_text("0.10 0.05 0.01 1/80 900\n")
    wanted = {str(process.pid) for process in processes}
    for entry in root.iterdir():
        if entry.is_dir() and entry.name not in wanted:
            shutil.rmtree(entry)
    for process in processes:
        base = root / str(process.pid)
        task = base / "task" / str(process.pid)
        task.mkdir(parents=True, exist_ok=True)
        stat = (
            f"{process.pid} ({process.comm}) S 1 {process.pid} {process.pid} 0 -1 4194560 0 0 "
            f"0 0 {process.utime_ticks[index]} 0 0 0 20 0 1 0 {process.start_ticks} 10000000 "
            f"{process.rss_pages} 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 "
            "0 0 0 0 0 0\n"
        )
        (base / "stat").write_text(stat)
        (task / "stat").write_text(stat)
        (base / "statm").write_text(f"10000 {process.rss_pages} 50 10 0 300 0\n")
        (base / "cgroup").write_text(process.cgroup)
        (task / "schedstat").write_text(
            f"{process.on_cpu_ns[index]} {process.run_delay_ns[index]} {10 + index}\n"
        )
        (task / "status").write_text(
            f"Name:\t{process.comm}\nvoluntary_ctxt_switches:\t{index}\n"
            "nonvoluntary_ctxt_switches:\t0\n"
        )
        (task / "io").write_text(
            "rchar: 0\nwchar: 0\nsyscr: 0\nsyscw: 0\nread_bytes: 0\nwrite_bytes: 0\n"
            "cancelled_write_bytes: 0\n"
        )


def _in(directory: str, files: Files) -> Files:
    return {f"{directory}/{name}": text for name, text in files.items()}


# -- the cgroupfs of the literal proc fixture (a hybrid host, both drivers) -------------

_V1 = "cpu,cpuacct"
_CART = "kubepods/burstable/pod0b3e7a52-9c1d-4f6e-8a2b-5d4c3b2a1f00"  # cgroupfs driver, v1 only
_CART_APP = f"{_CART}/{'a1' * 32}"
_CART_PAUSE = f"{_CART}/{'e5' * 32}"
_NGINX = "kubepods.slice/kubepods-pod7c6d5e4f_3a2b_4c1d_9e8f_a0b1c2d3e4f5.slice"  # guaranteed
_NGINX_APP = f"{_NGINX}/cri-containerd-{'b2' * 32}.scope"
_BURSTABLE = "kubepods.slice/kubepods-burstable.slice"
_CRIO = f"{_BURSTABLE}/kubepods-burstable-poddeadbeef_0000_4000_8000_00000000cafe.slice"
_BESTEFFORT = "kubepods.slice/kubepods-besteffort.slice"
_ETCD = f"{_BESTEFFORT}/kubepods-besteffort-pod9f8e7d6c5b4a39281706f5e4d3c2b1a0.slice"
_ETCD_APP = f"{_ETCD}/cri-containerd-{'c3' * 32}.scope"
_GONE = f"{_BESTEFFORT}/kubepods-besteffort-pod66666666_6666_4666_8666_666666666666.slice"
_NEW = f"{_BESTEFFORT}/kubepods-besteffort-pod11111111_2222_4333_8444_555555555555.slice"


def _main_pass(second: bool) -> Files:
    n = int(second)
    files: Files = {
        "unified/cgroup.controllers": "",
        # the CPUs: the node's two, and nginx's app container pinned to CPU 1 (the CPU
        # manager's); every other cgroup of the v2 tree has its root's, which the v1-only
        # pod's processes (at the v2 root) have too
        "unified/cpuset.cpus.effective": "0-1\n",
        f"unified/{_NGINX_APP}/cpuset.cpus.effective": "1\n",
        "unified/cpu.pressure": psi(10**9 + n * 10**6),
        "unified/cpu.stat": v2_stat(5 * 10**9 + n * 10**7),
        f"{_V1}/cpu.stat": v1_stat(0, 0, 0),
        f"{_V1}/cpuacct.usage": f"{5 * 10**15 + n * 10**13}\n",
        # shop/cart-7d9f, cgroupfs driver, cgroup v1 only: usage from cpuacct.usage; its
        # container is throttled by its own quota (the pod's cgroup has none): 100 of 100
        # periods throttled, 8 s over the 10 s interval; no PSI on v1
        f"{_V1}/{_CART}/cpuacct.usage": f"{5 * 10**9 + n * 2_500_000_000}\n",
        f"{_V1}/{_CART}/cpu.stat": v1_stat(0, 0, 0),
        f"{_V1}/{_CART_APP}/cpuacct.usage": f"{49 * 10**8 + n * 2_500_000_000}\n",
        f"{_V1}/{_CART_APP}/cpu.stat": v1_stat(100 + 100 * n, 20 + 100 * n, 10**9 + n * 8 * 10**9),
        f"{_V1}/{_CART_PAUSE}/cpuacct.usage": "100000000\n",
        f"{_V1}/{_CART_PAUSE}/cpu.stat": v1_stat(0, 0, 0),
        # web/nginx-0, Guaranteed, systemd driver: usage and PSI from the v2 tree (no io.pressure:
        # a missing file is no series); throttling from the v1 cpu controller, where the pod's
        # own quota and its container's are summed: 100 + 100 periods, 5 throttled, 20 ms
        f"unified/{_NGINX}/cpu.stat": v2_stat(10**6 + n * 2 * 10**6),
        f"unified/{_NGINX}/cpu.pressure": psi(1000 + n * 250_000, 500 + n * 100_000),
        f"unified/{_NGINX}/memory.pressure": psi(0),
        f"unified/{_NGINX_APP}/cpu.stat": v2_stat(10**6 + n * 2 * 10**6),
        f"{_V1}/{_NGINX}/cpu.stat": v1_stat(50 + 100 * n, 0, 0),
        f"{_V1}/{_NGINX}/cpuacct.usage": f"{10**9 + n * 2 * 10**9}\n",
        f"{_V1}/{_NGINX_APP}/cpu.stat": v1_stat(50 + 100 * n, 5 * n, 20_000_000 * n),
        f"{_V1}/{_NGINX_APP}/cpuacct.usage": f"{10**9 + n * 2 * 10**9}\n",
        # the CRI-O pod: its usage fell (no delta, counted as counter_fell); its container's
        # own cgroup did not (with --per-container, that group has its delta)
        f"unified/{_CRIO}/cpu.stat": v2_stat(9 * 10**6 - n * 10**6),
        **pressure(f"unified/{_CRIO}", (0, 0)),
        f"unified/{_CRIO}/crio-{'d4' * 32}.scope/cpu.stat": v2_stat(10**6 + n * 10**6),
        **pressure(f"unified/{_CRIO}/crio-{'d4' * 32}.scope", (0, 0)),
        f"unified/{_CRIO}/crio-conmon-{'d4' * 32}.scope/cpu.stat": v2_stat(1000),
        # kube-system/etcd-node1, a static pod whose process the proc fixture shows from
        # another cgroup namespace (`/../../kubepods-besteffort-pod…`): one process seen for
        # 3 s of its 10, its cgroup shows the 5 s of CPU the pod used, and 1 s of I/O stall
        f"unified/{_ETCD}/cpu.stat": v2_stat(10**5 + n * 5 * 10**6),
        **pressure(f"unified/{_ETCD}", (0, 0), io=(10**6 * n, 5 * 10**5 * n)),
        f"unified/{_ETCD_APP}/cpu.stat": v2_stat(10**5 + n * 5 * 10**6),
        **pressure(f"unified/{_ETCD_APP}", (0, 0), io=(10**6 * n, 0)),
        # a service: its v2 cgroup (the hybrid's v1 controllers hold it at the root)
        "unified/system.slice/odd.service/cpu.stat": v2_stat(2 * 10**6 + n * 5 * 10**5),
        **pressure("unified/system.slice/odd.service", (7 + n * 1000, 0)),
    }
    if second:  # a pod made between the passes: first sighting, no delta
        files |= {f"unified/{_NEW}/cpu.stat": v2_stat(300), **pressure(f"unified/{_NEW}", (0, 0))}
    else:  # a pod gone by the second pass
        files |= {f"unified/{_GONE}/cpu.stat": v2_stat(300)}
    return files


MAIN = Layout(
    passes=(_main_pass(False), _main_pass(True)),
    links={"cpu": _V1, "cpuacct": _V1},
)


# -- one small node per kind of host, for tests/unit/test_cgroup_golden.py -------------------

_A = "aaaaaaaa-0000-4000-8000-00000000000a"  # Guaranteed, cgroupfs driver, pure v1
_B = "bbbbbbbb-0000-4000-8000-00000000000b"  # BestEffort, no process seen
_C = "cccccccc-0000-4000-8000-00000000000c"  # Burstable, systemd driver, pure v2
_D = "dddddddd-0000-4000-8000-00000000000d"  # seen from another cgroup namespace
_E = "eeeeeeee-0000-4000-8000-00000000000e"
_F = "ffffffff-0000-4000-8000-00000000000f"  # kind's nested kubelet
_R = "12121212-0000-4000-8000-000000000012"  # the reader's own pod (BestEffort)
_RCID = "3c" * 32  # the reader's own container
_CID, _CID2, _PAUSE = "1c" * 32, "2c" * 32, "9c" * 32


def _v1_pass(n: int) -> Files:
    pod = f"{_V1}/kubepods/pod{_A}"
    files: Files = {
        f"{_V1}/cpu.stat": v1_stat(0, 0, 0),
        f"{_V1}/cpuacct.usage": f"{10**15 + n}\n",
        # the pod's own quota (every container has a limit) and its container's, summed;
        # a container restarted under a new ID between the passes counts whole
        f"{pod}/cpuacct.usage": f"{10**9 + n * 25 * 10**8}\n",
        f"{pod}/cpu.stat": v1_stat(10 + 50 * n, 25 * n, 25 * 10**8 * n),
        f"{pod}/{_CID}/cpuacct.usage": f"{10**9 + n * 2 * 10**9}\n",
        f"{pod}/{_CID}/cpu.stat": v1_stat(10 + 50 * n, 30 * n, 3 * 10**9 * n),
        f"{pod}/{_PAUSE}/cpuacct.usage": "1000\n",
        f"{pod}/{_PAUSE}/cpu.stat": v1_stat(0, 0, 0),
        f"{_V1}/kubepods/besteffort/pod{_B}/cpuacct.usage": f"{n * 7 * 10**8}\n",
        f"{_V1}/kubepods/besteffort/pod{_B}/cpu.stat": v1_stat(0, 0, 0),
        f"{_V1}/system.slice/foo.service/cpuacct.usage": f"{10**9 + n * 25 * 10**7}\n",
        f"{_V1}/system.slice/foo.service/cpu.stat": v1_stat(0, 0, 0),
    }
    if n:
        files |= {
            f"{pod}/{_CID2}/cpuacct.usage": "500000000\n",
            f"{pod}/{_CID2}/cpu.stat": v1_stat(5, 5, 5 * 10**8),
        }
    return files


V1 = Layout(
    passes=(_v1_pass(0), _v1_pass(1)),
    links={"cpu": _V1, "cpuacct": _V1},
    processes=(
        Process(
            10,
            "app",
            f"11:cpu,cpuacct:/kubepods/pod{_A}/{_CID}\n1:name=systemd:/kubepods/pod{_A}/{_CID}\n",
            (10**9, 3 * 10**9),
            (10**8, 3 * 10**9),
        ),
        Process(
            20,
            "foo",
            "11:cpu,cpuacct:/system.slice/foo.service\n1:name=systemd:/system.slice/foo.service\n",
            (10**9, 125 * 10**7),
            (0, 10**6),
        ),
    ),
    pod_logs=(f"prod_api-0_{_A}", f"batch_job-x_{_B}"),
    container_logs=(f"api-0_prod_server-{_CID}.log", f"api-0_prod_server-{_CID2}.log"),
)

_SLICE_C = (
    f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{_C.replace('-', '_')}.slice"
)


def _v2_pass(n: int) -> Files:
    app = f"{_SLICE_C}/cri-containerd-{_CID}.scope"
    return {
        "cgroup.controllers": "cpuset cpu io memory pids\n",
        "cpu.pressure": psi(10**6 * (1 + n)),
        "cpu.stat": v2_stat(10**10 + n, 0),
        # the pod has no quota of its own (a Burstable pod); its container's is hit hard
        f"{_SLICE_C}/cpu.stat": v2_stat(10**6 + n * 10**6, 0),
        **pressure(_SLICE_C, (10**6 + n * 8 * 10**6, 10**6 + n * 8 * 10**6)),
        f"{app}/cpu.stat": v2_stat(
            10**6 + n * 10**6, 100 + 100 * n, 90 * (1 + n), 8 * 10**6 * (1 + n)
        ),
        **pressure(app, (10**6 + n * 8 * 10**6, 10**6 + n * 8 * 10**6)),
        # a service restarted between the passes: the same path, a new cgroup
        "system.slice/foo.service/cpu.stat": v2_stat(5 * 10**6 - n * 4 * 10**6, 0),
        **pressure("system.slice/foo.service", (0, 0)),
        "init.scope/cpu.stat": v2_stat(10**5 + n * 2000, 0),
        **pressure("init.scope", (0, 0)),
    }


V2 = Layout(
    passes=(_v2_pass(0), _v2_pass(1)),
    recreated=("system.slice/foo.service",),
    processes=(
        Process(
            30,
            "worker",
            f"0::/{_SLICE_C}/cri-containerd-{_CID}.scope\n",
            (0, 10**9),
            (0, 8 * 10**9),
        ),
        Process(40, "foo", "0::/system.slice/foo.service\n", (0, 10**9), (0, 0)),
        Process(1, "init", "0::/init.scope\n", (0, 2 * 10**6), (0, 0)),
    ),
    pod_logs=(f"shop_worker-1_{_C}",),
)


def _cgroupns_pass(n: int) -> Files:
    # The reader runs in a pod at /kubepods/besteffort/pod<self>/<id> with its own cgroup
    # namespace: it reads `/` for itself, `/../<id>` for its pod's pause container, and
    # the other pods' and the services' paths start with `/../../..`.
    return {
        "cgroup.controllers": "cpu io memory pids\n",
        "cpu.pressure": psi(0),
        f"kubepods/besteffort/pod{_R}/cpu.stat": v2_stat(n * 5 * 10**5, 0),
        **pressure(f"kubepods/besteffort/pod{_R}", (0, 0)),
        f"kubepods/besteffort/pod{_R}/{_RCID}/cpu.stat": v2_stat(n * 4 * 10**5, 0),
        f"kubepods/besteffort/pod{_R}/{_PAUSE}/cpu.stat": v2_stat(n * 10**5, 0),
        f"kubepods/burstable/pod{_D}/cpu.stat": v2_stat(n * 3 * 10**6, 0),
        **pressure(f"kubepods/burstable/pod{_D}", (n * 10**5, 0)),
        f"kubepods/burstable/pod{_D}/{_CID}/cpu.stat": v2_stat(n * 3 * 10**6, 0),
        f"kubepods/pod{_E}/cpu.stat": v2_stat(n * 10**6, 0),
        **pressure(f"kubepods/pod{_E}", (0, 0)),
        f"kubepods/pod{_E}/{_CID2}/cpu.stat": v2_stat(n * 10**6, 0),
        "system.slice/foo.service/cpu.stat": v2_stat(n * 4 * 10**5),
        **pressure("system.slice/foo.service", (0, 0)),
    }


CGROUPNS = Layout(
    passes=(_cgroupns_pass(0), _cgroupns_pass(1)),
    processes=(
        # a pod beside the reader's, in the same QoS class: `/../../pod<uid>/<id>`
        Process(50, "same-qos", f"0::/../../pod{_D}/{_CID}\n", (0, 3 * 10**9), (0, 10**8)),
        # a Guaranteed pod: `/../../../pod<uid>/<id>`, no QoS directory in the path
        Process(60, "guaranteed", f"0::/../../../pod{_E}/{_CID2}\n", (0, 10**9), (0, 0)),
        Process(70, "foo", "0::/../../../../system.slice/foo.service\n", (0, 4 * 10**8), (0, 0)),
        # the reader itself, and its pod's pause container beside it
        Process(90, "procdelta", "0::/\n", (0, 4 * 10**8), (0, 0)),
        Process(91, "pause", f"0::/../{_PAUSE}\n", (0, 10**8), (0, 0)),
    ),
    pod_logs=(f"team_a-0_{_D}", f"team_b-0_{_E}", f"monitoring_procdelta-x1_{_R}"),
    namespace_root=f"/kubepods/besteffort/pod{_R}/{_RCID}",
)

_KIND = (
    "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
    f"kubelet-kubepods-besteffort-pod{_F.replace('-', '_')}.slice"
)


def _kind_pass(n: int) -> Files:
    return {
        "cgroup.controllers": "cpu io memory pids\n",
        "cpu.pressure": psi(0),
        f"{_KIND}/cpu.stat": v2_stat(n * 2 * 10**6, 0),
        **pressure(_KIND, (0, 0), memory=(n * 3 * 10**5, n * 10**5)),
        f"{_KIND}/cri-containerd-{_CID}.scope/cpu.stat": v2_stat(n * 2 * 10**6, 0),
    }


KIND = Layout(
    passes=(_kind_pass(0), _kind_pass(1)),
    processes=(
        Process(
            80, "kind-app", f"0::/{_KIND}/cri-containerd-{_CID}.scope\n", (0, 2 * 10**9), (0, 0)
        ),
    ),
    pod_logs=(f"default_app-0_{_F}",),
)

LAYOUTS = {"v1": V1, "v2": V2, "cgroupns": CGROUPNS, "kind": KIND}


class CgroupReads:
    """Every cgroup file `CgroupFS` opens, as (directory, name): its one reading function
    patched (a name opened at a held directory is resolved through /proc/self/fd)."""

    def __init__(self, monkeypatch):
        import collector.cgroupfs as cgroupfs

        self.seen: list[tuple[str, str]] = []
        real = cgroupfs._read

        def counted(path: bytes, dir_fd: int | None = None) -> bytes | None:
            where = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else None
            full = os.path.join(where, os.fsdecode(path)) if where else os.fsdecode(path)
            self.seen.append((os.path.dirname(full), os.path.basename(full)))
            return real(path, dir_fd)

        monkeypatch.setattr(cgroupfs, "_read", counted)

    def names_in(self, directory: Path | str) -> set[str]:
        return {name for where, name in self.seen if where == str(directory)}
