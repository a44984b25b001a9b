"""A real container runtime for the tests: podman on this host, a stand-in base image, the
image build, a pod spec's container as `podman run` flags, and kubelet-like pod cgroups
cleaned up after.

podman runs with runc (crun refuses a hybrid cgroup v1+v2 host) and the cgroupfs cgroup
manager (no systemd). A missing podman, runc or debootstrap fails the test that needs
it: .ci/run installs them.
"""

from __future__ import annotations

import configparser
import contextlib
import glob
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.needs import tool

ROOT = Path(__file__).parent.parent
BASE_IMAGE = "localhost/procdelta-test-base:bookworm"
"""The Dockerfile's BASE_IMAGE for the tests: made here from Debian's packages, since no
image registry is reachable, and kept in podman's store for the next run."""
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
GLOBAL_FLAGS = ("--runtime", "runc", "--cgroup-manager", "cgroupfs", "--log-level", "error")


def podman(
    *args: str, check: bool = True, timeout: float = 300, stdin=None
) -> subprocess.CompletedProcess:
    """`podman` with this host's global flags; a failure fails the test with its stderr."""
    binary = tool("podman", "podman")
    tool("runc", "runc")
    result = subprocess.run(
        [binary, *GLOBAL_FLAGS, *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert result.returncode == 0, (
            f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}"
        )
    return result


def ulimits() -> list[str]:
    """The host's own hard limits of open files and processes, for runc to set in the
    container. podman asks for more by default (1048576 files), which runc's init cannot
    set without CAP_SYS_RESOURCE where the host's hard limits are lower, as in this
    sandbox; processes at most 32768, the limit podman gives conmon here."""
    flags = []
    for name, limit, cap in (
        ("nofile", resource.RLIMIT_NOFILE, None),
        ("nproc", resource.RLIMIT_NPROC, 32768),
    ):
        hard = resource.getrlimit(limit)[1]
        if hard == resource.RLIM_INFINITY:
            hard = cap if cap is not None else -1
        elif cap is not None:
            hard = min(hard, cap)
        flags.append(f"--ulimit={name}={hard}:{hard}")
    return flags


# -- the base image ----------------------------------------------------------------------


def debian_mirror(sources: str = "/etc/apt") -> str:
    """The Debian mirror apt uses for the base suite (deb822 `.sources` or one-line
    `.list` files), else Debian's own."""
    for path in sorted(glob.glob(f"{sources}/sources.list.d/*.sources")):
        for stanza in Path(path).read_text().split("\n\n"):
            fields: dict[str, list[str]] = {}
            for line in stanza.splitlines():
                key, colon, value = line.partition(":")
                if colon and not key.startswith(("#", " ", "\t")):
                    fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []) and BASE_SUITE in fields.get("suites", []):
                return fields["uris"][0]
    for path in [f"{sources}/sources.list", *sorted(glob.glob(f"{sources}/sources.list.d/*.list"))]:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines():
                words = re.sub(r"\[[^]]*\]", "", line).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == BASE_SUITE:
                    return words[1]
    return "http://deb.debian.org/debian"


def ensure_base_image() -> str:
    """BASE_IMAGE, made once: Debian's minimal root with Python (debootstrap, ~1 minute),
    its package caches and documentation left out, imported into podman's store."""
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    debootstrap = tool("debootstrap", "debootstrap")
    root = tempfile.mkdtemp(prefix="procdelta-base-", dir="/var/tmp")
    try:
        made = subprocess.run(
            [debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
             BASE_SUITE, root, debian_mirror()],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert made.returncode == 0, f"debootstrap failed:\n{made.stdout[-3000:]}{made.stderr}"
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc",
                         "usr/share/man", "usr/share/locale"):  # fmt: skip
            for path in glob.glob(os.path.join(root, leftover, "*")):
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        with subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE) as tar:
            podman(
                "import",
                "--change", "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change", "ENV=LANG=C.UTF-8",
                "-", BASE_IMAGE,
                stdin=tar.stdout, timeout=600,
            )  # fmt: skip
        assert tar.returncode == 0, "tar of the base image's root failed"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return BASE_IMAGE


