"""The image, built from the Dockerfile, run by a real container runtime as the Helm chart's
DaemonSet runs it, beside pods laid out as kubelet lays them out.

podman builds the Dockerfile on a stand-in base image made from Debian's packages (no
image registry is reachable; tests/containers.py), then runs procdelta with the flags of
the chart's *rendered* DaemonSet (a spec field the translation does not know fails), in
a pod cgroup of its own beside a pause-like sibling, once in each cgroup namespace mode:
`host` (as on cgroup v1 nodes) and `private` (as on cgroup v2 nodes). Beside them a
neighbour pod, a pause-like container and an app under a real CPU limit that burns CPU
when the test asks, through a FIFO (blocked on it, it uses no CPU).

What the collector serves is checked against the host's own files: the pods' names, the
neighbour's cgroup CPU and throttling over one burst (exactly the kernel's), its own pod's
processes, the cgroups its labels name; its health as the probes ask, its memory after 20
passes; and a real Prometheus with the chart's rules. A missing podman fails, never skips.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from tests.cgroups import hierarchy
from tests.containers import (
    BASE_IMAGE,
    PodmanRun,
    UnsupportedSpec,
    build_image,
    build_mounts,
    ensure_base_image,
    hierarchies,
    image_size,
    pod_cgroup,
    podman,
    podman_run,
    probe_url,
    procs_below,
    qos_class,
    quantity,
    remove_empty_tree,
    remove_pod_cgroup,
    runtime_parents,
    ulimits,
)
from tests.integration.test_helm import generate, only, render, rule_file
from tests.kernel.test_end_to_end import RULE_WINDOW, Prometheus
from tests.net import free_port, http_get, wait_until

MODES = ("host", "private")
INTERVAL = 2  # procdelta.interval for the test: seconds between passes
BURST_SECONDS = 3.0
"""The burst that is measured: started right after a pass, it spans the next one and ends
in the middle of an interval (1.5 intervals), so that the pass after it reads counters the
kernel has settled (the period timer counts an idle period or two after the last run)."""
CGROUP_COUNTERS = (
    "procdelta_cgroup_cpu_nanos_total",
    "procdelta_cpu_periods_total",
    "procdelta_cpu_throttled_periods_total",
    "procdelta_cpu_throttled_nanos_total",
)
BURNER = """
import os, time
done = 0
while True:
    with open("/ctl/go") as fifo:  # blocks, using no CPU, until the test writes
        seconds = float(fifo.read() or 0)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    done += 1
    with open("/ctl/done.new", "w") as out:
        out.write(str(done))
    os.replace("/ctl/done.new", "/ctl/done")
