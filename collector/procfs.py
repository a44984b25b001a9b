"""ProcFS: the one object that touches the proc filesystem. Lists and reads; no parsing.

OS errors are translated here, once: a file that is gone (ENOENT, ESRCH) means the
process or thread exited and raises `ProcessGone`; a refusal (EACCES, EPERM) raises
`AccessDenied`; any other OSError is a `ProcError`.
"""

from __future__ import annotations

import errno
import os

from collector.model import AccessDenied, ProcError, ProcessGone

_GONE = frozenset({errno.ENOENT, errno.ESRCH, errno.ENOTDIR})
_DENIED = frozenset({errno.EACCES, errno.EPERM})
_READ_SIZE = 8192


def _translate(error: OSError) -> ProcError:
    if error.errno in _GONE:
        return ProcessGone(str(error))
    if error.errno in _DENIED:
        return AccessDenied(str(error))
    return ProcError(str(error))


def _numeric_entries(path: str) -> list[int]:
    """The numeric entries of a directory, in ascending order (passes are reproducible)."""
    return sorted(int(name) for name in os.listdir(path) if name.isdigit())


class ProcFS:
    """A proc filesystem rooted at `root` (the host's `/proc`, or a fixture tree)."""

    def __init__(self, root: str = "/proc"):
        self.root = root.rstrip("/") or "/"

    def pids(self) -> list[int]:
        """The process directories present now. Raises OSError if the root is unreadable."""
        return _numeric_entries(self.root)

    def tids(self, pid: int) -> list[int]:
        """The threads of `pid` (its `task/` directory)."""
        try:
            return _numeric_entries(f"{self.root}/{pid}/task")
        except OSError as error:
            raise _translate(error) from None

    def read(self, relative: str) -> bytes:
        """The bytes of `<root>/<relative>`, e.g. `read("42/stat")`."""
        return self._read(f"{self.root}/{relative}")

    def process_file(self, pid: int, name: str) -> bytes:
        return self._read(f"{self.root}/{pid}/{name}")

    def thread_file(self, pid: int, tid: int, name: str) -> bytes:
        return self._read(f"{self.root}/{pid}/task/{tid}/{name}")

    @staticmethod
    def _read(path: str) -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            raise _translate(error) from None
        try:
            data = os.read(fd, _READ_SIZE)
            if len(data) < _READ_SIZE:
                # A short read is the whole file, for a rendered proc file and a plain one alike.
                return data
            chunks = [data]
            while chunk := os.read(fd, _READ_SIZE):
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError as error:
            raise _translate(error) from None
        finally:
            os.close(fd)