# -- the image -----------------------------------------------------------------------------

PIP_CONFIGS = (
    "/etc/pip.conf",
    "/etc/xdg/pip/pip.conf",
    "~/.config/pip/pip.conf",
    "~/.pip/pip.conf",
)
CA_CERTIFICATES = "/etc/ssl/certs"


def build_mounts() -> list[str]:
    """Read-only mounts that let the build's pip reach the package index as this machine's
    pip does: the CA certificates, pip's configuration files, and the local files and
    directories they name (a constraints file, a local index). They are mounted for the
    build's RUN steps only: nothing of this machine is copied into the image."""
    paths = [CA_CERTIFICATES] if os.path.isdir(CA_CERTIFICATES) else []
    for name in PIP_CONFIGS:
        path = os.path.expanduser(name)
        if not os.path.isfile(path):
            continue
        paths.append(path)
        config = configparser.ConfigParser(interpolation=None)
        config.read(path)
        for section in config.sections():
            for value in config[section].values():
                for word in value.split():
                    local = os.path.normpath(word.removeprefix("file://"))
                    if os.path.basename(local) == "simple":  # a local index: its pages
                        local = os.path.dirname(local)  # link to files beside simple/
                    if local.startswith("/") and os.path.exists(local):
                        paths.append(local)
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path.startswith(parent + "/") for parent in kept):
            kept.append(path)
    return [f"--volume={path}:{path}:ro" for path in kept]


def build_image(tag: str, base: str, version: str) -> None:
    """The repository's Dockerfile built as `tag` on `base`, without cached layers (no
    intermediate image is left in the store)."""
    podman(
        "build", "--layers=false", "--pull=never", *ulimits(), *build_mounts(),
        "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"VERSION={version}",
        "--file", str(ROOT / "Dockerfile"), "--tag", tag, str(ROOT),
        timeout=1200,
    )  # fmt: skip


def image_size(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout)


# -- a pod spec as `podman run` flags ------------------------------------------------------


class UnsupportedSpec(AssertionError):
    """A field or value of the pod spec that the translation does not know: a chart change
    that the container tests would otherwise silently not run."""


_UNITS = {
    "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity (`128Mi`, `20m`, `0.5`, `1G`) as a number."""
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if match is None or match[2] not in _UNITS:
        raise UnsupportedSpec(f"resource quantity {value!r}")
    return float(match[1]) * _UNITS[match[2]]


def qos_class(pod: dict) -> str:
    """kubelet's QoS class of a pod, which names its cgroup's parent."""
    resources = [c.get("resources", {}) for c in pod["containers"]]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "besteffort"
    for r in resources:
        limits, requests = r.get("limits", {}), r.get("requests", {})
        for name in ("cpu", "memory"):
            if name not in limits or quantity(requests.get(name, limits[name])) != quantity(
                limits[name]
            ):
                return "burstable"
    return "guaranteed"


def pod_cgroup(qos: str, uid: str) -> str:
    """The pod's cgroup as kubelet's cgroupfs driver lays it out."""
    return f"/kubepods/pod{uid}" if qos == "guaranteed" else f"/kubepods/{qos}/pod{uid}"


@dataclass
class PodmanRun:
    """What `podman run` needs from a pod spec: its options, the arguments after the image,
    and the host ports (on 127.0.0.1) of the container's ports, by number and by name."""

    options: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    ports: dict[int | str, int] = field(default_factory=dict)


# Pod fields with nothing to run on one node: scheduling, admission, image pulling.
_POD_CLUSTER_ONLY = frozenset(
    {"serviceAccountName", "tolerations", "nodeSelector", "affinity", "priorityClassName",
     "imagePullSecrets"}
)  # fmt: skip
_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}
# Pod fields whose only known value is what a container runtime does by default.
_POD_DEFAULTS = {
    "automountServiceAccountToken": False,  # no token volume
    "enableServiceLinks": False,  # no service environment variables
    "hostPID": False,
    "hostIPC": False,
    "hostNetwork": False,  # its own network namespace: ports are published
    "securityContext": {"seccompProfile": _DEFAULT_SECCOMP},  # podman's own profile
}
# Container fields the caller handles: the test runs its own image under its own name,
# and checks the probes itself (`probe_url`).
_CONTAINER_CALLER = frozenset(
    {"name", "image", "imagePullPolicy", "readinessProbe", "livenessProbe", "startupProbe"}
)


