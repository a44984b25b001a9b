"""procdelta's inhibitions in a real Alertmanager (Debian's prometheus-alertmanager, on
loopback): docs/findings.md's `inhibit_rules` in a plain configuration, and the chart's
AlertmanagerConfig as the Prometheus Operator renders it under its default matcher strategy
(`OnNamespace`: each rule's source and target matchers gain the resource's namespace).
Alerts are posted with the labels procdelta's rules give them, and what Alertmanager
inhibited and what it notified are read back (its API, and a webhook receiver)."""

from __future__ import annotations

import contextlib
import datetime
import http.server
import json
import re
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.integration.test_helm import render
from tests.needs import tool
from tests.net import free_port, http_get, stop_process, wait_until

ROOT = Path(__file__).resolve().parents[2]

WEB = {"cluster": "c1", "namespace": "shop", "workload": "web", "workload_type": "deployment"}
API = {**WEB, "workload": "api"}
DB = {**WEB, "workload": "db", "workload_type": "statefulset"}

# As the rules raise them (deploy/prometheus/procdelta.workload.rules.test.yml): each pod
# alert carries its pod's workload, each workload alert its workload's namespace.
ALERTS = {
    "web's ticket": {"alertname": "ProcdeltaWorkloadCPUStarved", **WEB, "severity": "warning"},
    "web's bursts": {"alertname": "ProcdeltaWorkloadCPUStarvedOften", **WEB, "severity": "warning"},
    "web's pod": {
        "alertname": "ProcdeltaPodCPUStarved", **WEB, "node": "n1", "pod": "web-1-a",
        "severity": "info",
    },
    "api's pod": {
        "alertname": "ProcdeltaPodCPUStarved", **API, "node": "n1", "pod": "api-1-a",
        "severity": "info",
    },
    "api's bursts": {"alertname": "ProcdeltaWorkloadCPUStarvedOften", **API, "severity": "warning"},
    "db's throttling": {"alertname": "ProcdeltaWorkloadCPUThrottled", **DB, "severity": "info"},
    "db's pod": {
        "alertname": "ProcdeltaPodCPUThrottled", **DB, "node": "n2", "pod": "db-0",
        "severity": "info",
    },
}  # fmt: skip