"""


# -- the spec translation, on its own --------------------------------------------------------


def test_the_rendered_daemonset_translates_to_podman_flags(tmp_path):
    """The chart's default DaemonSet, field by field: what kubelet and a CRI runtime make
    of each, as podman flags."""
    logs = {"podLogs": str(tmp_path / "pods"), "containerLogs": str(tmp_path / "containers")}
    values = {"hostPaths": logs}
    pod = only(render(values), "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = iter([40001])
    run = podman_run(
        pod, lambda: next(ports), submounts=lambda path: [path + "/cpu", path + "/unified"]
    )
    assert (tmp_path / "pods").is_dir()  # DirectoryOrCreate, as kubelet does
    assert run.args == container["args"]
    assert run.ports == {9746: 40001, "metrics": 40001}
    assert run.options == [
        # the paths as the environment of the container, where `podman exec` (as `kubectl
        # exec`) finds them too
        "--env=PROCDELTA_PATH_PROCFS=/host/proc",
        "--env=PROCDELTA_PATH_CGROUPFS=/host/sys/fs/cgroup",
        "--env=PROCDELTA_PATH_POD_LOGS=/var/log/pods",
        "--env=PROCDELTA_PATH_CONTAINER_LOGS=/var/log/containers",
        # and the grouping, so that a command run there groups as serve does
        "--env=PROCDELTA_PER_CONTAINER=false",
        "--env=PROCDELTA_PODS_ONLY=false",
        "--env=PROCDELTA_COLLECTOR_CGROUP=true",
        "--env=PROCDELTA_COLLECTOR_CGROUP_PRESSURE=true",
        "--publish=127.0.0.1:40001:9746/tcp",
        "--security-opt=no-new-privileges",
        "--cap-drop=ALL",
        "--cap-add=DAC_READ_SEARCH",
        "--cap-add=SYS_PTRACE",
        "--read-only",
        "--read-only-tmpfs=false",
        "--user=0",
        "--memory=134217728",
        "--memory-swap=134217728",
        "--cpu-shares=20",
        "--volume=/proc:/host/proc:ro,rbind",
        "--volume=/sys/fs/cgroup:/host/sys/fs/cgroup:ro,rbind",
        "--volume=/sys/fs/cgroup/cpu:/host/sys/fs/cgroup/cpu:ro,bind",
        "--volume=/sys/fs/cgroup/unified:/host/sys/fs/cgroup/unified:ro,bind",
        f"--volume={tmp_path / 'pods'}:/var/log/pods:ro,rbind",
        f"--volume={tmp_path / 'containers'}:/var/log/containers:ro,rbind",
    ]
    assert probe_url(container, "livenessProbe", run) == "http://127.0.0.1:40001/healthz"
    assert qos_class(pod) == "burstable"  # requests without equal limits
    assert pod_cgroup("burstable", "u") == "/kubepods/burstable/podu"


def test_exit_records_translate_to_the_hosts_namespaces_and_net_admin():
    """`procdelta.exits`: the host's PID and network namespaces and NET_ADMIN, as podman
    flags; on the host's network the container's port is the host's own, unpublished."""
    pod = only(render({"procdelta": {"exits": True}}), "DaemonSet")["spec"]["template"]["spec"]
    run = podman_run(pod, lambda: 40001, submounts=lambda path: [])
    assert {"--pid=host", "--network=host", "--cap-add=NET_ADMIN"} <= set(run.options)
    assert "--env=PROCDELTA_COLLECTOR_EXITS=true" in run.options
    assert not [option for option in run.options if option.startswith("--publish")]
    assert run.ports == {9746: 9746, "metrics": 9746}


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda pod, c: pod.update(hostIPC=True), "hostIPC"),
        (lambda pod, c: pod.update(dnsPolicy="ClusterFirstWithHostNet"), "dnsPolicy"),
        (lambda pod, c: pod.update(initContainers=[{"name": "x"}]), "initContainers"),
        (lambda pod, c: c.update(workingDir="/tmp"), "workingDir"),
        (lambda pod, c: c["securityContext"].update(procMount="Unmasked"), "procMount"),
        (lambda pod, c: c["securityContext"].update(runAsNonRoot=True), "runAsNonRoot"),
        (lambda pod, c: c["resources"]["limits"].update({"ephemeral-storage": "1Gi"}), "ephem"),
        (lambda pod, c: c["volumeMounts"][0].update(mountPropagation="HostToContainer"), "Mount"),
        (lambda pod, c: c["volumeMounts"][1].update(readOnly=False), "recursiveReadOnly"),
        (lambda pod, c: pod["volumes"][0].update(emptyDir={}), "volume"),
        (lambda pod, c: pod["volumes"][0]["hostPath"].update(type="Socket"), "hostPath"),
        (lambda pod, c: c["ports"][0].update(hostPort=9746), "port"),
        (lambda pod, c: c.update(env=[{"name": "A", "valueFrom": {}}]), "env"),
        (
            lambda pod, c: c["env"].append({"name": "A", "value": "$(PROCDELTA_PATH_PROCFS)"}),
            "reference",
        ),
    ],
)
def test_a_field_the_translation_does_not_know_fails_loudly(change, complaint):
    pod = only(render({}), "DaemonSet")["spec"]["template"]["spec"]
    change(pod, pod["containers"][0])
    with pytest.raises(UnsupportedSpec, match=complaint):
        podman_run(pod, free_port, submounts=lambda path: [])


def test_quantities():
    assert quantity("128Mi") == 128 * 2**20
    assert quantity("20m") == pytest.approx(0.02)
    assert quantity("1.5") == 1.5 and quantity(2) == 2 and quantity("1G") == 1e9
    with pytest.raises(UnsupportedSpec):
        quantity("1Qi")


# -- the image ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def report(request):
    """Measurements, printed at the end of the session (and with -s, as they come)."""
    lines: dict[str, str] = {}
    yield lines
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not lines:
        return
    with capture.global_and_fixture_disabled():  # past the capture of this teardown
        reporter.write_line("")
        reporter.section("procdelta container measurements", sep="-")
        for key, value in lines.items():
            reporter.write_line(f"{key}: {value}")


def note(report: dict[str, str], key: str, value: str) -> None:
    report[key] = value
    print(f"{key}: {value}")


@pytest.fixture(scope="session")
def image(report):
    """The Dockerfile built once for the session, on the stand-in base; its tag removed at
    the end (the base is kept for the next run)."""
    started = time.monotonic()
    parents_before = set(runtime_parents())
    base_existed = podman("image", "exists", BASE_IMAGE, check=False).returncode == 0
    base = ensure_base_image()
    made = time.monotonic()
    tag = f"localhost/procdelta:test-{uuid.uuid4().hex[:12]}"
    try:
        build_image(tag, base, generate.version())
        built = time.monotonic()
        size = image_size(tag)
        note(
            report,
            "image size",
            f"{size / 1e6:.1f} MB ({tag}; base {image_size(base) / 1e6:.1f} MB)",
        )
        note(report, "base image", "reused" if base_existed else f"made in {made - started:.0f} s")
        note(report, "image build", f"{built - made:.1f} s")
        yield tag
    finally:
        podman("rmi", "--force", tag, check=False)
        for parent in set(runtime_parents()) - parents_before:  # the builds' and runs' cgroups
            remove_empty_tree(parent)


