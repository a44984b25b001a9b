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
_FLAGS = os.O_RDONLY | os.O_CLOEXEC
_open, _os_read, _close = os.open, os.read, os.close


def read_or_none(path: str) -> bytes | None:
    """A small file read whole at start-up (a probe of what the node provides), or None
    where it cannot be read, whatever the reason."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return None


def _translate(error: OSError) -> ProcError:
    if error.errno in _GONE:
        return ProcessGone(str(error))
    if error.errno in _DENIED:
        return AccessDenied(str(error))
    return ProcError(str(error))


def _numeric_entries(path: bytes) -> list[tuple[int, int]]:
    """(number, inode) of the numeric entries of a directory, ascending (passes are
    reproducible). One directory read: the inode numbers come with the names."""
    with os.scandir(path) as entries:
        found = [(int(e.name), e.inode()) for e in entries if e.name.isdigit()]
    found.sort()
    return found


class ProcFS:
    """A proc filesystem rooted at `root` (the host's `/proc`, or a fixture tree)."""

    def __init__(self, root: str = "/proc"):
        self.root = root

    @property
    def root(self) -> str:
        return self._root.decode()

    @root.setter
    def root(self, root: str) -> None:
        self._root = os.fsencode(root.rstrip("/"))

    def processes(self) -> list[tuple[int, int]]:
        """(pid, inode of `<pid>`) of each process directory present now.

        As for threads (below), the kernel gives a process directory a fresh inode
        number when it makes it, so an unchanged number means the same process. Raises
        OSError if the root itself cannot be listed.
        """
        return _numeric_entries(self._root or b"/")

    def threads(self, pid: int) -> list[tuple[int, int]]:
        """(tid, inode of `task/<tid>`) for each thread of `pid`, from one directory read.

        The kernel gives each `task/<tid>` directory a fresh inode number when it creates
        it and removes the entry when the thread is released, so a TID listed with the
        same inode number as in an earlier pass is the same thread, not a reuse of its
        number (a changed number only means the entry was made anew: read again).
        """
        try:
            return _numeric_entries(self.task_dir(pid))
        except OSError as error:
            raise _translate(error) from None

    def task_dir(self, pid: int) -> bytes:
        """`<root>/<pid>/task/`, as bytes: paths are handed to the OS as they are, not
        encoded from str on every call."""
        return b"%s/%d/task/" % (self._root, pid)

    def read(self, path: bytes) -> bytes:
        """The bytes of the file at `path` (e.g. `task_dir` + `<tid>/schedstat`).

        The reading primitive of the hot loop (up to four files per thread per pass): a
        bytes path skips the file-system encoding of a str, and one read of `_READ_SIZE`
        holds every file read per thread. A short read is the whole file, for a rendered
        proc file and a plain one alike.
        """
        try:
            fd = _open(path, _FLAGS)
        except OSError as error:
            raise _translate(error) from None
        try:
            data = _os_read(fd, _READ_SIZE)
            if len(data) == _READ_SIZE:
                chunks = [data]
                while chunk := _os_read(fd, _READ_SIZE):
                    chunks.append(chunk)
                data = b"".join(chunks)
        except OSError as error:
            raise _translate(error) from None
        finally:
            _close(fd)
        return data

    def process_file(self, pid: int, name: str) -> bytes:
        """The bytes of `<root>/<pid>/<name>`, e.g. `stat`."""
        return self.read(b"%s/%d/%s" % (self._root, pid, name.encode()))
