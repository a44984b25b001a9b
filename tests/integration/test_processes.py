"""The processes view (docs/reference.md §8): the query, the view made from what a pass
kept, and `/processes` on serve's listener, its limits, auth and switch."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

import bcrypt
import pytest

from collector import webconfig
from collector.admission import MAX_ASIDE, Limits
from collector.exporter import VIEWS_PER_SECOND, Budget, ViewAnswers, json_by_rows, make_server
from collector.groups import Group
from collector.model import FIELD_NAMES, CgroupFields, Fields, ProcessReading
from collector.passloop import PassLoop
from collector.processes import (
    DEFAULT_LIMIT,
    SORT_FIELDS,
    STORAGE_FIELDS,
    PassView,
    ProcessTable,
    Query,
    QueryError,
)
from collector.readings import Carried
from collector.tracker import CarriedDelta, ProcessDelta
from collector.wiring import Options, build_engine
from tests.cgroups import Workload, cgroup
from tests.integration.test_serve import CountingEngine, serving
from tests.net import free_port, request, start_serve, wait_until
from tests.readings import process_reading, thread_reading


def test_a_query_defaults_to_the_twenty_longest_waits():
    assert Query.parse("") == Query((), "run_delay_nanos", DEFAULT_LIMIT)
    assert DEFAULT_LIMIT == 20


def test_a_query_takes_label_filters_a_sort_and_a_limit():
    query = Query.parse("namespace=shop&pod=db-0&sort=on_cpu_nanos&limit=5")
    assert query == Query((("namespace", "shop"), ("pod", "db-0")), "on_cpu_nanos", 5)
    assert Query.parse("cgroup=%2Fsystem.slice%2Fcron.service").filters == (
        ("cgroup", "/system.slice/cron.service"),
    )
    assert Query.parse("limit=0").limit is None  # all of them
    assert Query.parse("pod=").filters == (("pod", ""),)  # a pod whose name was not found
    assert set(SORT_FIELDS) == set(FIELD_NAMES) - {"processes"}


@pytest.mark.parametrize(
    "query, words",
    [
        ("sort=processes", ["sort", "run_delay_nanos"]),
        ("sort=cpu", ["sort", "on_cpu_nanos"]),
        ("limit=-1", ["limit", "integer"]),
        ("limit=ten", ["limit", "integer"]),
        ("limit=%EF%BC%91", ["limit", "integer"]),  # a fullwidth digit: no
        ("limit=100001", ["limit", "100000"]),
        ("pod=a&pod=b", ["pod", "twice"]),
        ("node=n1", ["unknown parameter", "namespace"]),
        ("pod", ["malformed"]),
    ],
)
def test_a_bad_query_says_why_in_one_line(query, words):
    with pytest.raises(QueryError) as raised:
        Query.parse(query)
    message = str(raised.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def _labels(rows: list[dict]) -> dict[tuple, Fields]:
    """The processes' fields summed by their group's labels."""
    sums: dict[tuple, Fields] = {}
    for row in rows:
        key = tuple(sorted(row["group"].items()))
        fields = Fields(1, *(row[name] for name in SORT_FIELDS))
        sums.setdefault(key, Fields()).add(fields)
    return sums


def test_every_groups_processes_add_up_to_its_interval_on_this_node(tmp_path):
    """Over the real /proc, three passes: each group's listed processes sum to the group's
    interval, field by field — the processes carried over unread (an idle cgroup's sleeper,
    by the third pass) included, with zero counters. No pass reads a process whole for the
    K-pass bound here: with it, the sleeper's PID is due in one pass in 64, and read."""
    with (
        cgroup("v2", f"procdelta-view-{uuid.uuid4().hex[:8]}/idle") as idle_path,
        Workload(idle_path, "--idle", "1") as idle,
    ):
        options = Options(
            pod_logs=str(tmp_path), container_logs=str(tmp_path), whole_read_passes=None
        )
        engine = build_engine(options)
        for _ in range(3):
            result = engine.run_pass()
            time.sleep(0.2)
        result = engine.run_pass()
    view = PassView.of(result)
    document = view.document(Query(limit=None))
    sums = _labels(document["processes"])
    intervals = {tuple(sorted(g.labels)): fields for g, fields in result.intervals.items()}
    assert sums == intervals
    carried = {pid for block in result.processes.carried for pid in block.readings}
    assert idle.pid in carried, "the idle cgroup's process was read, not carried"
    (row,) = [p for p in document["processes"] if p["pid"] == idle.pid]
    assert row["on_cpu_nanos"] == row["run_delay_nanos"] == row["cpu_user_nanos"] == 0
    assert row["observed_nanos"] > 0 and row["comm"].startswith("python")
    assert document["interval_seconds"] == result.interval_ns / 1e9
    assert document["timestamp"] == result.finished_at


