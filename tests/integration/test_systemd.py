"""deploy/systemd: the unit's ExecStart line run as the unit runs it (a user of its own
with the unit's two capabilities), and the static_configs example Prometheus loads."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.net import free_port, request, wait_until
from tests.promtools import binary

pytestmark = pytest.mark.root  # setpriv to a non-root uid, the unit's capabilities

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "deploy" / "systemd"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd's keys are case-sensitive
    parser.read(SYSTEMD / "procdelta.service")
    return parser


def exits_drop_in() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(SYSTEMD / "exits.conf")
    return parser


def capabilities(service: configparser.SectionProxy) -> list[str]:
    ambient = service["AmbientCapabilities"].split()
    assert service["CapabilityBoundingSet"].split() == ambient
    return [name.removeprefix("CAP_").lower() for name in ambient]


def as_the_unit(caps: list[str]) -> list[str]:
    """setpriv's command line for a non-root uid holding `caps` and no new privileges."""
    return [
        "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs",
        "--inh-caps=" + ",".join(f"+{c}" for c in caps),
        "--ambient-caps=" + ",".join(f"+{c}" for c in caps),
        "--bounding-set=-all," + ",".join(f"+{c}" for c in caps),
    ]  # fmt: skip


def test_the_units_exec_start_serves_every_process_without_root():
    """ExecStart as written (the venv's procdelta for /opt/procdelta's, and a loopback
    port for the unit's), under a non-root uid holding only the unit's capabilities and
    no new privileges: a root process's counters are read (its `io` needs both), and no
    missing privilege is said."""
    service = unit()["Service"]
    assert service["DynamicUser"] == "yes" and service["NoNewPrivileges"] == "yes"
    caps = capabilities(service)
    assert sorted(caps) == ["dac_read_search", "sys_ptrace"]
    command = shlex.split(service["ExecStart"])
    assert command[0] == "/opt/procdelta/bin/procdelta" and command[1] == "serve"
    port = free_port()
    binary = str(Path(sys.executable).parent / "procdelta")
    root_sleeper = subprocess.Popen(["sleep", "300"])
    serve = subprocess.Popen(
        [*as_the_unit(caps), binary, *command[1:],
         "--web.listen-address", f"127.0.0.1:{port}", "--interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def listed():
            document = json.loads(request(port, "/processes?limit=0")[2])
            return [p for p in document["processes"] if p["pid"] == root_sleeper.pid]

        (row,) = wait_until(listed, 30, "the root process listed")
        assert row["comm"] == "sleep"
        page = request(port, "/metrics")[2].decode()
        assert "procdelta_build_info" in page
    finally:
        root_sleeper.kill()
        root_sleeper.wait(10)
        serve.terminate()
        _, log = serve.communicate(timeout=10)
    assert serve.returncode == 0, log
    assert "lacks" not in log and "running without" not in log, log
    assert "level=info" in log and "starting procdelta" in log


def test_the_static_configs_example_loads_with_the_shipped_rules(tmp_path):
    shutil.copy(SYSTEMD / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(ROOT / "deploy" / "prometheus" / "procdelta.rules.yml", tmp_path)
    result = subprocess.run(
        [binary("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.mark.parametrize("with_drop_in", [True, False])
def test_the_exits_drop_in_lets_the_unit_hear_exit_records(with_drop_in):
    """exits.conf's environment and capability added to the unit's: short processes'
    exit records are counted (`born`), no warning said; the switch without the drop-in's
    capability: one line saying what is missing, the passes run, the source exported 0."""
    drop_in = exits_drop_in()["Service"]
    assert drop_in["Environment"] == "PROCDELTA_COLLECTOR_EXITS=true"
    assert drop_in["RestrictAddressFamilies"] == "AF_NETLINK"
    service = unit()["Service"]
    caps = capabilities(service) + (capabilities(drop_in) if with_drop_in else [])
    port = free_port()
    binary = str(Path(sys.executable).parent / "procdelta")
    command = shlex.split(service["ExecStart"])
    key, _, value = drop_in["Environment"].partition("=")
    serve = subprocess.Popen(
        [*as_the_unit(caps), binary, *command[1:],
         "--web.listen-address", f"127.0.0.1:{port}", "--interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, key: value},
    )  # fmt: skip
    try:
        wait_until(lambda: request(port, "/healthz")[0] == 200, 30, "a pass")

        def counted():
            for _ in range(20):
                subprocess.run(["true"], check=True)
            page = request(port, "/metrics")[2].decode()
            return sample(page, 'procdelta_exit_records_total{outcome="born"}') or 0

        if with_drop_in:
            assert wait_until(counted, 30, "short processes' exit records counted") > 0
        page = request(port, "/metrics")[2].decode()
        assert sample(page, 'procdelta_source_available{source="exits"}') == (
            1 if with_drop_in else 0
        )
    finally:
        serve.terminate()
        _, log = serve.communicate(timeout=10)
    assert serve.returncode == 0, log
    warned = [line for line in log.splitlines() if "--collector.exits" in line]
    if with_drop_in:
        assert warned == [], log
    else:
        (line,) = warned
        assert "CAP_NET_ADMIN" in line and "level=warn" in line


def sample(page: str, series: str) -> float | None:
    for line in page.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None