def mounts_below(path: str) -> list[str]:
    """The mount points strictly below `path` on this host, outermost first."""
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
            if point.startswith(path.rstrip("/") + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: (p.count("/"), p))


def podman_run(
    pod: dict,
    host_port: Callable[[], int],
    submounts: Callable[[str], list[str]] = mounts_below,
) -> PodmanRun:
    """The `podman run` flags of the pod spec's one container, field by field, the way
    kubelet and a CRI runtime apply them; `UnsupportedSpec` for anything else.

    Kubernetes names that have no podman flag:
    - `recursiveReadOnly` (Enabled, IfPossible): podman 4.3 has no `rro` mount option, and
      its recursive bind leaves each submount read-write. A runtime that supports it is
      emulated: each host mount below the volume gets a read-only bind of its own.
    - `resources.requests.cpu` is the cgroup's CPU weight (`--cpu-shares`, kubelet's
      formula); `requests.memory` only schedules. The memory limit allows no swap.
    - `readOnlyRootFilesystem` adds no tmpfs (podman's `--read-only` would).
    """
    run = PodmanRun()
    host_network = pod.get("hostNetwork") is True
    containers = pod.get("containers")
    if not containers or len(containers) != 1:
        raise UnsupportedSpec(f"pod with {len(containers or [])} containers (one is known)")
    volumes = {}
    for key, value in pod.items():
        if key == "containers" or key in _POD_CLUSTER_ONLY:
            continue
        if key == "volumes":
            volumes = {volume["name"]: volume for volume in value}
        elif (key, value) == ("hostPID", True):
            run.options.append("--pid=host")
        elif (key, value) == ("hostNetwork", True):
            run.options.append("--network=host")
        elif (key, value) == ("dnsPolicy", "ClusterFirstWithHostNet") and host_network:
            pass  # no cluster DNS on one node: the host's resolver, as podman's host network
        elif key not in _POD_DEFAULTS or value != _POD_DEFAULTS[key]:
            raise UnsupportedSpec(f"pod field {key}: {value!r}")
    (container,) = containers
    for key, value in container.items():
        if key in _CONTAINER_CALLER:
            continue
        if key == "args":
            run.args = [str(arg) for arg in value]
        elif key == "command":
            run.options.append(f"--entrypoint={json.dumps(value)}")
        elif key == "env":
            run.options += _env(value)
        elif key == "ports":
            for port in value:
                _port(port, None if host_network else host_port(), run)
        elif key == "securityContext":
            run.options += _security(value)
        elif key == "resources":
            run.options += _resources(value)
        elif key == "volumeMounts":
            for mount in value:
                run.options += _mount(mount, volumes, submounts)
        else:
            raise UnsupportedSpec(f"container field {key}: {value!r}")
    return run


def _env(variables: list[dict]) -> list[str]:
    flags = []
    for variable in variables:
        if set(variable) - {"name", "value"}:
            raise UnsupportedSpec(f"env {variable!r} (only name and value are known)")
        if "$(" in variable.get("value", ""):  # kubelet expands $(NAME); podman would not
            raise UnsupportedSpec(f"env {variable!r} (a $(NAME) reference)")
        flags.append(f"--env={variable['name']}={variable.get('value', '')}")
    return flags