def test_the_view_sorts_limits_and_lists_the_groups_it_matches(tmp_path):
    with (
        cgroup("v2", f"procdelta-view-{uuid.uuid4().hex[:8]}/busy") as busy_path,
        Workload(busy_path, "--busy", "1") as busy,
    ):
        options = Options(pod_logs=str(tmp_path), container_logs=str(tmp_path))
        engine = build_engine(options)
        engine.run_pass()
        time.sleep(0.5)
        result = engine.run_pass()
    view = PassView.of(result)
    everyone = view.document(Query(limit=None))["processes"]
    (labels,) = [p["group"] for p in everyone if p["pid"] == busy.pid]
    assert labels["cgroup"].endswith(busy_path.rsplit("/", 2)[-2] + "/busy")
    mine = view.document(Query(tuple(labels.items()), "on_cpu_nanos", 5))
    assert [p["pid"] for p in mine["processes"]] == [busy.pid]
    (group,) = mine["groups"]
    assert group["group"] == labels
    assert group["processes"] == 1
    assert group["on_cpu_nanos"] == mine["processes"][0]["on_cpu_nanos"] > 0.2e9
    assert "cgroup_cpu_nanos" in group and "run_delay_neighbours_nanos" in group
    for sort in ("on_cpu_nanos", "run_delay_nanos", "observed_nanos"):
        rows = view.document(Query(sort=sort, limit=7))["processes"]
        assert len(rows) == 7
        keys = [(-p[sort], p["pid"]) for p in rows]
        assert keys == sorted(keys)
        everything = view.document(Query(sort=sort, limit=None))["processes"]
        assert rows == everything[:7]
    assert view.document(Query((("namespace", "nowhere"),)))["processes"] == []
    assert PassView().document(Query()) == {
        "interval_seconds": None,
        "timestamp": None,
        "processes": [],
        "groups": [],
    }


@pytest.fixture(scope="module")
def secret_serve():
    """`procdelta serve` beside a process whose command line and environment hold a
    secret; (port, the process, the secret)."""
    secret = f"hunter2-{uuid.uuid4().hex}"
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", f"--password={secret}"],
        env={"API_TOKEN": secret},
    )
    port = free_port()
    serve = start_serve(port, interval="0.5")
    try:
        wait_until(lambda: request(port, "/healthz")[0] == 200, 30, "serve healthy")
        yield port, sleeper, secret
    finally:
        for process in (serve, sleeper):
            process.kill()
            process.wait(10)


def test_processes_are_served_by_comm_never_by_command_line(secret_serve):
    port, sleeper, secret = secret_serve

    def listed():
        status, headers, body = request(port, "/processes?limit=0")
        assert status == 200 and headers["Content-Type"] == "application/json"
        document = json.loads(body)
        found = [p for p in document["processes"] if p["pid"] == sleeper.pid]
        return (found, body) if found else None

    (row,), body = wait_until(listed, 20, "the sleeper listed")
    assert row["comm"].startswith("python")
    assert row["threads"] == 1 and row["group"]
    assert secret.encode() not in body
    assert b"--password" not in body
    # the page, the health answer and the landing page do not carry it either
    for path in ("/metrics", "/", "/processes?sort=observed_nanos&limit=0"):
        assert secret.encode() not in request(port, path)[2]
    assert b"/processes" in request(port, "/")[2]


def test_a_bad_parameter_is_a_400_with_one_line(secret_serve):
    port = secret_serve[0]
    status, _, body = request(port, "/processes?sort=cpu")
    assert status == 400
    assert body.decode().count("\n") == 1 and "sort" in body.decode()


def test_every_parameter_is_bounded_before_it_is_parsed_and_never_echoed_raw(caplog):
    """A `limit` of thousands of digits is a 400 like any other bad one (it was a 500,
    and an error line each time: Python's int() refuses more than 4,300 digits); what a
    400 names of the client's input is cut short and has its control characters escaped
    (a terminal's escape sequences do not reach whoever reads it); nothing is logged at
    error level."""
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    escape = urllib.parse.quote("\x1b]0;pwned\x07\x1b[2J<script>")
    with caplog.at_level("INFO"), serving(loop) as port:
        for _ in range(20):
            status, headers, body = request(port, "/processes?limit=" + "9" * 5000)
            assert status == 400 and body.count(b"\n") == 1 and len(body) < 200, body[:200]
            assert headers["X-Content-Type-Options"] == "nosniff"
        assert request(port, "/processes?limit=" + "0" * 30 + "5")[0] == 200
        assert request(port, "/processes?limit=100001")[0] == 400
        assert request(port, "/processes?limit=100000")[0] == 200  # the bound itself
        for query in (f"sort={escape}", f"{escape}=1"):
            status, _, body = request(port, "/processes?" + query)
            assert status == 400 and b"\x1b" not in body and b"\\x1b" in body, body
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_the_answer_is_the_encoders_bytes_made_a_row_at_a_time():
    document = {
        "interval_seconds": 1.5, "timestamp": None, "withheld": ["read_bytes"],
        "processes": [{"pid": 1, "comm": "a\x1b\u00e9", "group": {"pod": "p"}}] * 3,
        "groups": [],
    }  # fmt: skip
    assert json_by_rows(document) == (json.dumps(document) + "\n").encode()


