"""The cgroup catalogue: one real-looking `/proc/<pid>/cgroup` per kubelet layout."""

import os

import pytest

from collector.groups import Grouper, PodRef, classify, strip_namespace_prefix
from collector.podnames import PodNames

UID = "6f1d3b0e-2c4a-4e8b-9a51-0c7d2e4f8a10"
UID_ = UID.replace("-", "_")
STATIC = "3c0f41c7e8f0b7e2a1d4c5b6a7980f12"  # a static pod: the config hash, 32 hex digits
CID = "4b9e1c0d2a3f5e6d7c8b9a0f1e2d3c4b5a69788776655443322110ffeeddccbb"

V1_CONTROLLERS = [
    "12:pids:{p}",
    "11:cpu,cpuacct:{p}",
    "10:memory:{p}",
    "9:blkio:{p}",
    "1:name=systemd:{p}",
    "0::/",
]


def v1(path: str) -> bytes:
    return ("\n".join(line.format(p=path) for line in V1_CONTROLLERS) + "\n").encode()


def v2(path: str) -> bytes:
    return f"0::{path}\n".encode()


POD_LAYOUTS = [
    # (name, cgroup text, uid, qos, container id)
    (
        "v2 systemd containerd burstable",
        v2(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope"
        ),
        UID,
        "burstable",
        CID,
    ),
    (
        "v2 systemd containerd besteffort",
        v2(
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope"
        ),
        UID,
        "besteffort",
        CID,
    ),
    (
        "v2 systemd guaranteed, directly under kubepods",
        v2(f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope"),
        UID,
        "guaranteed",
        CID,
    ),
    (
        "v2 systemd CRI-O",
        v2(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"crio-{CID}.scope"
        ),
        UID,
        "burstable",
        CID,
    ),
    (
        "v2 systemd CRI-O with crun's nested container cgroup",
        v2(f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope/container"),
        UID,
        "guaranteed",
        CID,
    ),
    (
        "v2 systemd Docker (cri-dockerd)",
        v2(
            f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
            f"docker-{CID}.scope"
        ),
        UID,
        "besteffort",
        CID,
    ),
    (
        "v2 cgroupfs burstable",
        v2(f"/kubepods/burstable/pod{UID}/{CID}"),
        UID,
        "burstable",
        CID,
    ),
    (
        "v2 cgroupfs guaranteed",
        v2(f"/kubepods/pod{UID}/{CID}"),
        UID,
        "guaranteed",
        CID,
    ),
    (
        "v1 cgroupfs besteffort (every controller)",
        v1(f"/kubepods/besteffort/pod{UID}/{CID}"),
        UID,
        "besteffort",
        CID,
    ),
    (
        "v1 systemd containerd",
        v1(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope"
        ),
        UID,
        "burstable",
        CID,
    ),
    (
        "v1 name=systemd form slice:runtime:id",
        (
            "11:cpu,cpuacct:/\n"
            "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID_}.slice:cri-containerd:{CID}\n"
            "0::/\n"
        ).encode(),
        UID,
        "burstable",
        CID,
    ),
    (
        # runc's systemd form made literally below the runtime's own cgroup in every v1
        # controller (kubernetes#106514; cAdvisor's `id` labels, coroot-node-agent's and
        # kepler's catalogues)
        "v1 systemd containerd below containerd.service",
        v1(
            f"/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:"
            f"cri-containerd:{CID}"
        ),
        UID,
        "burstable",
        CID,
    ),
    (
        "v1 systemd containerd below kuberuntime.slice's containerd.service",
        v1(f"/kuberuntime.slice/containerd.service/kubepods-pod{UID_}.slice:cri-containerd:{CID}"),
        UID,
        "guaranteed",
        CID,
    ),
    (
        "v1 systemd containerd at the top of a v1 hierarchy",
        (
            f"11:cpu,cpuacct:/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}\n"
            f"10:memory:/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}\n"
            "1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
            "0::/\n"
        ).encode(),
        UID,
        "besteffort",
        CID,
    ),
    (
        "v1 CRI-O below crio.service",
        v1(f"/system.slice/crio.service/kubepods-burstable-pod{UID_}.slice:crio:{CID}"),
        UID,
        "burstable",
        CID,
    ),
    (
        "static pod UID, systemd",
        v2(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/"
            f"cri-containerd-{CID}.scope"
        ),
        STATIC,
        "burstable",
        CID,
    ),
    (
        "static pod UID, cgroupfs guaranteed",
        v1(f"/kubepods/pod{STATIC}/{CID}"),
        STATIC,
        "guaranteed",
        CID,
    ),
    (
        "seen from another cgroup namespace (leading /..)",
        v2(f"/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"),
        UID,
        "burstable",
        CID,
    ),
    (
        "seen from another cgroup namespace, cgroupfs",
        v2(f"/../../../kubepods/besteffort/pod{UID}/{CID}"),
        UID,
        "besteffort",
        CID,
    ),
    (
        "kind: nested kubelet, systemd",
        v2(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope"
        ),
        UID,
        "besteffort",
        CID,
    ),
    (
        "kind: nested kubelet, guaranteed",
        v2(
            f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope"
        ),
        UID,
        "guaranteed",
        CID,
    ),
    (
        "kind: nested kubelet, cgroupfs",
        v2(f"/kubelet/kubepods/burstable/pod{UID}/{CID}"),
        UID,
        "burstable",
        CID,
    ),
    (
        "cgroupfs, guaranteed under a nested kubelet's prefixed kubepods",
        v2(f"/kubelet/kubelet-kubepods/pod{UID}/{CID}"),
        UID,
        "guaranteed",
        CID,
    ),
    (
        "a process in the pod cgroup itself, no container below",
        v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
        UID,
        "burstable",
        "",
    ),
]


@pytest.mark.parametrize(
    ("text", "uid", "qos", "cid"),
    [layout[1:] for layout in POD_LAYOUTS],
    ids=[layout[0] for layout in POD_LAYOUTS],
)
def test_pod_layouts(text, uid, qos, cid):
    classified = classify(text)
    assert classified.pod is not None
    assert (classified.pod.uid, classified.pod.qos, classified.pod.container_id) == (uid, qos, cid)


NOT_PODS = [
    (
        "CRI-O conmon is the runtime's, systemd",
        v2(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"crio-conmon-{CID}.scope"
        ),
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"crio-conmon-{CID}.scope",
    ),
    (
        "CRI-O conmon is the runtime's, v1 cgroupfs",
        v1(f"/kubepods/burstable/pod{UID}/crio-conmon-{CID}"),
        f"/kubepods/burstable/pod{UID}/crio-conmon-{CID}",
    ),
    (
        "CRI-O conmon on v2, a pod's path on v1 cpu: the runtime's still (v2 decides)",
        f"4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n"
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"crio-conmon-{CID}.scope\n".encode(),
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"crio-conmon-{CID}.scope",
    ),
    (
        "host service, v2",
        v2("/system.slice/containerd.service"),
        "/system.slice/containerd.service",
    ),
    ("kubelet itself", v2("/system.slice/kubelet.service"), "/system.slice/kubelet.service"),
    ("root cgroup", v2("/"), "/"),
    (
        "v1 host process: the cpu controller path",
        v1("/system.slice/sshd.service"),
        "/system.slice/sshd.service",
    ),
    (
        "hybrid: v2 path wins over a root v1 cpu path",
        b"11:cpu,cpuacct:/\n1:name=systemd:/user.slice\n0::/user.slice/session-1.scope\n",
        "/user.slice/session-1.scope",
    ),
    (
        "hybrid: v1 cpu path wins over a root v2 path",
        b"11:cpu,cpuacct:/batch/job7\n1:name=systemd:/\n0::/\n",
        "/batch/job7",
    ),
    ("a directory merely named like a pod", v2("/mypod/podcast"), "/mypod/podcast"),
    ("a uid-shaped name outside the pod segment", v2(f"/data/{UID}"), f"/data/{UID}"),
    # A pod segment where kubelet puts no pods: made by whoever may make a cgroup (a
    # systemd delegation, a rootless runtime), it speaks for no pod.
    (
        "a pod segment in a user's delegated cgroup",
        v2(f"/user.slice/user-1000.slice/user@1000.service/pod{UID}/{CID}"),
        f"/user.slice/user-1000.slice/user@1000.service/pod{UID}/{CID}",
    ),
    (
        "a systemd pod slice below a service",
        v2(f"/system.slice/evil.service/kubepods-burstable-pod{UID_}.slice"),
        f"/system.slice/evil.service/kubepods-burstable-pod{UID_}.slice",
    ),
    (
        "a kubepods directory below a delegation",
        v2(f"/user.slice/u.service/kubepods/burstable/pod{UID}/{CID}"),
        f"/user.slice/u.service/kubepods/burstable/pod{UID}/{CID}",
    ),
    ("a pod at the top of the hierarchy", v2(f"/pod{UID}/{CID}"), f"/pod{UID}/{CID}"),
    (
        "a pod below a non-QoS directory of kubepods",
        v2(f"/kubepods/mine/pod{UID}/{CID}"),
        f"/kubepods/mine/pod{UID}/{CID}",
    ),
    (
        "runc's form below a rootless containerd in a user's delegation",
        v1(
            "/user.slice/user-1000.slice/user@1000.service/containerd.service/"
            f"kubepods-pod{UID_}.slice:cri-containerd:{CID}"
        ),
        "/user.slice/user-1000.slice/user@1000.service/containerd.service/"
        f"kubepods-pod{UID_}.slice:cri-containerd:{CID}",
    ),
    (
        "runc's form below a delegated service that is no runtime",
        v1(f"/system.slice/ci-runner.service/kubepods-pod{UID_}.slice:cri-containerd:{CID}"),
        f"/system.slice/ci-runner.service/kubepods-pod{UID_}.slice:cri-containerd:{CID}",
    ),
    (
        "runc's form naming another runtime than the service's",
        v1(f"/system.slice/docker.service/kubepods-pod{UID_}.slice:cri-containerd:{CID}"),
        f"/system.slice/docker.service/kubepods-pod{UID_}.slice:cri-containerd:{CID}",
    ),
    (
        "runc's form below a directory of containerd.service's own",
        v1(f"/system.slice/containerd.service/mine/kubepods-pod{UID_}.slice:cri-containerd:{CID}"),
        f"/system.slice/containerd.service/mine/kubepods-pod{UID_}.slice:cri-containerd:{CID}",
    ),
    (
        "a pod slice without runc's form below containerd.service",
        v1(f"/system.slice/containerd.service/kubepods-pod{UID_}.slice"),
        f"/system.slice/containerd.service/kubepods-pod{UID_}.slice",
    ),
    (
        "v1: a pod slice in a user's name=systemd path",
        b"11:cpu,cpuacct:/user.slice\n"
        + f"1:name=systemd:/user.slice/kubepods-pod{UID_}.slice:cri-containerd:{CID}\n".encode()
        + b"0::/user.slice\n",
        "/user.slice",
    ),
]


@pytest.mark.parametrize(
    ("text", "cgroup"), [c[1:] for c in NOT_PODS], ids=[c[0] for c in NOT_PODS]
)
def test_non_pod_groups(text, cgroup):
    classified = classify(text)
    assert classified.pod is None
    assert classified.cgroup == cgroup


@pytest.mark.parametrize(
    "text",
    [v2("/../../system.slice/cron.service"), v2("/.."), v1("/../x")],
    ids=["a service", "the namespace's parent", "v1"],
)
def test_a_path_from_another_namespace_names_no_cgroup_unless_placed(text):
    """Read in the host's namespace, a `/..` path has no host path: no label from it
    (tests/unit/test_cgroupns.py places such paths through a namespace's root)."""
    classified = classify(text)
    assert classified.pod is None
    assert classified.cgroup is None


def test_a_pod_at_the_top_of_the_readers_namespace_is_kubelets():
    """A kubelet nested in a node container (kind) puts its pods at the top of that
    container's cgroup namespace: found at start-up, it is a top like the host's root."""
    from collector.cgroupns import CgroupNamespace

    root = "/system.slice/docker-0123.scope"
    inside = CgroupNamespace({0: root})
    path = f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/x-{CID}.scope"
    assert classify(v2(path), inside).pod == PodRef(UID, "guaranteed", CID)
    # the same directories elsewhere below that container are no kubelet's
    elsewhere = CgroupNamespace({0: "/system.slice"})
    assert classify(v2("/../docker-0123.scope/app" + path), elsewhere).pod is None


def test_kubelet_places_pods_below_its_roots_only():
    from collector.groups import kubelet_placed

    assert kubelet_placed(["kubepods"]) and kubelet_placed(["kubepods", "burstable"])
    assert kubelet_placed(["kubepods.slice", "kubepods-besteffort.slice"])
    assert kubelet_placed(["kubelet", "kubelet-kubepods"])
    assert not kubelet_placed([]) and not kubelet_placed(["user.slice", "kubepods"])
    assert not kubelet_placed(["burstable"])  # a QoS directory at the top is no kubelet's
    # seen from a namespace whose root is unknown, the top is lost: what is left must be
    # kubelet's own directories
    assert kubelet_placed([], relative=True) and kubelet_placed(["burstable"], relative=True)
    assert not kubelet_placed(["user.slice", "kubepods"], relative=True)


def test_a_cgroup_name_may_hold_a_carriage_return():
    """Lines of `/proc/<pid>/cgroup` end at LF alone: a CR in a cgroup's name is its own,
    and does not cut its process's path (which would hide it from every sum)."""
    classified = classify(b"0::/system.slice/we\rird.service\n")
    assert classified.cgroup == "/system.slice/we\rird.service"
    for name in ("\x0b", "\x0c", "\x1c", "\x85", "\u2028"):
        text = f"0::/a{name}b\n".encode()
        assert classify(text).cgroup == f"/a{name}b", repr(name)


@pytest.mark.parametrize(
    ("names", "labels"),
    [
        ([b"/bad\xff", b"/bad\\xff"], ["/bad\\xff", "/bad\\\\xff"]),
        ([b"/a\\x2d", b"/a\x2d"], ["/a\\x2d", "/a-"]),  # systemd's escapes stay themselves
        ([b"/c\\\xe9", b"/c\\\\xe9"], ["/c\\\\\\xe9", "/c\\\\\\\\xe9"]),
        ([b"/caf\xc3\xa9", b"/caf\xe9"], ["/caf\u00e9", "/caf\\xe9"]),
    ],
)
def test_names_not_in_utf8_keep_apart_from_their_escaped_spelling(names, labels, tmp_path):
    """A cgroup's name is bytes; a label is UTF-8. A byte that is not UTF-8 is written
    `\\xNN`, and a name that reads like that (a backslash, x, 80 to ff) has its
    backslashes doubled: no two names share a label, and every label is UTF-8."""
    grouper = Grouper(PodNames(str(tmp_path), str(tmp_path)))
    got = [grouper.group_of(b"0::" + name + b"\n").label_dict()["cgroup"] for name in names]
    assert got == labels
    assert len(set(got)) == len(names)
    for label in got:
        label.encode("utf-8")


@pytest.mark.parametrize(
    ("path", "stripped"),
    [("/../../a/b", "/a/b"), ("/..", "/"), ("/a/..", "/a/.."), ("/..x/y", "/..x/y"), ("/", "/")],
)
def test_strip_namespace_prefix(path, stripped):
    assert strip_namespace_prefix(path) == stripped


@pytest.fixture
def kubelet_logs(tmp_path):
    pods = tmp_path / "pods"
    containers = tmp_path / "containers"
    pods.mkdir()
    containers.mkdir()
    (pods / f"shop_cart-7d9f_{UID}").mkdir()
    (pods / f"kube-system_etcd-node1_{STATIC}").mkdir()
    (pods / "not-a-pod-dir").mkdir()
    (containers / f"cart-7d9f_shop_cart-api-{CID}.log").touch()
    return PodNames(str(pods), str(containers))


def test_pod_names_from_the_nodes_files(kubelet_logs):
    kubelet_logs.refresh()
    assert kubelet_logs.pod(UID).namespace == "shop"
    assert kubelet_logs.pod(UID).name == "cart-7d9f"
    assert kubelet_logs.pod(STATIC).name == "etcd-node1"
    assert kubelet_logs.container(CID) == "cart-api"
    assert kubelet_logs.pod("0" * 32) is None


def test_grouper_labels(kubelet_logs):
    kubelet_logs.refresh()
    text = v2(f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope")
    assert Grouper(kubelet_logs).group_of(text).label_dict() == {
        "namespace": "shop",
        "pod": "cart-7d9f",
        "uid": UID,
        "qos": "guaranteed",
    }
    per_container = Grouper(kubelet_logs, per_container=True).group_of(text).label_dict()
    assert per_container["container"] == "cart-api"
    assert per_container["container_id"] == CID
    assert Grouper(kubelet_logs, pods_only=True).group_of(v2("/system.slice")) is None
    assert Grouper(kubelet_logs).group_of(v2("/system.slice")).label_dict() == {
        "cgroup": "/system.slice"
    }


def test_unknown_pod_still_exports_with_its_uid(kubelet_logs):
    kubelet_logs.refresh()
    other = "11111111-2222-3333-4444-555555555555"
    labels = Grouper(kubelet_logs).group_of(v2(f"/kubepods/besteffort/pod{other}/{CID}"))
    assert labels.label_dict() == {"namespace": "", "pod": "", "uid": other, "qos": "besteffort"}


def test_pod_names_follow_changes(kubelet_logs, tmp_path):
    kubelet_logs.refresh()
    new_uid = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    (tmp_path / "pods" / f"web_front-1_{new_uid}").mkdir()
    # mtime granularity can hide a change made in the same instant; make it visible.
    os.utime(tmp_path / "pods", ns=(0, 1))
    kubelet_logs.refresh()
    assert kubelet_logs.pod(new_uid).name == "front-1"


def test_a_pods_group_follows_its_names_and_its_qos_class(kubelet_logs, tmp_path):
    """`Grouper.pod_group` remembers a pod's group, and forgets it when kubelet's names
    change (`refresh`) or the pod's directory tells another QoS class (`learn_qos`)."""
    grouper = Grouper(kubelet_logs, per_container=True)
    grouper.refresh()
    pod = PodRef(UID, "burstable", CID)
    assert grouper.pod_group(pod) is grouper.pod_group(pod)
    assert grouper.pod_group(pod).label_dict()["pod"] == "cart-7d9f"
    (tmp_path / "pods" / f"shop_cart-7d9f_{UID}").rename(tmp_path / "pods" / f"shop_cart-9x_{UID}")
    (tmp_path / "containers" / f"cart-7d9f_shop_cart-api-{CID}.log").rename(
        tmp_path / "containers" / f"cart-9x_shop_cart-web-{CID}.log"
    )
    for directory in ("pods", "containers"):
        os.utime(tmp_path / directory, ns=(0, 1))  # a change in the same instant, made visible
    grouper.refresh()
    labels = grouper.pod_group(pod).label_dict()
    assert (labels["pod"], labels["container"], labels["qos"]) == (
        "cart-9x",
        "cart-web",
        "burstable",
    )
    grouper.learn_qos([PodRef(UID, "guaranteed", "")])
    assert grouper.pod_group(pod).label_dict()["qos"] == "guaranteed"
