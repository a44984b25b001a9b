"""procdelta: per-pod process counters for Prometheus, with deltas taken on the node."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("procdelta")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