def test_a_view_is_made_once_a_pass_for_each_query():
    """However many ask it, a query's view is made once a pass (the same bytes after); a
    new pass, or another query, makes it anew; the answers held are bounded."""
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    made = []
    real = PassView.document

    def counted(self, *args, **kwargs):
        made.append(args[0])
        return real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PassView, "document", counted)
        with serving(loop) as port:
            first = [request(port, "/processes?limit=0")[2] for _ in range(5)]
            assert len(made) == 1 and len(set(first)) == 1
            request(port, "/processes?limit=3")
            assert len(made) == 2
            loop.run_pass()
            request(port, "/processes?limit=0")
            assert len(made) == 3
    answers = ViewAnswers(count=2, size=10)
    for n in range(4):
        answers.put((1, n), b"x" * 4)
    assert answers.get((1, 0)) is None and answers.get((1, 3)) == b"xxxx"  # two, the newest
    answers.put((1, 9), b"y" * 20)  # alone above the size: kept, the others dropped
    assert answers.get((1, 3)) is None and answers.get((1, 9)) == b"y" * 20
    answers.put((2, 0), b"z")  # another pass
    assert answers.get((1, 9)) is None and answers.get((2, 0)) == b"z"
    answers.put((3, 1), b"w")  # and the next drops it
    assert answers.get((2, 0)) is None


ALICE = {"Authorization": "Basic " + base64.b64encode(b"alice:s3cret").decode()}
"""The credentials of the user `machine_passes_and_a_user` writes."""


def machine_passes_and_a_user(tmp_path):
    """Two real passes over this machine's processes, 0.2 s apart, and a web configuration
    with one user (ALICE's credentials): (the pass loop, the configuration's path)."""
    options = Options(pod_logs=str(tmp_path), container_logs=str(tmp_path))
    loop = PassLoop(build_engine(options), 1.0)
    loop.run_pass()
    time.sleep(0.2)
    loop.run_pass()
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  alice: '{hashed}'\n")
    return loop, config


def test_an_emptied_web_config_keeps_the_view_behind_its_users(tmp_path, caplog):
    """A web configuration emptied while serving (a Secret briefly empty, a save in two
    steps) is a file that no longer loads: the users stay, an anonymous client gets 401
    and no answer made for a user, and the user keeps the storage bytes."""
    loop, config = machine_passes_and_a_user(tmp_path)
    web = webconfig.WebConfigFile(str(config), every=0)
    with serving(loop, web=web) as port:
        rows = json.loads(request(port, "/processes?limit=0", ALICE)[2])["processes"]
        assert rows and all("write_bytes" in row for row in rows)
        config.write_text("")  # nobody to authenticate any more
        warned = lambda: request(port, "/healthz", ALICE) and "basic auth off" in caplog.text  # noqa: E731
        wait_until(warned, 10, "the warning")
        assert request(port, "/processes?limit=0")[0] == 401
        rows = json.loads(request(port, "/processes?limit=0", ALICE)[2])["processes"]
        assert rows and all("write_bytes" in row for row in rows)


def test_views_a_second_are_bounded_and_scrapes_go_on(caplog):
    """A view is for a person: past VIEWS_PER_SECOND at once, 503 with Retry-After, logged
    with the client, and /metrics answers meanwhile; the budget comes back with time."""
    loop = PassLoop(CountingEngine(groups=1), interval=60)
    loop.run_pass()
    with caplog.at_level("INFO", logger="collector.listener"), serving(loop) as port:
        statuses = [request(port, "/processes")[0] for _ in range(VIEWS_PER_SECOND + 5)]
        assert statuses.count(200) >= VIEWS_PER_SECOND and 503 in statuses
        refusals = [r.getMessage() for r in caplog.records if r.name == "collector.listener"]
        assert refusals[0] == "refused 127.0.0.1: GET /processes: 503: views a second"
        status, headers, body = request(port, "/processes")
        assert status == 503 and headers["Retry-After"] == "1" and b"views a second" in body
        assert request(port, "/metrics")[0] == 200
        time.sleep(0.2)
        assert request(port, "/processes")[0] == 200
    now = [0.0]
    budget = Budget(2, monotonic=lambda: now[0])
    assert [budget.take() for _ in range(3)] == [True, True, False]
    now[0] += 0.5
    assert [budget.take() for _ in range(2)] == [True, False]


def test_no_web_processes_answers_404():
    port = free_port()
    serve = start_serve(port, "--no-web.processes")
    try:
        wait_until(lambda: request(port, "/healthz")[0] == 200, 30, "serve healthy")
        status, _, body = request(port, "/processes")
        assert status == 404 and b"--no-web.processes" in body
        assert request(port, "/metrics")[0] == 200
        assert b"/processes" not in request(port, "/")[2]
    finally:
        serve.kill()
        serve.wait(10)