@pytest.mark.container
def test_image_runs_procdelta_and_holds_nothing_of_the_build_machine(image):
    config = json.loads(podman("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert config["Entrypoint"] == ["procdelta"]
    assert config["User"] == "0:0"
    assert config["Labels"]["org.opencontainers.image.version"] == generate.version()
    assert "9746/tcp" in config["ExposedPorts"]
    help_text = podman("run", "--rm", "--pull=never", *ulimits(), image, "--help").stdout
    assert "serve" in help_text
    # what the build mounted for pip (config files, local indexes) is not in the image
    machine = [
        m.split(":")[1] for m in build_mounts() if not m.split("=")[1].startswith("/etc/ssl")
    ]
    check = "import os, sys; print([p for p in sys.argv[1:] if os.path.exists(p)])"
    found = podman(
        "run", "--rm", "--pull=never", *ulimits(), "--entrypoint=python3", image, "-c", check,
        *machine,
    ).stdout  # fmt: skip
    assert found.strip() == "[]", found


# -- the scene: the neighbour pod and procdelta's own pods -------------------------------------


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    qos: str

    @property
    def cgroup(self) -> str:
        return pod_cgroup(self.qos, self.uid)

    @property
    def labels(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.name, "uid": self.uid, "qos": self.qos}


class Page:
    """One scrape of /metrics: its samples."""

    def __init__(self, text: str):
        self.samples = [
            (sample.name, sample.labels, sample.value)
            for family in parse_text(text)
            for sample in family.samples
        ]

    def values(self, name: str, **labels: str) -> list[float]:
        return [v for n, have, v in self.samples if n == name and labels.items() <= have.items()]

    def value(self, name: str, **labels: str) -> float:
        found = self.values(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {found}"
        return found[0]

    @property
    def passes(self) -> int:
        found = self.values("procdelta_passes_total")
        return int(found[0]) if found else 0


@dataclass
class Collector:
    mode: str
    pod: Pod
    container: str  # its container's name
    run: PodmanRun
    started: float  # time.monotonic() just before `podman run`

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.run.ports['metrics']}/metrics"

    def page(self) -> Page:
        return Page(http_get(self.url).decode())

    def next_pass(self, after: int, timeout: float = 30) -> Page:
        """The page of the first pass after pass number `after`."""

        def newer() -> Page | None:
            page = self.page()
            return page if page.passes > after else None

        return wait_until(newer, timeout, f"a pass after pass {after} ({self.mode})")

    def state(self) -> dict:
        return json.loads(podman("inspect", "--format", "{{json .State}}", self.container).stdout)


@dataclass
class Scene:
    daemonset_container: dict
    neighbour: Pod
    collectors: dict[str, Collector]
    control: Path  # the FIFO `go` and the file `done` the burner shares with the test

    def trigger(self, seconds: float) -> int:
        """Ask the neighbour's app for `seconds` of busy CPU; the bursts done before it."""
        done = self.bursts_done()
        deadline = time.monotonic() + 10
        while True:
            try:
                fifo = os.open(self.control / "go", os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as error:  # ENXIO: the app is not reading yet
                assert error.errno == errno.ENXIO and time.monotonic() < deadline, error
                time.sleep(0.01)
        try:
            os.write(fifo, f"{seconds}\n".encode())
        finally:
            os.close(fifo)
        return done

    def burn(self, seconds: float) -> float:
        """A burst of `seconds`, waited for; the wall-clock time it ended."""
        done = self.trigger(seconds)
        wait_until(lambda: self.bursts_done() > done, seconds + 30, "the burst done")
        return time.time()

    def bursts_done(self) -> int:
        with contextlib.suppress(FileNotFoundError):
            return int((self.control / "done").read_text())
        return 0


def start(name: str, cgroup: str, mode: str, options: list[str], command: list[str]) -> str:
    """A container started detached in a pod's cgroup (`command` starts with its image);
    its id."""
    return podman(
        "run", "--detach", "--pull=never", "--name", name, *ulimits(),
        f"--cgroup-parent={cgroup}", f"--cgroupns={mode}", *options, *command,
    ).stdout.strip()  # fmt: skip


def complete(page: Page) -> bool:
    """A page after two passes, with the interval of the second."""
    return page.passes >= 2 and any(n.startswith("procdelta_interval_") for n, _, _ in page.samples)


@pytest.fixture(scope="module")
def scene(image, report):
    work = Path(tempfile.mkdtemp(prefix="procdelta-container-"))
    suffix = uuid.uuid4().hex[:6]
    names: list[str] = []
    cgroups: list[str] = []
    try:
        pods, container_logs, control = work / "pods", work / "containers", work / "control"
        for directory in (pods, container_logs, control):
            directory.mkdir()
        os.mkfifo(control / "go")
        values = {
            "procdelta": {"interval": INTERVAL},
            "hostPaths": {"podLogs": str(pods), "containerLogs": str(container_logs)},
        }
        spec = only(render(values), "DaemonSet")["spec"]["template"]["spec"]
        (container,) = spec["containers"]

        def pod_started(pod: Pod) -> None:
            (pods / f"{pod.namespace}_{pod.name}_{pod.uid}").mkdir()
            cgroups.append(pod.cgroup)

        def run(pod: Pod, role: str, mode: str, options: list[str], command: list[str]) -> str:
            name = f"procdelta-test-{suffix}-{role}-{pod.name}"
            names.append(name)
            cid = start(name, pod.cgroup, mode, options, command)
            (container_logs / f"{pod.name}_{pod.namespace}_{role}-{cid}.log").touch()
            return name

        neighbour = Pod("shop", f"checkout-{suffix}", str(uuid.uuid4()), "burstable")
        pod_started(neighbour)
        run(neighbour, "pause", "private", [], [BASE_IMAGE, "sleep", "infinity"])
        app = ["--cpus=0.2", f"--volume={control}:/ctl:rw"]
        run(neighbour, "app", "private", app, [BASE_IMAGE, "python3", "-c", BURNER])

        collectors = {}
        for mode in MODES:
            pod = Pod(
                "monitoring", f"procdelta-{mode}-{suffix}", str(uuid.uuid4()), qos_class(spec)
            )
            pod_started(pod)
            run(pod, "pause", mode, [], [BASE_IMAGE, "sleep", "infinity"])
            flags = podman_run(spec, free_port)
            started = time.monotonic()
            name = run(pod, "procdelta", mode, flags.options, [image, *flags.args])
            collectors[mode] = Collector(mode, pod, name, flags, started)

        waiting = dict(collectors)
        deadline = time.monotonic() + 60
        while waiting:
            for mode, collector in list(waiting.items()):
                with contextlib.suppress(OSError):
                    if complete(collector.page()):
                        seconds = time.monotonic() - collector.started
                        note(report, f"first complete page ({mode})", f"{seconds:.1f} s")
                        del waiting[mode]
            if waiting and time.monotonic() > deadline:
                logs = {
                    m: podman("logs", c.container, check=False).stderr for m, c in waiting.items()
                }
                raise AssertionError(f"no complete page within 60 s: {sorted(waiting)}; {logs}")
            time.sleep(0.05)
        yield Scene(container, neighbour, collectors, control)
    finally:
        if names:
            podman("rm", "--force", "--ignore", "--time=0", *names, check=False, timeout=120)
        left = [path for cgroup in cgroups for path in remove_pod_cgroup(cgroup)]
        shutil.rmtree(work, ignore_errors=True)
        assert left == [], f"pod cgroups left behind: {left}"


# -- what the collector serves -------------------------------------------------------------------


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_pods_are_named(scene, mode):
    """Every pod of the scene, named from the pod-log directory, with its cgroup fields
    (two passes after all were started: a cgroup's first sighting has no delta)."""
    collector = scene.collectors[mode]
    page = collector.next_pass(collector.page().passes + 1)
    for pod in (scene.neighbour, *(c.pod for c in scene.collectors.values())):
        for family in ("procdelta_footprint_processes", "procdelta_cgroup_cpu_nanos_total"):
            assert page.values(family, **pod.labels), f"no {family} of {pod.labels}"


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_health_answers_as_the_probes_ask(scene, mode):
    collector = scene.collectors[mode]
    for probe in ("readinessProbe", "livenessProbe"):
        url = probe_url(scene.daemonset_container, probe, collector.run)
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200, (probe, url)


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_host_paths_are_read_only_inside(scene, mode):
    """Its root and every host path, down to each cgroup controller of this hybrid host,
    are mounted read-only (the chart's readOnly and recursiveReadOnly)."""
    pid = scene.collectors[mode].state()["Pid"]
    mounts = {}
    with open(f"/proc/{pid}/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            mounts[fields[4]] = fields[5].split(",")
    assert "ro" in mounts["/"]
    targets = [m["mountPath"] for m in scene.daemonset_container["volumeMounts"]]
    below = {
        point: options for point, options in mounts.items() if point.startswith(tuple(targets))
    }
    assert {"/host/sys/fs/cgroup/cpu", "/host/sys/fs/cgroup/cpuacct"} <= set(below)
    assert "/host/sys/fs/cgroup/unified" in below
    assert {point for point, options in below.items() if "ro" not in options} == set()


def host_cgroups() -> set[str]:
    """Every cgroup of the host's v2 tree and v1 `cpu` hierarchy, as a path from its root."""
    found = set()
    for root in (hierarchy("v2"), hierarchy("cpu")):
        for directory, _, _ in os.walk(root):
            found.add("/" + os.path.relpath(directory, root).removeprefix("."))
    return found


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_no_label_names_a_cgroup_the_host_lacks(scene, mode):
    """Each cgroup group of a pass (a process seen in it) names a cgroup of the host: one
    there before the pass or still there after it (other tests make and remove cgroups)."""
    collector = scene.collectors[mode]
    before = host_cgroups()
    page = collector.next_pass(collector.page().passes + 1)  # a whole pass after `before`
    after = host_cgroups()
    labels = {
        labels["cgroup"]
        for name, labels, _ in page.samples
        if name == "procdelta_footprint_processes" and "cgroup" in labels
    }
    assert "/" in labels, "no cgroup group on the page"
    missing = sorted(labels - before - after)
    assert missing == [], f"labels naming no cgroup of the host: {missing}"


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_its_own_pod_holds_every_process_of_its_cgroup(scene, mode):
    """procdelta's own pod counts each process the host's cgroup tree puts in it: its own,
    its sibling's and, in the v1 hierarchies only, podman's conmon monitors."""
    collector = scene.collectors[mode]
    tree = hierarchy("cpu") + collector.pod.cgroup

    def stable() -> tuple[set[int], Page] | None:
        before = procs_below(tree)
        page = collector.next_pass(collector.page().passes)
        return (before, page) if procs_below(tree) == before else None

    pids, page = wait_until(stable, 30, "the pod's processes stable over a pass")
    conmons = procs_below(tree + "/conmon")
    assert conmons and len(pids) == 2 + len(conmons)  # procdelta, the pause-like sibling
    assert procs_below(hierarchy("v2") + collector.pod.cgroup) == pids - conmons
    footprint = page.values("procdelta_footprint_processes", uid=collector.pod.uid)
    assert footprint == [len(pids)], (
        f"procdelta_footprint_processes of its own pod: {footprint}, "
        f"the host's cgroup tree holds {len(pids)}"
    )


def kernel_counters(pod: Pod) -> dict[str, int]:
    """The kernel's files for what procdelta counts of a pod's cgroup (docs/reference.md
    §7): the CPU usage of the pod's directory (v2 `cpu.stat` where the hybrid host's v2
    tree has it, as here, else v1 `cpuacct.usage`), and the bandwidth counters summed
    over the pod's directory and every one below it in the v1 `cpu` hierarchy."""
    v2 = Path(hierarchy("v2") + pod.cgroup) / "cpu.stat"
    if v2.exists():
        stat = dict(line.split() for line in v2.read_text().splitlines())
        usage = int(stat["usage_usec"]) * 1000
    else:
        usage = int((Path(hierarchy("cpuacct") + pod.cgroup) / "cpuacct.usage").read_text())
    periods = throttled = throttled_ns = 0
    for directory, _, _ in os.walk(hierarchy("cpu") + pod.cgroup):
        stat = dict(
            line.split() for line in (Path(directory) / "cpu.stat").read_text().splitlines()
        )
        periods += int(stat["nr_periods"])
        throttled += int(stat["nr_throttled"])
        throttled_ns += int(stat["throttled_time"])
    return dict(zip(CGROUP_COUNTERS, (usage, periods, throttled, throttled_ns), strict=True))


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_neighbours_cpu_and_throttling_are_the_kernels(scene, mode):
    """Over one burst under its 0.2-CPU limit, the neighbour's cgroup CPU and throttling
    counters move exactly as the kernel's files do."""
    collector, pod = scene.collectors[mode], scene.neighbour
    # A short burst right after a pass, so that the next pass reads the pod's counters
    # settled (their usage moved since the pass before, so its bandwidth is read too).
    page = collector.next_pass(collector.page().passes)
    scene.burn(0.1)
    before_page = collector.next_pass(page.passes)
    before = kernel_counters(pod)
    ended = scene.burn(BURST_SECONDS)

    def settled() -> Page | None:
        page = collector.page()
        return page if page.value("procdelta_last_pass_timestamp_seconds") > ended + 0.5 else None

    after_page = wait_until(settled, 30, "a pass after the burst settled")
    after = kernel_counters(pod)
    time.sleep(0.3)
    assert kernel_counters(pod) == after, "the neighbour did not stay idle"
    seen = {
        name: int(after_page.value(name, **pod.labels) - before_page.value(name, **pod.labels))
        for name in CGROUP_COUNTERS
    }
    kernel = {name: after[name] - before[name] for name in CGROUP_COUNTERS}
    print(f"{mode}: procdelta {seen}, kernel {kernel}")
    assert kernel["procdelta_cpu_throttled_periods_total"] > 0
    assert kernel["procdelta_cgroup_cpu_nanos_total"] > 0.15e9  # 0.2 CPU for 3 s
    assert seen == kernel


# -- a real Prometheus with the chart's rules ------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus(scene, tmp_path_factory):
    """One Prometheus per collector, with the chart's rendered PrometheusRule, while the
    neighbour burns without pause."""
    directory = tmp_path_factory.mktemp("prometheus")
    rules = rule_file({}, directory / "chart.rules.yml")
    scene.trigger(600)  # busy until its container is removed
    servers: dict[str, Prometheus] = {}
    try:
        for mode, collector in scene.collectors.items():
            (directory / mode).mkdir()
            target = f"127.0.0.1:{collector.run.ports['metrics']}"
            servers[mode] = Prometheus(directory / mode, [target], rule_file=rules)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_rules_find_the_neighbour_throttled_not_starved(prometheus, scene, mode):
    server, pod = prometheus[mode], scene.neighbour
    selector = f'namespace="{pod.namespace}",pod="{pod.name}"'
    wait_until(
        lambda: server.query(f'ALERTS{{alertname="ProcdeltaPodCPUThrottled",{selector}}}'),
        90,
        "ProcdeltaPodCPUThrottled raised for the neighbour",
    )
    share = server.query(
        f"node_namespace_pod:procdelta_cpu_throttled_periods:ratio_rate5m{{{selector}}}"
    )
    assert len(share) == 1 and float(share[0]["value"][1]) > 0.5
    # its run delay alone would call it starved; its own limit explains the wait
    delay, on_cpu = (
        f"sum(rate(procdelta_{field}_total{{{selector}}}[{RULE_WINDOW}]))"
        for field in ("run_delay_nanos", "on_cpu_nanos")
    )
    starvation = server.query(f"{delay} / ({delay} + {on_cpu})")
    assert len(starvation) == 1 and float(starvation[0]["value"][1]) > 0.25
    held = server.query(
        f'node_namespace_pod:procdelta_cpu_wait:ratio_rate5m{{cause="throttled",{selector}}}'
    )  # the causes, taken in the image on the node, whichever cgroup namespace it runs in
    assert len(held) == 1 and float(held[0]["value"][1]) > 0.5
    assert not server.query(f'ALERTS{{alertname="ProcdeltaPodCPUStarved",{selector}}}')


# -- after 20 passes ------------------------------------------------------------------------------


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_after_twenty_passes_it_runs_within_its_memory_limit(scene, mode, report):
    collector = scene.collectors[mode]
    wait_until(lambda: collector.page().passes >= 20, 30 * INTERVAL, "20 passes")
    state = collector.state()
    assert state["Running"] and not state["OOMKilled"] and state["Restarting"] is False, state
    assert state["ExitCode"] == 0
    cid = podman("inspect", "--format", "{{.Id}}", collector.container).stdout.strip()
    memory = Path(hierarchies()["memory"] + collector.pod.cgroup) / f"libpod-{cid}"
    resources = scene.daemonset_container["resources"]
    limit = int(quantity(resources["limits"]["memory"]))
    request = int(quantity(resources["requests"]["memory"]))
    assert int((memory / "memory.limit_in_bytes").read_text()) == limit
    peak = int((memory / "memory.max_usage_in_bytes").read_text())
    stat = dict(line.split() for line in (memory / "memory.stat").read_text().splitlines())
    with open(f"/proc/{state['Pid']}/status") as status:
        vmrss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
    mib = 2**20
    note(
        report,
        f"memory after {collector.page().passes} passes ({mode})",
        f"VmRSS {vmrss / mib:.1f} MiB, cgroup rss {int(stat['rss']) / mib:.1f} MiB, "
        f"cgroup peak usage {peak / mib:.1f} MiB; request {request / mib:.0f} MiB, "
        f"limit {limit / mib:.0f} MiB",
    )
    assert peak < limit and vmrss < limit


# -- what a person runs in the pod (kubectl exec) ---------------------------------------------
# Last in the file: what these run inside the container adds to its memory cgroup's peak,
# which the test above reports.


def run_inside(collector: Collector, *argv: str) -> str:
    """A command run in procdelta's container as `kubectl exec` runs it: `podman exec`,
    in the container's namespaces and cgroup, with its environment."""
    return podman("exec", collector.container, *argv, timeout=120).stdout


FETCH = (
    "import sys, urllib.request; "
    "sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())"
)


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_the_processes_view_answers_inside_the_pod(scene, mode):
    """`/processes`, asked inside the container on the DaemonSet's port, lists procdelta's
    own process under the host's PID, with its 16-byte name and its pod's labels, and the
    pod's group with its own cgroup's fields."""
    collector = scene.collectors[mode]
    pid = collector.state()["Pid"]  # the container's first process, procdelta, on the host
    (port,) = [p["containerPort"] for p in scene.daemonset_container["ports"]]
    url = f"http://127.0.0.1:{port}/processes?uid={collector.pod.uid}&limit=0"

    def listed() -> dict | None:
        document = json.loads(run_inside(collector, "python3", "-c", FETCH, url))
        return document if any(row["pid"] == pid for row in document["processes"]) else None

    document = wait_until(listed, 30, f"procdelta's own process in /processes ({mode})")
    (row,) = [row for row in document["processes"] if row["pid"] == pid]
    assert row["comm"] == Path(f"/proc/{pid}/comm").read_text().rstrip("\n") == "procdelta"
    assert row["threads"] >= 2 and row["on_cpu_nanos"] > 0 and row["observed_nanos"] > 0
    assert {tuple(sorted(r["group"].items())) for r in document["processes"]} == {
        tuple(sorted(collector.pod.labels.items()))
    }
    (group,) = document["groups"]
    assert group["group"] == collector.pod.labels
    assert group["cgroup_cpu_nanos"] > 0  # the pod's own cgroup, of the same pass


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_a_command_run_in_the_pod_reads_the_hosts_proc_as_serve_does(scene, mode):
    """`procdelta once` run in the container takes the paths from the environment the
    DaemonSet gives it: the host's /proc, cgroups and pod names, so it sees the neighbour
    pod's processes (the container's own /proc shows none of them), named, and its own
    pod's cgroup."""
    collector = scene.collectors[mode]
    text = run_inside(
        collector, "procdelta", "once", "--interval=1", "--pods-only", "--format=json"
    )
    groups = {row["group"].get("uid"): row for row in json.loads(text)["groups"]}
    for pod in (scene.neighbour, collector.pod):
        assert groups[pod.uid]["group"] == pod.labels, f"no {pod.labels} in once's groups"
        assert groups[pod.uid]["processes"] >= 2, groups[pod.uid]  # each pod's two at least
    assert groups[collector.pod.uid]["cgroup_cpu_nanos"] > 0


@pytest.mark.container
@pytest.mark.parametrize("mode", MODES)
def test_top_from_the_pods_own_serve_runs_in_the_pod(scene, mode):
    """`procdelta top --from http://127.0.0.1:<port>`, run in the container as `kubectl
    exec` runs it, with nothing but the DaemonSet's environment: the pod's processes and
    its group line from serve's /processes; with `--threads`, procdelta's own threads,
    read from the host's /proc the environment names (the served PIDs are the host's)."""
    collector = scene.collectors[mode]
    pid = collector.state()["Pid"]
    (port,) = [p["containerPort"] for p in scene.daemonset_container["ports"]]
    labels = collector.pod.labels
    argv = ["procdelta", "top", f"--from=http://127.0.0.1:{port}",
            f"--pod={labels['namespace']}/{labels['pod']}", "--format=json"]  # fmt: skip

    def listed() -> dict | None:
        document = json.loads(run_inside(collector, *argv, "--limit=0"))
        return document if any(row["pid"] == pid for row in document["processes"]) else None

    document = wait_until(listed, 30, f"top --from listing procdelta ({mode})")
    assert all(row["group"] == labels for row in document["processes"])
    (group,) = document["groups"]
    assert group["group"] == labels and group["cgroup_cpu_nanos"] > 0
    threads = json.loads(run_inside(collector, *argv, "--threads", "--limit=0"))["threads"]
    own = [t for t in threads if t["pid"] == pid]
    assert len(own) >= 2 and {t["tid"] for t in own} >= {pid}, threads
    assert all(t["comm"] for t in own)


# -- the kernel's exit records (procdelta.exits) -----------------------------------------------

LIVES = """
import hashlib, os, time
while True:  # short processes one after the other, each 30 ms of its own CPU
    child = os.fork()
    if child == 0:
        until = time.process_time() + 0.03
        while time.process_time() < until:
            hashlib.sha256(b"x" * 4096).digest()
        os._exit(0)
    os.waitpid(child, 0)
"""


@pytest.fixture(scope="module")
def exits_scene(image, report):
    """A build-like pod whose work is short processes (a runtime-made pod, as kubelet lays
    it out), and two collectors run as the chart's DaemonSet runs them: with
    `procdelta.exits` (the host's PID and network namespaces, NET_ADMIN; listening on
    127.0.0.1 only, through `extraArgs`), and the default DaemonSet with the switch alone
    turned on (`extraEnv`), which lacks all three. {"pod": Pod, "listening": Collector,
    "refused": Collector}."""
    work = Path(tempfile.mkdtemp(prefix="procdelta-exits-"))
    suffix = uuid.uuid4().hex[:6]
    names: list[str] = []
    cgroups: list[str] = []
    try:
        pods, container_logs = work / "pods", work / "containers"
        pods.mkdir()
        container_logs.mkdir()

        def run(pod: Pod, role: str, options: list[str], command: list[str]) -> str:
            if pod.cgroup not in cgroups:
                (pods / f"{pod.namespace}_{pod.name}_{pod.uid}").mkdir()
                cgroups.append(pod.cgroup)
            name = f"procdelta-test-{suffix}-{role}-{pod.name}"
            names.append(name)
            cid = start(name, pod.cgroup, "private", options, command)
            (container_logs / f"{pod.name}_{pod.namespace}_{role}-{cid}.log").touch()
            return name

        build = Pod("ci", f"build-{suffix}", str(uuid.uuid4()), "burstable")
        run(build, "pause", [], [BASE_IMAGE, "sleep", "infinity"])
        run(build, "steps", [], [BASE_IMAGE, "python3", "-c", LIVES])
        paths = {"podLogs": str(pods), "containerLogs": str(container_logs)}
        port = free_port()
        variants = {
            "listening": {
                "procdelta": {"interval": INTERVAL, "exits": True},
                "service": {"port": port},
                "extraArgs": [f"--web.listen-address=127.0.0.1:{port}"],
            },
            "refused": {
                "procdelta": {"interval": INTERVAL},
                "extraEnv": [{"name": "PROCDELTA_COLLECTOR_EXITS", "value": "true"}],
            },
        }
        scene: dict = {"pod": build}
        for variant, values in variants.items():
            spec = only(render({**values, "hostPaths": paths}), "DaemonSet")["spec"]
            pod_spec = spec["template"]["spec"]
            pod = Pod("monitoring", f"procdelta-{variant}-{suffix}", str(uuid.uuid4()),
                      qos_class(pod_spec))  # fmt: skip
            run(pod, "pause", [], [BASE_IMAGE, "sleep", "infinity"])
            flags = podman_run(pod_spec, free_port)
            started = time.monotonic()
            name = run(pod, "procdelta", flags.options, [image, *flags.args])
            scene[variant] = Collector("private", pod, name, flags, started)
        for variant in variants:
            collector = scene[variant]
            wait_until(lambda c=collector: _quietly(lambda: complete(c.page())), 60,
                       f"a complete page ({variant})")  # fmt: skip
        yield scene
    finally:
        if names:
            podman("rm", "--force", "--ignore", "--time=0", *names, check=False, timeout=120)
        left = [path for cgroup in cgroups for path in remove_pod_cgroup(cgroup)]
        shutil.rmtree(work, ignore_errors=True)
        assert left == [], f"pod cgroups left behind: {left}"


def _quietly(check):
    """`check()`, or False while the collector is not answering yet."""
    try:
        return check()
    except OSError:
        return False


def counted_share(collector: Collector, pod: Pod, passes: int = 3) -> tuple[float, float]:
    """Over `passes` passes: the pod's summed on-CPU time over its cgroup's CPU time (both
    from the same pages, so from the same passes), and that cgroup time (s)."""
    selector = {"namespace": pod.namespace, "pod": pod.name}
    first = collector.next_pass(collector.page().passes)
    last = first
    while last.passes < first.passes + passes:
        last = collector.next_pass(last.passes)

    def delta(name: str) -> float:
        return sum(last.values(name, **selector)) - sum(first.values(name, **selector))

    cgroup = delta("procdelta_cgroup_cpu_nanos_total")
    return delta("procdelta_on_cpu_nanos_total") / cgroup, cgroup / 1e9


@pytest.mark.container
def test_with_the_exits_value_a_pod_of_short_processes_is_counted_whole(exits_scene, report):
    """The chart's `procdelta.exits`, run by podman as the rendered DaemonSet: the build
    pod's summed on-CPU time is its cgroup's, within 5 %; the default DaemonSet with the
    switch alone counts a fraction, and says at start-up why it hears no exit."""
    pod, listening, refused = exits_scene["pod"], exits_scene["listening"], exits_scene["refused"]
    share, cgroup_seconds = counted_share(listening, pod)
    without, _ = counted_share(refused, pod)
    note(report, "short processes counted with exit records", f"{share:.3f} of their cgroup's")
    note(report, "short processes counted without them", f"{without:.3f}")
    assert cgroup_seconds > 1.0  # the build pod ran: a core, for three passes of 2 s
    assert 0.95 <= share <= 1.05
    assert without < 0.5
    page = listening.page()
    assert page.value("procdelta_source_available", source="exits") == 1
    assert page.value("procdelta_exit_records_total", outcome="born") > 0
    assert page.value("procdelta_exit_record_overflows_total") == 0
    assert refused.page().value("procdelta_source_available", source="exits") == 0
    log = podman("logs", refused.container).stderr
    said = [line for line in log.splitlines() if "--collector.exits" in line]
    assert len(said) == 1 and "level=warn" in said[0] and "CAP_NET_ADMIN" in said[0], log
    quiet = podman("logs", listening.container).stderr
    assert "--collector.exits" not in quiet, quiet