class Hook(http.server.BaseHTTPRequestHandler):
    """A webhook receiver: the alerts of each notification, by their `alertname` and pod."""

    notified: list[dict[str, str]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).notified.extend(alert["labels"] for alert in body["alerts"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:  # quiet
        pass


@contextlib.contextmanager
def webhook() -> Iterator[tuple[int, list[dict[str, str]]]]:
    notified: list[dict[str, str]] = []
    handler = type("Handler", (Hook,), {"notified": notified})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], notified
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def alertmanager(tmp_path: Path, inhibit_rules: list[dict], hook: int) -> Iterator[int]:
    """A real Alertmanager with these inhibit rules, routing everything to the webhook at
    once (one group an alert), on loopback and without clustering; its port."""
    config = {
        "route": {
            "receiver": "hook", "group_by": ["..."], "group_wait": "1s",
            "group_interval": "1s", "repeat_interval": "1h",
        },
        "receivers": [
            {"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{hook}/"}]}
        ],
        "inhibit_rules": inhibit_rules,
    }  # fmt: skip
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    binary = tool("prometheus-alertmanager", "prometheus-alertmanager")
    check = subprocess.run(
        [tool("amtool", "prometheus-alertmanager"), "check-config", str(path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={path}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: http_get(f"http://127.0.0.1:{port}/-/ready"), 30, "Alertmanager ready")
        yield port
    finally:
        stop_process(process)
        if process.stderr is not None:
            process.stderr.close()


def post(port: int, alerts: list[dict[str, str]]) -> None:
    now = datetime.datetime.now(datetime.UTC)
    body = json.dumps(
        [
            {
                "labels": labels,
                "startsAt": now.isoformat(),
                "endsAt": (now + datetime.timedelta(hours=1)).isoformat(),
            }
            for labels in alerts
        ]
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v2/alerts", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def outcome(
    tmp_path: Path, inhibit_rules: list[dict], alerts: dict[str, dict[str, str]] = ALERTS
) -> tuple[set[str], set[str]]:
    """(inhibited, notified) of `alerts`, by name, once Alertmanager has processed each."""

    def name_of(labels: dict[str, str]) -> str:
        (name,) = [n for n, alert in alerts.items() if alert == labels]
        return name

    with webhook() as (hook, notified), alertmanager(tmp_path, inhibit_rules, hook) as port:
        post(port, list(alerts.values()))

        def settled() -> list[dict] | None:
            got = json.loads(http_get(f"http://127.0.0.1:{port}/api/v2/alerts"))
            processed = len(got) == len(alerts) and all(
                a["status"]["state"] != "unprocessed" for a in got
            )
            active = sum(a["status"]["state"] == "active" for a in got)
            return got if processed and len(notified) >= active else None

        got = wait_until(settled, 30, "every alert processed, and the active ones notified")
        inhibited = {name_of(a["labels"]) for a in got if a["status"]["inhibitedBy"]}
        return inhibited, {name_of(labels) for labels in notified}


def documented_rules() -> list[dict]:
    text = (ROOT / "docs" / "findings.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "inhibit_rules" in b]
    return yaml.safe_load(block)["inhibit_rules"]


def operator_rules(namespace: str) -> list[dict]:
    """The chart's AlertmanagerConfig in `namespace` as the Operator writes it into the
    Alertmanager's configuration under `alertmanagerConfigMatcherStrategy: OnNamespace`
    (its default): each inhibit rule's matchers, and `namespace="<namespace>"` added to
    both sides."""
    (config,) = render({"alertmanagerConfig": {"enabled": True}}, namespace=namespace)[
        "AlertmanagerConfig"
    ]
    assert config["metadata"]["namespace"] == namespace

    def matchers(side: list[dict]) -> list[str]:
        own = [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in side]
        return [*own, f'namespace="{namespace}"']

    return [
        {
            "source_matchers": matchers(rule["sourceMatch"]),
            "target_matchers": matchers(rule["targetMatch"]),
            "equal": rule["equal"],
        }
        for rule in config["spec"]["inhibitRules"]
    ]


def test_the_documented_inhibitions_keep_the_workloads_ticket_alone(tmp_path):
    """docs/findings.md's `inhibit_rules`: a workload's ticket inhibits its pods' alerts of
    the same finding and its own alert of bursts; another workload's pod and bursts, and the
    tickets themselves, are notified."""
    inhibited, notified = outcome(tmp_path, documented_rules())
    assert inhibited == {"web's bursts", "web's pod", "db's pod"}
    assert notified == set(ALERTS) - inhibited


def test_under_the_operators_default_strategy_the_charts_rules_hold_only_in_its_namespace(
    tmp_path,
):
    """The chart's AlertmanagerConfig (in namespace procdelta) as the Operator renders it by
    default inhibits nothing of a workload in another namespace: the pages and tickets do
    not lean on it. A ticket and its bursts never fire together by the rules themselves
    (ProcdeltaWorkloadCPUStarvedOften waits out an hour after its ticket:
    deploy/prometheus/procdelta.tickets.rules.test.yml); the pod alerts are context. The
    same rules with the alerts in the resource's own namespace do inhibit: the rendering
    above is the Operator's."""
    inhibited, notified = outcome(tmp_path, operator_rules("procdelta"))
    assert inhibited == set() and notified == set(ALERTS)
    own = {name: {**labels, "namespace": "procdelta"} for name, labels in ALERTS.items()}
    (tmp_path / "own").mkdir()
    inhibited, _ = outcome(tmp_path / "own", operator_rules("procdelta"), own)
    assert inhibited == {"web's bursts", "web's pod", "db's pod"}