def test_processes_sit_behind_the_same_basic_auth(tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  alice: '{hashed}'\n")
    loop = PassLoop(CountingEngine(groups=2), interval=1.0)
    loop.run_pass()
    with serving(loop, web=webconfig.load(str(config))) as port:
        status, headers, _ = request(port, "/processes")
        assert status == 401 and "WWW-Authenticate" in headers
        wrong = {"Authorization": "Basic " + base64.b64encode(b"alice:nope").decode()}
        assert request(port, "/processes", wrong)[0] == 401
        status, _, body = request(port, "/processes", ALICE)
        assert status == 200 and json.loads(body)["processes"] == []
        assert request(port, "/processes?limit=x", ALICE)[0] == 400


STORAGE = {"read_bytes", "write_bytes"}


def test_no_client_gets_more_than_proc_would_give_it(tmp_path):
    """A process's storage bytes (/proc/<pid>/io, shown by the kernel to its owner alone)
    go only to a client the web configuration authenticates, or to every client where the
    operator said so (--web.processes.storage-bytes); anyone else gets the rest of each
    process, the document naming what it withheld, and a 403 for a sort by them (its
    order would tell them). The groups' sums keep theirs, as /metrics serves them. On
    this machine's own processes, two real passes apart."""
    loop, config = machine_passes_and_a_user(tmp_path)
    cases = (
        ({}, {}, False),  # the default: no web configuration
        ({"storage_bytes": True}, {}, True),
        ({"web": webconfig.load(str(config))}, ALICE, True),
    )
    for server, headers, served in cases:
        with serving(loop, **server) as port:
            status, _, body = request(port, "/processes?limit=0", headers)
            assert status == 200
            document = json.loads(body)
            rows = document["processes"]
            assert len(rows) > 5 and all(row["pid"] > 0 for row in rows)
            assert all(set(row) >= {"on_cpu_nanos", "run_delay_nanos"} for row in rows)
            assert all(bool(set(row) >= STORAGE) == served for row in rows), server
            assert ("withheld" in document) != served
            assert all(set(group) >= STORAGE for group in document["groups"])
            status, _, body = request(port, "/processes?sort=write_bytes", headers)
            if served:
                assert status == 200
            else:
                text = body.decode()
                assert status == 403 and text.count("\n") == 1
                assert "--web.processes.storage-bytes" in text and "authenticates" in text


def test_only_verified_client_certificates_or_users_authenticate():
    def config(auth: str | None, users: bool = False) -> webconfig.WebConfig:
        tls = None if auth is None else object()
        hashed = {"bob": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))} if users else {}
        return webconfig.WebConfig(tls=tls, users=hashed, client_auth=auth or "NoClientCert")

    assert not config(None).authenticates
    assert config(None, users=True).authenticates
    assert config("RequireAndVerifyClientCert").authenticates
    for mode in ("NoClientCert", "RequestClientCert", "RequireAnyClientCert",
                 "VerifyClientCertIfGiven"):  # fmt: skip
        assert not config(mode).authenticates, mode


def test_a_scrape_never_waits_for_the_view_nor_the_view_for_a_pass(monkeypatch):
    """A view held in its worker thread: /metrics and /healthz answer meanwhile. A pass
    held in the passes thread: /processes answers from the last completed pass."""
    held, release = threading.Event(), threading.Event()

    class HeldEngine(CountingEngine):
        hold = False

        def run_pass(self):
            if self.hold:
                held.set()
                release.wait(20)
            return super().run_pass()

    engine = HeldEngine(groups=3)
    loop = PassLoop(engine, interval=1.0)
    loop.run_pass()
    with serving(loop) as port:
        hold_views(monkeypatch, held, release)
        answers: list[int] = []
        view = threading.Thread(target=lambda: answers.append(request(port, "/processes")[0]))
        view.start()
        try:
            assert held.wait(10)
            assert request(port, "/metrics")[0] == 200
            assert request(port, "/healthz")[0] == 200
            assert not answers  # still held
        finally:
            release.set()
            view.join(10)
        assert answers == [200]
        monkeypatch.undo()

        held.clear()
        release.clear()
        engine.hold = True
        passing = threading.Thread(target=loop.run_pass)
        passing.start()
        try:
            assert held.wait(10)
            status, _, body = request(port, "/processes")
            assert status == 200
            assert json.loads(body)["timestamp"] == 1.0  # CountingEngine's pass 1
        finally:
            release.set()
            passing.join(10)


def _schedstat(pid: int) -> tuple[int, int]:
    """The kernel's on-CPU and run delay of a process: Σ its threads' `schedstat`."""
    on_cpu = delay = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as schedstat:
            cpu, wait, _ = schedstat.read().split()
        on_cpu, delay = on_cpu + int(cpu), delay + int(wait)
    return on_cpu, delay