def _port(port: dict, host: int | None, run: PodmanRun) -> None:
    """A container port published on 127.0.0.1:`host`; on the host's network (`host`
    None) it is the host's own port, as with hostNetwork."""
    if set(port) - {"name", "containerPort", "protocol"} or port.get("protocol", "TCP") != "TCP":
        raise UnsupportedSpec(f"port {port!r}")
    number = port["containerPort"]
    if host is None:
        host = number
    else:
        run.options.append(f"--publish=127.0.0.1:{host}:{number}/tcp")
    run.ports[number] = host
    if "name" in port:
        run.ports[port["name"]] = host


def _security(context: dict) -> list[str]:
    flags, user, group = [], None, None
    for key, value in context.items():
        if key == "capabilities":
            if set(value) - {"drop", "add"}:
                raise UnsupportedSpec(f"capabilities {value!r}")
            flags += [f"--cap-drop={name}" for name in value.get("drop", [])]
            flags += [f"--cap-add={name}" for name in value.get("add", [])]
        elif key == "allowPrivilegeEscalation" and isinstance(value, bool):
            flags += [] if value else ["--security-opt=no-new-privileges"]
        elif key == "privileged" and isinstance(value, bool):
            flags += ["--privileged"] if value else []
        elif key == "readOnlyRootFilesystem" and isinstance(value, bool):
            flags += ["--read-only", "--read-only-tmpfs=false"] if value else []
        elif key == "runAsUser" and isinstance(value, int):
            user = value
        elif key == "runAsGroup" and isinstance(value, int):
            group = value
        elif (key, value) not in (("runAsNonRoot", False), ("seccompProfile", _DEFAULT_SECCOMP)):
            raise UnsupportedSpec(f"securityContext {key}: {value!r}")
    if group is not None and user is None:
        raise UnsupportedSpec("runAsGroup without runAsUser")
    if user is not None:
        flags.append(f"--user={user}" if group is None else f"--user={user}:{group}")
    return flags


def _resources(resources: dict) -> list[str]:
    flags = []
    for kind, values in resources.items():
        for name, value in values.items():
            if (kind, name) == ("limits", "memory"):
                limit = int(quantity(value))
                flags += [f"--memory={limit}", f"--memory-swap={limit}"]
            elif (kind, name) == ("limits", "cpu"):
                flags.append(f"--cpus={quantity(value):g}")
            elif (kind, name) == ("requests", "cpu"):
                flags.append(f"--cpu-shares={max(2, round(quantity(value) * 1000) * 1024 // 1000)}")
            elif (kind, name) == ("requests", "memory"):
                pass
            else:
                raise UnsupportedSpec(f"resources.{kind}.{name}: {value!r}")
    return flags


_HOST_PATH_TYPES = frozenset({"", "Directory", "DirectoryOrCreate"})


def _mount(mount: dict, volumes: dict, submounts: Callable[[str], list[str]]) -> list[str]:
    if set(mount) - {"name", "mountPath", "readOnly", "recursiveReadOnly"}:
        raise UnsupportedSpec(f"volumeMount {mount!r}")
    volume = volumes.get(mount["name"])
    if volume is None or set(volume) != {"name", "hostPath"}:
        raise UnsupportedSpec(f"volume {volume!r} (only hostPath is known)")
    host = volume["hostPath"]
    kind = host.get("type", "")
    if set(host) - {"path", "type"} or kind not in _HOST_PATH_TYPES:
        raise UnsupportedSpec(f"hostPath {host!r}")
    source, target = host["path"], mount["mountPath"]
    if kind == "DirectoryOrCreate":
        os.makedirs(source, mode=0o755, exist_ok=True)
    elif kind == "Directory" and not os.path.isdir(source):
        raise AssertionError(f"hostPath {source} is no directory: kubelet would not start it")
    read_only = mount.get("readOnly", False)
    recursive = mount.get("recursiveReadOnly", "Disabled")
    if recursive not in ("Disabled", "IfPossible", "Enabled") or (
        recursive != "Disabled" and not read_only
    ):
        raise UnsupportedSpec(f"recursiveReadOnly {recursive!r} (readOnly {read_only})")
    options = "ro,rbind" if read_only else "rw,rbind"
    flags = [f"--volume={source}:{target}:{options}"]
    if recursive != "Disabled":
        for below in submounts(source):
            relative = os.path.relpath(below, source)
            flags.append(f"--volume={below}:{os.path.join(target, relative)}:ro,bind")
    return flags


