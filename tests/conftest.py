import pytest

from tests.needs import ROOT_MARKERS, root
from tests.webconfigs import pki  # the fixture: a PKI made by openssl, once a module

__all__ = ["pki"]


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite the golden files under tests/golden from the current output",
    )


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


WAITS = ("tests/integration/test_rules_live.py",)
"""The test files that mostly wait on a server's own pace (a real Prometheus at the rules'
group intervals), at next to no CPU. Under `.ci/run`'s two workers (`-n 2`) they run in one,
beside every other test, which run one at a time in the other, in their order: a test that
measures shares of the CPUs must have them (`lane`, `pytest_xdist_make_scheduler`)."""


def lane(nodeid: str) -> str:
    """Which of the two workers' queues a test is in: "waits" or "serial"."""
    return "waits" if nodeid.split("::", 1)[0] in WAITS else "serial"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, a scope being a `lane`: each lane whole in one worker.
    (Its `loadgroup` would do with markers, but pytest 9.2 no longer reads the node IDs
    xdist 3.8 rewrites for it.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(nodeid)

    return Lanes(config, log)


def pytest_collection_modifyitems(config, items):
    """A container test may first build the base image with debootstrap (its own limit is
    30 minutes): it has more time than pyproject.toml's `timeout` gives the rest."""
    for item in items:
        if item.get_closest_marker("container") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(2700))


def pytest_runtest_setup(item):
    """A test marked as needing root skips without it (fails under CI: tests/needs.py)."""
    marked = [name for name in ROOT_MARKERS if item.get_closest_marker(name)]
    if marked:
        root(marked)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cpu_shares: measures shares of the CPUs on live cgroups; a failure says first "
        "whether other work used them meanwhile (tests/machine.py)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed `cpu_shares` test's report says first whether the machine was busy."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when == "call" and item.get_closest_marker("cpu_shares"):
        from tests.machine import busy_verdict

        verdict = busy_verdict()
        if verdict is not None:
            report.longrepr = f"{verdict}\n\n{report.longrepr}"