def _pod_path(uid: str) -> str:
    return (
        "kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
        f"cri-containerd-{uuid.uuid4().hex * 2}.scope"
    )


def test_which_process_of_a_pod_waits_on_the_kernel(tmp_path):
    """Pod `shop/web-0`: one busy process, and two busy processes that contend for CPU 1;
    pod `batch/crunch-0` beside it, one process with two busy threads. Passes run here;
    /processes is asked over HTTP. The pod's processes are listed by run delay, each with
    the on-CPU and run delay the kernel gave it between the passes (bracketed by the
    threads' `schedstat` read just before and after each pass), the pair's waits the
    longest; they add up to the pod's interval gauges of the same pass; and, node-wide
    by on-CPU, the neighbour's process comes first of the test's."""
    pods = tmp_path / "pods"
    web_uid, crunch_uid = str(uuid.uuid4()), str(uuid.uuid4())
    (pods / f"shop_web-0_{web_uid}").mkdir(parents=True)
    (pods / f"batch_crunch-0_{crunch_uid}").mkdir(parents=True)
    options = Options(pod_logs=str(pods), container_logs=str(tmp_path))
    with (
        cgroup("v2", _pod_path(web_uid)) as web,
        cgroup("v2", _pod_path(crunch_uid)) as crunch,
        Workload(web, "--busy", "1") as alone,
        Workload(web, "--busy", "1", "--cpu", "1") as first,
        Workload(web, "--busy", "1", "--cpu", "1") as second,
        Workload(crunch, "--busy", "2") as neighbour,
    ):
        pids = (alone.pid, first.pid, second.pid, neighbour.pid)
        loop = PassLoop(build_engine(options), interval=1.0)
        before = {pid: _schedstat(pid) for pid in pids}
        loop.run_pass()
        after = {pid: _schedstat(pid) for pid in pids}
        time.sleep(2.0)
        ahead = {pid: _schedstat(pid) for pid in pids}
        loop.run_pass()
        behind = {pid: _schedstat(pid) for pid in pids}
        with serving(loop, storage_bytes=True) as port:
            status, _, body = request(port, "/processes?namespace=shop&pod=web-0")
            assert status == 200
            mine = json.loads(body)
            status, _, body = request(port, "/processes?sort=on_cpu_nanos&limit=0")
            busiest = json.loads(body)
            page = request(port, "/metrics")[2].decode()

    rows = mine["processes"]
    assert sorted(p["pid"] for p in rows) == sorted(pids[:3])
    assert [p["run_delay_nanos"] for p in rows] == sorted(
        (p["run_delay_nanos"] for p in rows), reverse=True
    )
    for row in rows:
        pid = row["pid"]
        for index, name in enumerate(("on_cpu_nanos", "run_delay_nanos")):
            low = ahead[pid][index] - after[pid][index]
            high = behind[pid][index] - before[pid][index]
            assert low <= row[name] <= high, (pid, name, low, row[name], high)
        assert row["group"] == {
            "namespace": "shop", "pod": "web-0", "uid": web_uid, "qos": "burstable"
        }  # fmt: skip
    by_pid = {p["pid"]: p for p in rows}
    for pid in (first.pid, second.pid):  # two busy processes on one CPU: each waits
        assert by_pid[pid]["run_delay_nanos"] > 0.25 * by_pid[pid]["observed_nanos"]
    print(
        "\n"
        + "\n".join(f"{p['pid']} on-CPU {p['on_cpu_nanos']} run delay {p['run_delay_nanos']}"
                    for p in rows)
    )  # fmt: skip

    (group,) = mine["groups"]
    gauges = {name: _gauge(page, f"procdelta_interval_{name}", web_uid) for name in FIELD_NAMES}
    assert gauges == {name: sum(p[name] for p in rows) for name in SORT_FIELDS} | {
        "processes": len(rows)
    }
    assert {name: group[name] for name in FIELD_NAMES} == gauges
    # Node-wide by on-CPU, the neighbour's process first of the test's: first of all on a
    # quiet machine, behind only what else ran more (a loaded one's own work)
    ranked = busiest["processes"]
    keys = [(-p["on_cpu_nanos"], p["pid"]) for p in ranked]
    assert keys == sorted(keys) and len({tuple(p["group"].items()) for p in ranked}) > 2
    ours = [p for p in ranked if p["pid"] in pids]
    assert ours[0]["pid"] == neighbour.pid and ours[0]["group"]["pod"] == "crunch-0"
    ahead = ranked[: ranked.index(ours[0])]
    print("ahead of the neighbour:", [(p["pid"], p["comm"], p["on_cpu_nanos"]) for p in ahead])


def _gauge(page: str, family: str, uid: str) -> int:
    """The value of `family`'s series for the pod `uid` on a text page."""
    for line in page.splitlines():
        if line.startswith(family + "{") and f'uid="{uid}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"{family} for {uid} not on the page")