def probe_url(container: dict, probe: str, run: PodmanRun) -> str:
    """The URL on 127.0.0.1 that a container's httpGet probe asks."""
    spec = container[probe]
    if "httpGet" not in spec or set(spec["httpGet"]) - {"path", "port", "scheme"}:
        raise UnsupportedSpec(f"{probe} {spec!r} (only httpGet is known)")
    get = spec["httpGet"]
    scheme = get.get("scheme", "HTTP").lower()
    return f"{scheme}://127.0.0.1:{run.ports[get['port']]}{get.get('path', '/')}"


# -- pod cgroups ------------------------------------------------------------------------------


def hierarchies() -> dict[str, str]:
    """The mount point of every cgroup hierarchy of this host: `v2`, each v1 controller
    (`cpu`, `memory`, ...) and named hierarchy (`name=systemd`)."""
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            before, _, after = line.partition(" - ")
            fstype, _, options = after.split()[:3]
            if fstype == "cgroup2":
                found.setdefault("v2", before.split()[4])
            elif fstype == "cgroup":
                for option in options.split(","):
                    if option not in ("rw", "ro") and not option.startswith("xattr"):
                        found.setdefault(option, before.split()[4])
    return found


def remove_pod_cgroup(relative: str, timeout: float = 10) -> list[str]:
    """Remove a pod's cgroup, what is below it, and its kubepods parents while they are
    empty, in every hierarchy, bottom-up; what is left of the pod's own after `timeout`
    seconds (a process still in it: conmon leaves a moment after `podman rm`) is returned."""
    roots = sorted(set(hierarchies().values()))
    pods = [os.path.join(root, relative.strip("/")) for root in roots]
    deadline = time.monotonic() + timeout
    while True:
        for pod in pods:
            for directory, _, _ in sorted(os.walk(pod), key=lambda w: -w[0].count("/")):
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
        left = [pod for pod in pods if os.path.isdir(pod)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pod in pods:
        parent = os.path.dirname(pod)
        while os.path.basename(parent) in ("burstable", "besteffort", "kubepods"):
            with contextlib.suppress(OSError):
                os.rmdir(parent)
            parent = os.path.dirname(parent)
    return left


def runtime_parents() -> list[str]:
    """podman's default cgroup parent (`libpod_parent`, cgroupfs manager) in each
    hierarchy where it exists now: its builds and runs without `--cgroup-parent` make it."""
    return [
        path
        for root in sorted(set(hierarchies().values()))
        if os.path.isdir(path := os.path.join(root, "libpod_parent"))
    ]


def remove_empty_tree(directory: str) -> None:
    """Remove a cgroup and every cgroup below it, bottom-up, where they hold no process."""
    for below, _, _ in sorted(os.walk(directory), key=lambda w: -w[0].count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(below)


def procs_below(directory: str) -> set[int]:
    """The processes in a cgroup and in every cgroup below it."""
    found: set[int] = set()
    for below, _, _ in os.walk(directory):
        with contextlib.suppress(FileNotFoundError), open(os.path.join(below, "cgroup.procs")) as f:
            found.update(int(pid) for pid in f.read().split())
    return found