def _reading(pid: int, cgroup: bytes = b"0::/a\n", threads: int = 1) -> ProcessReading:
    leader = thread_reading(tid=pid)
    return process_reading(pid=pid, comm=f"p{pid}", cgroup=cgroup, threads=(leader,) * threads)


def _block(cgroup: bytes, members: dict[int, ProcessReading], observed: int) -> CarriedDelta:
    """A carried block as the guard takes it, every member accepted."""
    threads = sum(len(reading.threads) for reading in members.values())
    return CarriedDelta(Carried(cgroup, members, threads, 0), members, observed)


def test_carried_processes_share_their_blocks_time_and_unsummed_ones_are_not_listed():
    """A block of three carried processes observed 10 ns in all: 4, 3 and 3 (their sum
    is the block's, exactly). A process the pass left out of every sum (`--pods-only`,
    unplaced: its group None) is not listed, filters or not."""
    pod = Group("pod", (("namespace", "n"), ("pod", "p"), ("uid", "u"), ("qos", "burstable")))
    table = ProcessTable(
        deltas=(
            ProcessDelta(_reading(7, threads=3), Fields(1, 5, 9, 4), False),
            ProcessDelta(_reading(8), Fields(1, 5, 1, 1), False),
        ),
        group_of_pid={7: pod, 8: None, 10: pod, 11: pod, 12: pod},
        carried=[_block(b"0::/a\n", {pid: _reading(pid) for pid in (12, 10, 11)}, 10)],
        group_of_cgroup={b"0::/a\n": pod},
    )
    for query in (Query(limit=None), Query((("pod", "p"),), limit=None)):
        rows = table.rows(query)
        assert [(r.pid, r.threads, r.fields.observed_nanos) for r in rows] == [
            (7, 3, 5), (10, 1, 4), (11, 1, 3), (12, 1, 3)
        ]  # fmt: skip
    assert table.rows(Query((("pod", "q"),))) == []
    assert [r.pid for r in table.rows(Query(sort="observed_nanos", limit=2))] == [7, 10]


def test_a_pass_never_makes_the_view():
    """A pass keeps what the view is made from; the view is made on request only."""

    def made_in_a_pass(*_args, **_kwargs):
        raise AssertionError("the view was made in a pass")

    loop = PassLoop(CountingEngine(groups=2), interval=1.0)
    original = PassView.document
    PassView.document = made_in_a_pass
    try:
        assert loop.run_pass() is not None and loop.run_pass() is not None
    finally:
        PassView.document = original
    assert loop.snapshot().passes == 2


def test_a_view_held_in_its_thread_holds_no_basic_auth_check(tmp_path, monkeypatch):
    """The view is made in a thread of its own, not in the one that checks passwords: a
    slow view does not hold back a scraper's check, nor a check the view."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  alice: '{hashed}'\n")
    held, release = threading.Event(), threading.Event()

    loop = PassLoop(CountingEngine(groups=2), interval=1.0)
    loop.run_pass()
    wrong = {"Authorization": "Basic " + base64.b64encode(b"alice:nope").decode()}
    with serving(loop, web=webconfig.load(str(config))) as port:
        hold_views(monkeypatch, held, release)
        answers: list[int] = []
        view = threading.Thread(
            target=lambda: answers.append(request(port, "/processes", ALICE)[0])
        )
        view.start()
        try:
            assert held.wait(10)
            assert request(port, "/metrics", wrong)[0] == 401  # a bcrypt check, answered
            assert not answers  # the view is still held
        finally:
            release.set()
            view.join(10)
        assert answers == [200]


def test_a_filtered_view_lists_the_groups_it_matches_with_no_process_listed():
    """A pod whose processes have no delta this pass (all new, say: a burst of short-lived
    ones) still has its own cgroup's line: the group comes from the pass's sums."""
    pod = Group("pod", (("namespace", "n"), ("pod", "p"), ("uid", "u"), ("qos", "burstable")))
    other = Group("cgroup", (("cgroup", "/x"),))
    view = PassView(
        ProcessTable(),
        2_000_000_000,
        1.0,
        {pod: Fields(0, 0), other: Fields(0, 0)},
        {pod: CgroupFields(cgroup_cpu_nanos=7, cpu_periods=20, cpu_throttled_periods=19)},
    )
    document = view.document(Query((("namespace", "n"), ("pod", "p"))))
    assert document["processes"] == []
    (group,) = document["groups"]
    assert group["group"] == pod.label_dict()
    assert (group["cgroup_cpu_nanos"], group["cpu_throttled_periods"]) == (7, 19)


def test_a_burst_of_views_never_turns_scrapes_away(monkeypatch):
    """Views being made hold no --web.max-requests place: with as many held as there are
    places, /metrics and /healthz still answer 200; beyond MAX_ASIDE views at once, one
    more /processes is answered 503 at once, and scrapes still answer."""
    release = threading.Event()
    started = threading.Semaphore(0)
    loop = PassLoop(CountingEngine(groups=2), interval=1.0)
    loop.run_pass()
    hold_views(monkeypatch, started, release)
    server = make_server("127.0.0.1:0", loop, "/metrics", None, Limits(max_requests=MAX_ASIDE))
    serving_thread = threading.Thread(target=server.serve_forever)
    serving_thread.start()
    port = server.server_address[1]
    try:
        answers: list[int] = []
        views = [
            threading.Thread(target=lambda: answers.append(request(port, "/processes")[0]))
            for _ in range(MAX_ASIDE)
        ]
        try:
            for view in views:
                view.start()
            assert started.acquire(timeout=10)  # the first is being made, the rest wait
            admission = server.listener.admission
            wait_until(lambda: admission.aside == MAX_ASIDE, 10, "every view waiting")
            status, _, body = request(port, "/processes")
            assert status == 503 and b"too many views" in body
            assert request(port, "/metrics")[0] == 200
            assert request(port, "/healthz")[0] == 200
            assert not answers
        finally:
            release.set()
            for view in views:
                view.join(20)
        assert answers == [200] * MAX_ASIDE
    finally:
        server.shutdown()
        server.server_close()
        serving_thread.join(10)


def hold_views(monkeypatch, held: threading.Event | threading.Semaphore, release: threading.Event):
    """Every view made from now on signals `held` (set, or released once each), then waits
    for `release` (at most 30 s) before it is made."""
    made = PassView.document

    def slow_document(self, query, cgroup_fields=True, storage_bytes=True):
        held.release() if isinstance(held, threading.Semaphore) else held.set()
        release.wait(30)
        return made(self, query, cgroup_fields, storage_bytes)

    monkeypatch.setattr(PassView, "document", slow_document)


def test_threads_read_every_process_of_the_groups_matched_carried_ones_included():
    """What `top --threads` reads: every PID the pass saw in a group the query matches,
    those carried over unread with no delta included, in PID order; never a process left
    out of every sum (its group None), nor one of a carried block in another group."""
    pod = Group("pod", (("namespace", "n"), ("pod", "p"), ("uid", "u"), ("qos", "burstable")))
    other = Group("cgroup", (("cgroup", "/x"),))
    table = ProcessTable(
        deltas=(ProcessDelta(_reading(9), Fields(1, 5, 1, 1), False),),
        group_of_pid={9: pod, 3: None, 5: other},
        carried=[
            _block(b"0::/a\n", {12: _reading(12), 4: _reading(4)}, 10),
            _block(b"0::/x\n", {6: _reading(6, b"0::/x\n")}, 10),
        ],
        group_of_cgroup={b"0::/a\n": pod, b"0::/x\n": other},
    )
    assert table.pids(Query((("pod", "p"),))) == [4, 9, 12]
    assert table.pids(Query((("cgroup", "/x"),))) == [5, 6]
    assert table.pids(Query(limit=1)) == [4, 5, 6, 9, 12]  # the limit cuts rows, not these
    assert table.pids(Query((("pod", "q"),))) == []


def test_the_groups_come_busiest_first_by_the_cpu_they_used():
    """A view's groups are ordered by the CPU time the pass saw each use, the larger of
    its processes' on-CPU sum and its own cgroup's usage, most first; a group with
    neither (no processes summed, no cgroup usage file) counts 0; ties by labels."""

    def pod(name: str) -> Group:
        return Group("pod", (("namespace", "n"), ("pod", name), ("uid", name), ("qos", "")))

    intervals = {
        pod("b-busy-cgroup"): Fields(1, 10, 1),  # its cgroup used more than its processes
        pod("a-busy-processes"): Fields(1, 10, 5),  # its processes more than its cgroup
        pod("idle-c"): Fields(1, 10, 0),
        pod("idle-e"): Fields(1, 10, 0),  # no cgroup fields at all
    }
    cgroups = {
        pod("b-busy-cgroup"): CgroupFields(cgroup_cpu_nanos=9),
        pod("a-busy-processes"): CgroupFields(cgroup_cpu_nanos=2),
        pod("c-cgroup-only"): CgroupFields(cgroup_cpu_nanos=3),  # no process summed
        pod("idle-c"): CgroupFields(),  # no cpu.stat
        pod("idle-z1"): CgroupFields(),  # no process summed, no cpu.stat
        pod("idle-z2"): CgroupFields(cgroup_cpu_nanos=0),
    }
    view = PassView(ProcessTable(), 1_000_000_000, 1.0, intervals, cgroups)
    document = view.document(Query((("namespace", "n"),)))
    assert [g["group"]["pod"] for g in document["groups"]] == [
        "b-busy-cgroup", "a-busy-processes", "c-cgroup-only", "idle-c", "idle-e", "idle-z1",
        "idle-z2",
    ]  # fmt: skip


def test_a_bad_query_names_the_clients_input_whole_up_to_40_characters():
    """The one line of a 400 names what the client sent as a quoted string, whole up to
    40 characters, else its first 40 and how long it was; the fields it may choose from
    follow."""
    sorts = ", ".join(SORT_FIELDS)
    for sent, named in (("a" * 40, repr("a" * 40)),
                        ("a" * 41, repr("a" * 40) + "... (41 characters)"),
                        ("\x1b[2J", "'\\x1b[2J'")):  # fmt: skip
        with pytest.raises(QueryError) as raised:
            Query.parse("sort=" + urllib.parse.quote(sent))
        assert str(raised.value) == f"sort={named}: want one of {sorts}"
    with pytest.raises(QueryError) as raised:
        Query.parse("limit=" + "1" * 45)
    named = repr("1" * 40) + "... (45 characters)"
    assert str(raised.value) == f"limit={named}: want an integer from 0 (all) to 100000"
    with pytest.raises(QueryError) as raised:
        Query.parse("pod=a&pod=b")
    assert str(raised.value) == "parameter 'pod' given twice"
    with pytest.raises(QueryError) as raised:
        Query.parse("node=n1")
    assert str(raised.value) == (
        "unknown parameter 'node': want one of namespace, pod, uid, qos, container, "
        "container_id, cgroup, sort, limit"
    )


def test_a_process_is_served_with_its_comm_group_and_threads():
    """Each process of /processes: its PID, its name (comm), its group's labels, its
    threads and its fields; a filtered view lists the group of a process the pass saw
    even where the group has no sums of its own, never a process left out of them."""
    pod = Group("pod", (("namespace", "n"), ("pod", "p"), ("uid", "u"), ("qos", "burstable")))
    table = ProcessTable(
        deltas=(
            ProcessDelta(_reading(7, threads=3), Fields(1, 5, 9, 4), False),
            ProcessDelta(_reading(8), Fields(1, 5, 1, 1), False),
        ),
        group_of_pid={7: pod, 8: None},
    )
    document = PassView(table, 10).document(Query((("pod", "p"),)))
    (row,) = document["processes"]
    assert list(row)[:4] == ["pid", "comm", "group", "threads"]
    assert (row["pid"], row["comm"], row["group"], row["threads"]) == (7, "p7", pod.label_dict(), 3)
    assert (row["observed_nanos"], row["on_cpu_nanos"], row["run_delay_nanos"]) == (5, 9, 4)
    assert [g["group"] for g in document["groups"]] == [pod.label_dict()]


def test_a_client_not_served_storage_bytes_cannot_sort_by_them():
    for sort in STORAGE_FIELDS:
        with pytest.raises(QueryError) as raised:
            PassView().document(Query(sort=sort), storage_bytes=False)
        assert str(raised.value) == f"sort={sort}: this client is not served storage bytes"
    assert PassView().document(Query(sort="read_bytes"))["processes"] == []


def test_a_query_of_more_than_32_fields_is_refused_before_it_is_read():
    """urllib splits no more than 32 fields of a client's query: a longer one is
    malformed, whatever its fields (a repeated one is refused too, for its own reason)."""
    with pytest.raises(QueryError) as raised:
        Query.parse("&".join(["pod=a"] * 33))
    assert str(raised.value).startswith("malformed query string: ")
    with pytest.raises(QueryError) as raised:
        Query.parse("&".join(["pod=a"] * 32))
    assert str(raised.value) == "parameter 'pod' given twice"


def test_a_groups_line_in_the_view_has_its_cgroups_fields_of_the_pass():
    result = CountingEngine(groups=1).run_pass()
    cgroups = {group: CgroupFields(cgroup_cpu_nanos=3) for group in result.intervals}
    view = PassView.of(dataclasses.replace(result, cgroup_intervals=cgroups))
    (group,) = view.document(Query((("cgroup", "/g0"),)))["groups"]
    assert (group["group"], group["cgroup_cpu_nanos"]) == ({"cgroup": "/g0"}, 3)


def test_every_carried_block_of_the_groups_matched_is_listed():
    """Carried blocks of several cgroups: those of the matched group are listed whichever
    comes first, past a block of another group or one with no members left."""
    pod = Group("pod", (("namespace", "n"), ("pod", "p"), ("uid", "u"), ("qos", "burstable")))
    other = Group("cgroup", (("cgroup", "/x"),))
    table = ProcessTable(
        carried=[
            _block(b"0::/x\n", {6: _reading(6, b"0::/x\n")}, 10),
            _block(b"0::/e\n", {}, 0),
            _block(b"0::/a\n", {12: _reading(12), 4: _reading(4)}, 10),
        ],
        group_of_cgroup={b"0::/x\n": other, b"0::/e\n": pod, b"0::/a\n": pod},
    )
    rows = table.rows(Query((("pod", "p"),), limit=None))
    assert [(r.pid, r.comm, r.fields.observed_nanos) for r in rows] == [
        (4, "p4", 5),
        (12, "p12", 5),
    ]
