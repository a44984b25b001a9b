"""The kernel's exit records (docs/reference.md §2, "Exits, where the kernel reports
them"): with `--collector.exits`, a listener registered with the generic netlink family
`TASKSTATS` (kernel/taskstats.c, Documentation/accounting/taskstats.rst) receives every
exiting task's final `struct taskstats`, sent by the task itself in `do_exit()`, and
queues it for the next pass, which closes the task's last interval with it
(`collector.tracker.Tracker.close`).

Exit records only: the same family answers queries about live tasks
(`TASKSTATS_CMD_ATTR_PID`, `_TGID`), and those have panicked distribution kernels built
with FORTIFY_SOURCE (the fortified copy of a task's name while that task renames itself in
`exec`: coroot-node-agent #259 on RHEL 10's 6.12.0-55.9.1, #376 on Amazon Linux 2023's
6.12.79). No such query is ever sent: live tasks are read from `/proc`. An exit record is
filled by the exiting task for itself, which cannot be in `exec` then.

What listening asks: CAP_NET_ADMIN (the registration is `GENL_ADMIN_PERM`), a socket in
the host's network namespace (the family is not per namespace), and the initial user and
PID namespaces (a registration from elsewhere is refused). In Kubernetes: hostNetwork,
hostPID and the NET_ADMIN capability.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import select
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar, overload

from collector import datagrams

log = logging.getLogger(__name__)
T = TypeVar("T")

NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 2
NLMSG_DONE = 3
TASKSTATS_CMD_GET = 1
TASKSTATS_CMD_NEW = 2  # the kernel's answers and exit records
TASKSTATS_CMD_ATTR_REGISTER_CPUMASK = 3
TASKSTATS_TYPE_PID = 1
TASKSTATS_TYPE_TGID = 2
TASKSTATS_TYPE_STATS = 3
TASKSTATS_TYPE_AGGR_PID = 4
TASKSTATS_TYPE_AGGR_TGID = 5
AGROUP = 0x20  # include/uapi/linux/acct.h: the last task of its process
SO_RCVBUFFORCE = 33

BUFFER_BYTES = 32 << 20
"""The socket's receive buffer by default (the kernel doubles it: 64 MB, ~29,000 records of
~2.3 KB each, its own memory, not the collector's): the records of a fork storm's bursts while
the listener gathers them (`_GATHER_SECONDS`) or waits for the interpreter
(docs/performance.md, "Exit records")."""

MAX_QUEUED = 100_000
"""Records held between two passes at most (packed, `PACKED_BYTES` each: 12.5 MB), 6,600
exits a second at the default 15 s interval; past it, the newest are dropped and counted
(`ExitListener.dropped`)."""

# struct taskstats (include/uapi/linux/taskstats.h), the fields read, by offset: the layout
# only grows at its end from one version to the next
_HEAD = struct.Struct("=H6xB")  # version, ac_flag
_DELAY = struct.Struct("=Q")  # cpu_delay_total @24
_RUN = struct.Struct("=Q")  # cpu_run_virtual_total @72
_IDS = struct.Struct("=II")  # ac_pid, ac_ppid @128
_TIMES = struct.Struct("=QQQ8xQ")  # ac_etime, ac_utime, ac_stime, ac_majflt @144
_IO = struct.Struct("=QQ8xQQ")  # read_bytes, write_bytes, nvcsw, nivcsw @248
_TGID = struct.Struct("=I4xQ")  # ac_tgid, ac_tgetime @368 (version 12 and later)
_MIN_BYTES = 288  # through nivcsw
# Every field read, in one unpack, for records of version 12 and later (`_WHOLE`'s tail)
_STATS = struct.Struct("=H6xB15xQ40xQ48xII8xQQQ8xQ64xQQ8xQQ80xI4xQ")
# One exit message as the kernel sends it, up to its STATS: the netlink header, the generic
# netlink header, AGGR_PID, its PID attribute and value, the STATS attribute's header
_MESSAGE = struct.Struct("=IHHIIBBHHHHHIHH")
_STATS_AT = _MESSAGE.size
# The two in one unpack: a message of one exit record, whole (`ExitListener._take_one`),
# less what is not checked (the message's flags, sequence and port id; the generic netlink
# header's version and reserved bytes, AGGR_PID's length)
_WHOLE = struct.Struct("=IH10xB5xHHHIHH" + _STATS.format[1:])
_WHOLE_BYTES = _WHOLE.size
_STATS_ATTRIBUTE_BYTES = 4 + _STATS.size  # the STATS attribute, at least
_STATS_END = _STATS_AT - 4  # where the STATS attribute begins
# A record as the listener holds it until a pass takes it: ExitRecord's fields, packed.
_PACKED = struct.Struct("=III?16sqqqQQQQQQQQQq")
PACKED_BYTES = _PACKED.size
# Of a packed record, only its parent (`ExitRecords.parents`), and what a process's end
# asks (`ExitRecords.ends`): PID, TGID, parent, last; arrival, its process's life; wait
_PARENT = struct.Struct(f"=8xI{PACKED_BYTES - 12}x")
_END = struct.Struct("=III?16xq8xq72xq")
assert _PARENT.size == _END.size == PACKED_BYTES
_TGID_VERSION = 12
_TGID_BYTES = 384


_SAME_NS = 1_000_000
"""How far apart two records' derived starts of one process may be past the longer of their
waits (`ExitListener._take_one`: the same process, not another under its PID since)."""


class Fold:
    """The tasks of one process that no pass read nor will read, folded as their records
    come (`ExitListener`): threads, not its last task, begun after the last pass had read
    every process and gone before the next began listing. Their thread fields sum here,
    whole (the birth rule); their user and system time and major faults too, for where the
    process itself was born since and no pass reads it (`Tracker.pend`). Memory grows with
    the processes whose threads exit, not with the exits."""

    __slots__ = (
        "born",
        "major_faults",
        "nonvoluntary_switches",
        "on_cpu_ns",
        "ppid",
        "read_bytes",
        "run_delay_ns",
        "seen_ns",
        "start_ns",
        "stime_us",
        "tasks",
        "tgid",
        "utime_us",
        "voluntary_switches",
        "waited_ns",
        "write_bytes",
    )  # fmt: skip

    def __init__(
        self, tgid: int, ppid: int, start_ns: int, waited_ns: int, born: bool, seen_ns: int
    ):
        self.tgid, self.ppid = tgid, ppid
        self.start_ns = start_ns  # its process's start, as its first record derives it
        self.waited_ns = waited_ns  # the longest any of its records may have waited
        self.born = born  # its process began after the last pass had read every process
        # its first record's arrival: that task's parent, `ppid`, was alive at its exit,
        # `waited_ns` before at the earliest
        self.seen_ns = seen_ns
        self.tasks = self.on_cpu_ns = self.run_delay_ns = 0
        self.voluntary_switches = self.nonvoluntary_switches = 0
        self.read_bytes = self.write_bytes = 0
        self.utime_us = self.stime_us = self.major_faults = 0


class ExitsUnavailable(Exception):
    """Why no listener could be registered, in one line for the start-up log."""


@dataclass(frozen=True, slots=True)
class ExitRecord:
    """One task's final counters, as its exit record gives them, with when it was taken off
    the socket (`received_ns`, CLOCK_BOOTTIME), at most how long it had waited there
    (`waited_ns`: since the listener last found the socket empty), and its start on that
    clock, derived from how long it lived (`ac_etime`, µs): never before the task's own,
    and later by at most `waited_ns`.

    `pid` is the task's TID (the initial PID namespace's), `tgid` its process's (0 where the
    kernel's record is older than version 12 and does not say); `last` marks the last task
    of its process (`AGROUP`)."""

    pid: int
    tgid: int
    ppid: int
    last: bool
    comm: str
    received_ns: int
    lived_ns: int  # ac_etime: the task's life
    group_lived_ns: int  # ac_tgetime: its process's, from its leader's start
    on_cpu_ns: int  # cpu_run_virtual_total: schedstat's on-CPU
    run_delay_ns: int  # cpu_delay_total: schedstat's run delay
    voluntary_switches: int  # nvcsw
    nonvoluntary_switches: int  # nivcsw
    read_bytes: int
    write_bytes: int
    utime_us: int
    stime_us: int
    major_faults: int
    waited_ns: int = 0

    @property
    def start_ns(self) -> int:
        return self.received_ns - self.lived_ns

    @property
    def group_start_ns(self) -> int:
        """Its process's start: its leader's."""
        return self.received_ns - self.group_lived_ns


class ProcessEnd(NamedTuple):
    """A process's end as its last task's record tells it (`ExitRecords.ends`): its parent
    then, its start and the record's arrival (CLOCK_BOOTTIME), and how long the record may
    have waited in the socket (each as `ExitRecord`'s)."""

    tgid: int
    ppid: int
    start_ns: int
    received_ns: int
    waited_ns: int


def pack_stats(data: bytes, received_ns: int, waited_ns: int = 0) -> bytes | None:
    """A `struct taskstats` as the listener holds it (`PACKED_BYTES`), or None where it is
    too short to be one."""
    if len(data) < _MIN_BYTES:
        return None
    version, flag = _HEAD.unpack_from(data, 0)
    pid, ppid = _IDS.unpack_from(data, 128)
    lived_us, utime, stime, majflt = _TIMES.unpack_from(data, 144)
    read_bytes, write_bytes, voluntary, nonvoluntary = _IO.unpack_from(data, 248)
    tgid, group_lived_us = 0, lived_us
    if version >= _TGID_VERSION and len(data) >= _TGID_BYTES:
        tgid, group_lived_us = _TGID.unpack_from(data, 368)
    return _PACKED.pack(
        pid, tgid, ppid, bool(flag & AGROUP), data[80:96], received_ns,
        lived_us * 1000, group_lived_us * 1000,
        _RUN.unpack_from(data, 72)[0], _DELAY.unpack_from(data, 24)[0],
        voluntary, nonvoluntary, read_bytes, write_bytes, utime, stime, majflt, waited_ns,
    )  # fmt: skip


def record_of(fields: tuple) -> ExitRecord:
    """A packed record (`ExitRecords.raw`'s tuple) as an `ExitRecord`."""
    pid, tgid, ppid, last, comm, *counters = fields
    name = comm.split(b"\0", 1)[0].decode("utf-8", "replace")
    return ExitRecord(pid, tgid, ppid, last, name, *counters)


def parse_stats(data: bytes, received_ns: int, waited_ns: int = 0) -> ExitRecord | None:
    """A `struct taskstats` as an `ExitRecord`, or None where it is too short to be one."""
    packed = pack_stats(data, received_ns, waited_ns)
    return None if packed is None else record_of(_PACKED.unpack(packed))


class ExitRecords(Sequence[ExitRecord]):
    """Packed records (`pack_stats`, one after the other), each an `ExitRecord` as it is
    iterated: a pass that takes many holds one at a time."""

    def __init__(self, packed: bytes | bytearray = b""):
        self.packed = bytes(packed)

    def __len__(self) -> int:
        return len(self.packed) // PACKED_BYTES

    def __iter__(self) -> Iterator[ExitRecord]:
        return map(record_of, _PACKED.iter_unpack(self.packed))

    def raw(self) -> Iterator[tuple]:
        """The records as tuples of `ExitRecord`'s fields, in its order (`comm` as the
        kernel's 16 bytes): what a pass reads of a record without making one
        (`record_of` makes it)."""
        return _PACKED.iter_unpack(self.packed)

    def parents(self) -> set[int]:
        """The PIDs the records name as their tasks' parents (`ac_ppid`)."""
        return {ppid for (ppid,) in _PARENT.iter_unpack(self.packed)}

    def ends(self, of: Collection[int]) -> Iterator[ProcessEnd]:
        """The end of each process among `of` (by TGID) whose last task's record is here."""
        for pid, tgid, ppid, last, received, group_lived, waited in _END.iter_unpack(self.packed):
            process = tgid or pid
            if last and process in of:
                yield ProcessEnd(process, ppid, received - group_lived, received, waited)

    def __getitem__(self, index):  # a Sequence's; passes only iterate
        if isinstance(index, slice):
            return list(self)[index]
        return record_of(_PACKED.unpack_from(self.packed, range(len(self))[index] * PACKED_BYTES))


def attributes(data: bytes | memoryview, offset: int = 0) -> list[tuple[int, memoryview]]:
    """The netlink attributes (`struct nlattr`) of a payload: (type, value) in order."""
    view = memoryview(data)
    found = []
    while offset + 4 <= len(view):
        length, kind = struct.unpack_from("=HH", view, offset)
        if length < 4 or offset + length > len(view):
            break
        found.append((kind & 0x3FFF, view[offset + 4 : offset + length]))
        offset += (length + 3) & ~3
    return found


# (overloaded for the checker: the default `make` makes `ExitRecord`s, which a default
# cannot say of a type variable)
@overload
def parse_messages(
    data: bytes, received_ns: int, *, family: int | None = None, refused: Counter[str] | None = None
) -> tuple[list[ExitRecord], int | None]: ...
@overload
def parse_messages(
    data: bytes,
    received_ns: int,
    make: Callable[[bytes, int], T | None],
    *,
    family: int | None = None,
    refused: Counter[str] | None = None,
) -> tuple[list[T], int | None]: ...
def parse_messages(
    data: bytes,
    received_ns: int,
    make: Callable[[bytes, int], object] = parse_stats,
    *,
    family: int | None = None,
    refused: Counter[str] | None = None,
) -> tuple[Sequence[object], int | None]:
    """The exit records of what one read of the socket gave (netlink messages, each a
    generic netlink header and the attributes AGGR_PID, holding PID and STATS, or AGGR_TGID,
    holding TGID and the process's delay sums), each made by `make` (an `ExitRecord`, or
    packed); and the error an NLMSG_ERROR message carried (0: an ack; None: no such
    message). A process's AGGR_TGID sums are its tasks' own records again: not taken.

    With `family` (the TASKSTATS family's number), a message of another type, or not the
    family's TASKSTATS_CMD_NEW, is refused; and an AGGR_PID that is not one task's record
    (its PID attribute missing or not the record's own `ac_pid`, its STATS too short) is
    `malformed`: each counted into `refused` by its reason (EXIT_REFUSAL_REASONS)."""
    records: list[object] = []
    error: int | None = None
    offset = 0
    tally: Counter[str] = Counter() if refused is None else refused
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16 or offset + length > len(data):
            tally["malformed"] += 1
            break
        if kind == NLMSG_ERROR:
            if length < 20:  # no error code: not a message the kernel sends
                tally["malformed"] += 1
                break
            error = -struct.unpack_from("=i", data, offset + 16)[0]
        elif kind != NLMSG_DONE:
            if family is not None and (
                kind != family or length < 20 or data[offset + 16] != TASKSTATS_CMD_NEW
            ):
                tally["not_taskstats"] += 1
            else:
                for stats in _task_stats(data[offset + 20 : offset + length], tally):
                    record = make(stats, received_ns)
                    if record is None:
                        tally["malformed"] += 1
                    else:
                        records.append(record)
        offset += (length + 3) & ~3
    return records, error


def _task_stats(payload: bytes, refused: Counter[str]) -> Iterator[bytes]:
    """The `struct taskstats` of each task's record (AGGR_PID) in one message's attributes:
    its PID attribute and its STATS, the STATS long enough and naming that PID."""
    for top, value in attributes(payload):
        if top != TASKSTATS_TYPE_AGGR_PID:
            continue
        pid: int | None = None
        stats: bytes | None = None
        for inner, content in attributes(value):
            if inner == TASKSTATS_TYPE_PID and len(content) == 4:
                pid = struct.unpack("=I", content)[0]
            elif inner == TASKSTATS_TYPE_STATS:
                stats = bytes(content)
        if (
            pid is None
            or stats is None
            or len(stats) < _MIN_BYTES
            or _IDS.unpack_from(stats, 128)[0] != pid
        ):
            refused["malformed"] += 1
            continue
        yield stats


def _attribute(kind: int, value: bytes) -> bytes:
    length = 4 + len(value)
    return struct.pack("=HH", length, kind) + value + b"\0" * (-length % 4)


def _request(family: int, command: int, payload: bytes, sequence: int, flags: int = 0) -> bytes:
    body = struct.pack("=BBH", command, 1, 0) + payload
    header = struct.pack("=IHHII", 16 + len(body), family, NLM_F_REQUEST | flags, sequence, 0)
    return header + body


def family_request(sequence: int) -> bytes:
    """A request for the TASKSTATS family's number (`CTRL_CMD_GETFAMILY`), which the kernel
    answers from its port 0 to anyone, no privilege asked."""
    name = _attribute(CTRL_ATTR_FAMILY_NAME, b"TASKSTATS\0")
    return _request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, name, sequence)


def _cpus() -> str:
    """Every CPU that may come online: a listener registered on each one hears every exit."""
    try:
        with open("/sys/devices/system/cpu/possible") as possible:
            return possible.read().strip()
    except OSError:
        return f"0-{(os.cpu_count() or 1) - 1}"


def _as_read(stats: bytes, received_ns: int) -> bytes:
    """A record's `struct taskstats` as it came (`parse_messages`'s `make`)."""
    return stats


def from_kernel(sender: object) -> bool:
    """Whether a datagram's sender (`recvfrom`'s address: port id and groups) is the
    kernel, whose port id is 0: a process's socket is never bound to port 0."""
    return isinstance(sender, tuple) and len(sender) == 2 and sender[0] == 0


_WAKE_SECONDS = 0.05
"""How long the listener's thread waits on a quiet socket before it looks again (whether it
was closed, and that it is still empty): the bound on how long a record may have waited
there (`ExitRecord.waited_ns`) is this long at most while the socket is quiet. (Netlink
gives no receive timestamp.) A task born this long after a pass ended counts whole even
where its record is the first after a quiet spell. A wake-up on a quiet socket costs the
thread ~50 µs on a VM (docs/performance.md, "Exit records"): 20 a second, 1 ms a second."""


_GATHER_SECONDS = (0.002, 0.4)
"""How long the listener lets records gather once some came (`_listen`), at least and at
most: a wake-up of its thread costs much more than taking a record (~200 µs on a VM, the
sleep's and the first record's cold caches, against ~3 µs a record after it), so records
are taken in batches of about `_BATCH`, as long as the rate asks within these bounds (at
1,000 exits a second, two or three wake-ups a second; at 5,000, five). A record may wait
that much longer in the socket (its `waited_ns` says so), and a pass that begins takes what
is there (`pass_began`). A pass that has read every process (`pass_read`) cuts a gather
short: what the socket holds is taken at once, and the next batch within the least gather,
so that the threads begun since are known to have begun after that pass (folded, not
queued). After that, and after a quiet spell, a gather is at most `_RAMP` times the last:
a storm that begins then is measured before it can fill the socket. The socket's buffer
holds what comes meanwhile: ~29,000 records (2,304 bytes each of the kernel's memory, in
the 64 MB the default buffer asks, `BUFFER_BYTES` doubled by the kernel), a storm of
72,000 exits a second that begins with the longest gather, as 16 MiB (doubled) held over
gathers of at most 0.2 s before."""
_BATCH = 1000
_RAMP = 4
MAX_WAIT_SECONDS = max(_WAKE_SECONDS, _GATHER_SECONDS[1])
"""The longest a record may wait in the socket while the listener keeps up (its
`waited_ns` at most): a task begun less than this after a pass began listing may be one it
read, and its record cannot say otherwise."""


def next_gather(came: int, elapsed: float, last: float) -> float:
    """How long the next gather lasts (`_listen`): toward `_BATCH` records at the rate the
    last `came` records (at least one) came (over `elapsed` seconds), within
    `_GATHER_SECONDS`, and at most `_RAMP` times the `last` one."""
    low, high = _GATHER_SECONDS
    return min(high, _RAMP * last, max(low, _BATCH * elapsed / came))


_monotonic = time.monotonic  # the listener's schedule (`_listen`): a test's, where it sets one
_boottime_ns = functools.partial(time.clock_gettime_ns, time.CLOCK_BOOTTIME)
"""CLOCK_BOOTTIME, in ns (a partial: no Python frame, read twice a record)."""


class ExitListener:
    """A registered listener: a thread of its own takes the records off the socket as they
    come and queues them (at most MAX_QUEUED); `drain()` hands a pass those received since
    the last. A listener that falls behind delays no pass and no scrape: the socket's buffer
    (`buffer_bytes`) holds what it has not read, and what overflows it is counted
    (`overflows`: the times the kernel said ENOBUFS; how many records each time lost, the
    kernel does not say).

    Only the kernel speaks on it: a datagram whose sender's port id is not 0 (another
    process with CAP_NET_ADMIN can send to the listener's port), a message not of the
    TASKSTATS family (`family`, found when registering), and an exit record not well formed
    are refused and counted by reason (`refused`, EXIT_REFUSAL_REASONS)."""

    def __init__(
        self,
        buffer_bytes: int = BUFFER_BYTES,
        clock=_boottime_ns,
        sock: socket.socket | None = None,
        family: int | None = None,
    ):
        self.clock = clock
        self.buffer_bytes = buffer_bytes
        self.overflows = 0
        self.dropped = 0  # past MAX_QUEUED, between two passes
        self._queued_in = 0  # records queued (or dropped past MAX_QUEUED), in all
        self.refused: Counter[str] = Counter()  # by reason: EXIT_REFUSAL_REASONS
        self.family = family  # the TASKSTATS family's number (`_register` finds it)
        # packed records (`pack_stats`) by the parent their tasks had (`ac_ppid`), each in
        # the order they came, and how many in all; the parent with the most, as last found
        self._queues: dict[int, bytearray] = {}
        self._queued_count = 0
        # the parents by how many records each has queued, and the most any has
        self._sizes: dict[int, set[int]] = {}
        self._most = 0
        self.lost: Counter[int] = Counter()  # records dropped past MAX_QUEUED, by parent
        # tasks folded as they came (`Fold`), by process; those of a process whose PID was
        # taken again since; and the window a record must fall in to be folded: begun after
        # `_born_after` (the last pass had read every process then) and taken before
        # `_listing_from` (the pass under way began listing), None: no pass yet, no pass
        # under way
        self._folds: dict[int, Fold] = {}
        self._folds_done: list[Fold] = []
        self._born_after: int | None = None
        self._listing_from: int | None = None
        self.folded = 0  # records folded as they came, in all
        # held by whoever reads the socket (`_drain`) or takes what was read: one at a time
        self._lock = threading.Lock()
        self._registered_at = clock()
        self._empty_at = self._registered_at  # the socket was found empty (made so, here)
        self._socket = self._register() if sock is None else sock  # given: registered
        self._reader: datagrams.DatagramReader = datagrams.of(self._socket)
        self._closed = threading.Event()
        # set by a pass that has read every process (`pass_read`), and by `close`: a gather
        # ends (`_gather`)
        self._nudged = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="exits", daemon=True)

    @property
    def received(self) -> int:
        """The records taken off the socket in all: queued (or dropped) and folded."""
        return self._queued_in + self.folded

    def start(self, proof_seconds: float = 2.0) -> ExitListener:
        """Start listening, once a child forked now has been heard exiting: a listener
        registered from another network namespace than the host's is accepted and hears
        nothing (raises ExitsUnavailable then)."""
        child = os.fork()  # before the thread starts: a fork of one thread
        if child == 0:  # pragma: no cover (the child)
            os._exit(0)
        os.waitpid(child, 0)
        self.listen()
        deadline = time.monotonic() + proof_seconds
        while time.monotonic() < deadline:
            with self._lock:  # among our own children's records
                ours = self._queues.get(os.getpid(), bytearray())
                came = ExitRecords(ours)
                proof = next((record for record in came if record.pid == child), None)
                if proof is not None:
                    self._queues[os.getpid()] = bytearray().join(
                        ours[i * PACKED_BYTES : (i + 1) * PACKED_BYTES]
                        for i, record in enumerate(came)
                        if record.pid != child
                    )
                    self._queued_count -= 1
                    self._shrink(os.getpid(), len(came))
            if proof is not None:
                if proof.tgid == 0:  # before version 12: no process named, no last task
                    self.close()
                    raise ExitsUnavailable(
                        "the kernel's exit records are older than version 12 (kernels before "
                        "2022): they name no task's process, which closing its interval needs"
                    )
                return self
            time.sleep(0.01)
        self.close()
        raise ExitsUnavailable(
            "registered, and no exit record came back: procdelta is not in the host's "
            "network namespace, where the kernel sends them (hostNetwork in Kubernetes, "
            "--network host with podman)"
        )

    def listen(self) -> ExitListener:
        """Start the thread that takes the records off the socket."""
        self._thread.start()
        return self

    def _register(self) -> socket.socket:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        except OSError as error:
            raise ExitsUnavailable(f"no generic netlink socket: {error.strerror}") from None
        try:
            sock.bind((0, 0))
            sock.settimeout(5)
            family = self.family = self._family(sock)
            with_force = True
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, self.buffer_bytes)
            except OSError:
                with_force = False
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.buffer_bytes)
            mask = _cpus().encode() + b"\0"
            sock.send(
                _request(
                    family,
                    TASKSTATS_CMD_GET,
                    _attribute(TASKSTATS_CMD_ATTR_REGISTER_CPUMASK, mask),
                    2,
                    NLM_F_ACK,
                )
            )
            for packed in self._acknowledged(sock, "registering for exit records"):
                self._queued(packed, _PACKED.unpack(packed)[2])
            if not with_force:
                log.debug("exit records: SO_RCVBUFFORCE refused; the buffer is net.core.rmem_max's")
            # Connected to the kernel (port id 0), the socket takes no datagram from another
            # port: the kernel refuses a process's send to it (ECONNREFUSED,
            # `netlink_getsockbyportid`), so a forged record never reaches it at all; what
            # reaches it is checked all the same (`from_kernel`).
            sock.connect((0, 0))
            sock.settimeout(0.0)  # the listener's reads do not block (`_listen`)
            return sock
        except ExitsUnavailable:
            sock.close()
            raise
        except OSError as error:
            sock.close()
            raise ExitsUnavailable(f"netlink: {error.strerror or error}") from None

    @staticmethod
    def _family(sock: socket.socket) -> int:
        """The TASKSTATS family's number (CTRL_CMD_GETFAMILY)."""
        sock.send(family_request(1))
        data, sender = sock.recvfrom(65536)
        while not from_kernel(sender):  # only the kernel's answer
            data, sender = sock.recvfrom(65536)
        length, kind = struct.unpack_from("=IH", data, 0)
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, 16)[0]
            if code == errno.ENOENT:
                raise ExitsUnavailable("the kernel has no TASKSTATS family (CONFIG_TASKSTATS)")
            raise ExitsUnavailable(f"TASKSTATS family: {os.strerror(code)}")
        for attribute, value in attributes(data[20:length]):
            if attribute == CTRL_ATTR_FAMILY_ID:
                return struct.unpack_from("=H", value)[0]
        raise ExitsUnavailable("TASKSTATS family: no id in the kernel's answer")

    def _acknowledged(self, sock: socket.socket, what: str) -> list[bytes]:
        """The registration's answer, an ack, or the reason it was refused; and the
        records that came before it (tasks exiting meanwhile on other CPUs), packed."""
        came: list[bytes] = []
        while True:
            data, sender = sock.recvfrom(1 << 20)
            now = self.clock()
            if not from_kernel(sender):
                self.refused["not_kernel"] += 1
                continue

            def packed(stats: bytes, received_ns: int, now: int = now) -> bytes | None:
                return pack_stats(stats, received_ns, now - self._registered_at)

            records, error = parse_messages(
                data, now, packed, family=self.family, refused=self.refused
            )
            came += records
            if error is not None:
                break
        if error == errno.EPERM:
            raise ExitsUnavailable(f"{what}: not permitted (it needs CAP_NET_ADMIN)")
        if error == errno.EINVAL:
            raise ExitsUnavailable(
                f"{what}: refused (it needs the host's network, PID and user namespaces: "
                "hostNetwork and hostPID in Kubernetes)"
            )
        if error:
            raise ExitsUnavailable(f"{what}: {os.strerror(error)}")
        return came

    def _listen(self) -> None:
        """Take records off the socket as they come (`_drain`): while they come, a batch
        every `next_gather` (`_gather`); on a quiet socket, as soon as one comes, looking
        again every `_WAKE_SECONDS` (whether it was closed, and that it is still empty)."""
        first = _GATHER_SECONDS[0] / _RAMP  # the next gather: the least
        drained_at, gather = _monotonic(), first
        while not self._closed.is_set():
            came = self._drain()
            if came:
                now = _monotonic()
                gather = next_gather(came, now - drained_at, gather)
                drained_at = now
                if self._gather(gather):  # a pass has read every process
                    gather = first
            else:
                self._wait()
                gather = first

    def _gather(self, seconds: float) -> bool:
        """Let records gather in the socket for `seconds`; True where a pass that has read
        every process (`pass_read`) ended it sooner, or `close`."""
        if self._nudged.wait(seconds):
            self._nudged.clear()
            return True
        return False

    def _drain(self) -> int:
        """Take every record the socket holds now, in batches (collector/datagrams.py:
        `recvmmsg`, up to 256 a call); how many came. Each is stamped with the clock when
        its batch was read, and with how long it may have waited: since the last read that
        found the socket empty (the clock taken before that read), so never less than it
        did. One reader at a time (the listener's thread, or a pass: `pass_began`)."""
        clock, refused, take = self.clock, self.refused, self._take_one
        came = 0
        with self._lock:
            reader = self._reader
            tried_at = clock()
            while True:
                try:
                    got = reader.receive()
                except (BlockingIOError, TimeoutError):  # empty since `tried_at` at least
                    self._empty_at = tried_at
                    return came
                except OSError as error:
                    if error.errno == errno.ENOBUFS:  # the buffer overflowed: records lost
                        self.overflows += 1
                        continue
                    if error.errno in (errno.ENOSYS, errno.EPERM) and isinstance(
                        reader, datagrams.Batches
                    ):  # refused `recvmmsg` (a seccomp profile): a datagram a call
                        log.warning("exit records: recvmmsg refused (%s)", error.strerror)
                        reader = self._reader = datagrams.OneByOne(self._socket)
                        continue
                    if error.errno not in (errno.EBADF, errno.ENOTSOCK):
                        log.debug("exit records: %s", error)
                    self._closed.set()  # closed, or failing: listening ends
                    return came
                now = tried_at = clock()  # (before the next read: it may find it empty)
                waited = now - self._empty_at
                buffer, slot, sizes, ports = reader.buffer, reader.slot, reader.sizes, reader.ports
                cut = False
                for i in range(got):
                    if ports[i]:  # another process, sending to our port (`from_kernel`)
                        refused["not_kernel"] += 1
                        continue
                    size = sizes[i]
                    if size <= 0:
                        if size:  # cut to its slot (`datagrams.MSG_TRUNC`)
                            refused["malformed"] += 1
                            cut = True
                        continue
                    came += 1
                    if not take(buffer, i * slot, size, now, waited):
                        self._take_message(bytes(buffer[i * slot : i * slot + size]), now, waited)
                if cut and isinstance(reader, datagrams.Batches):
                    reader = self._reader = self._wider(reader)

    def _wider(self, reader: datagrams.Batches) -> datagrams.Batches:
        """The reader from now on where a datagram came cut to its slot: a kernel whose
        exit messages outgrow `datagrams.SLOT_BYTES` (`struct taskstats` grows at its end
        from one version to the next), or a message no kernel sends: slots twice as large,
        up to `datagrams.MAX_SLOT_BYTES`, said once each time."""
        if reader.slot >= datagrams.MAX_SLOT_BYTES:
            return reader
        log.warning(
            "exit records: a message longer than %d bytes was cut (refused, counted as "
            "malformed); reading %d bytes a message from now on",
            reader.slot,
            2 * reader.slot,
        )
        return datagrams.Batches(self._socket, slot=2 * reader.slot)

    def _take_message(self, data: bytes, now: int, waited: int) -> None:
        """A datagram `_take_one` does not take, read by `parse_messages` (which refuses
        what it must), each record in it taken (`_take_stats`)."""
        try:
            stats_of, _ = parse_messages(
                data, now, _as_read, family=self.family, refused=self.refused
            )
            for stats in stats_of:
                self._take_stats(stats, now, waited)
        except Exception:  # a datagram no kernel sends: listening goes on
            self.refused["malformed"] += 1
            if self.refused["malformed"] == 1:
                log.warning("exit records: a message could not be read", exc_info=True)

    def _take_one(
        self, buffer: bytes | bytearray, at: int, size: int, now: int, waited: int
    ) -> bool:
        """Take a datagram of one exit record (`size` bytes at `at` in `buffer`) in the
        kernel's own layout (its message, its
        AGGR_PID's PID and STATS, in that order; version 12 or later), in one unpack: folded
        (`Fold`) where it is a thread's, not its process's last task, that no pass read nor
        will read, else queued for the next pass (`_queued`). What follows the STATS in the
        message is not read: in a process's last task's message, its AGGR_TGID, whose sums
        are its tasks' own records again (`parse_messages` does not take them either). False
        for anything else, which `parse_messages` then reads (and refuses where it must): a
        STATS attribute after a pad (`nla_reserve_64bit` where unaligned access is slow), an
        older kernel's record; each record of those comes back here laid out the same way
        (`_take_stats`). The one step every record takes, at ~1 µs in Python (`python -m
        collector.bench.exitpath`): written for that, not in smaller steps."""
        if size < _WHOLE_BYTES:
            return False
        (length, kind, command, aggregate, pid_length, pid_kind, pid, stats_length, stats_kind,
         version, flag, delay, run, task, ppid, lived_us, utime_us, stime_us, majflt,
         read_bytes, write_bytes, voluntary, nonvoluntary, tgid,
         group_lived_us) = _WHOLE.unpack_from(buffer, at)  # fmt: skip
        if not (
            kind == self.family
            and command == TASKSTATS_CMD_NEW
            and aggregate & 0x3FFF == TASKSTATS_TYPE_AGGR_PID
            and pid_length == 8
            and pid_kind == TASKSTATS_TYPE_PID
            and stats_kind == TASKSTATS_TYPE_STATS
            and stats_length >= _STATS_ATTRIBUTE_BYTES
            and _STATS_END + stats_length <= length <= size <= (length + 3) & ~3
            and version >= _TGID_VERSION
            and task == pid
        ):
            return False
        born_after = self._born_after
        if (
            flag & AGROUP
            or tgid == task
            or born_after is None
            or now - lived_us * 1000 - waited <= born_after
            or (self._listing_from is not None and now >= self._listing_from)
        ):
            comm = bytes(buffer[at + _STATS_AT + 80 : at + _STATS_AT + 96])
            packed = _PACKED.pack(
                task, tgid, ppid, bool(flag & AGROUP), comm, now, lived_us * 1000,
                group_lived_us * 1000, run, delay, voluntary, nonvoluntary, read_bytes,
                write_bytes, utime_us, stime_us, majflt, waited,
            )  # fmt: skip
            self._queued(packed, ppid)
            return True
        start_ns = now - group_lived_us * 1000
        fold = self._folds.get(tgid)
        # the same process: the two starts as far apart as the records may have waited
        if fold is None or abs(start_ns - fold.start_ns) > max(waited, fold.waited_ns) + _SAME_NS:
            if fold is not None:
                self._folds_done.append(fold)
            born = start_ns - waited > born_after
            fold = self._folds[tgid] = Fold(tgid, ppid, start_ns, waited, born, now)
        elif waited > fold.waited_ns:
            fold.waited_ns = waited
        fold.tasks += 1
        fold.on_cpu_ns += run
        fold.run_delay_ns += delay
        fold.voluntary_switches += voluntary
        fold.nonvoluntary_switches += nonvoluntary
        fold.read_bytes += read_bytes
        fold.write_bytes += write_bytes
        fold.utime_us += utime_us
        fold.stime_us += stime_us
        fold.major_faults += majflt
        self.folded += 1
        return True

    def _take_stats(self, data: bytes, now: int, waited: int) -> None:
        """One record (`struct taskstats`) of a message `_take_one` does not take: laid out
        as one record's message and taken by it where it is of version 12 or later, else
        queued (an older kernel's names no process: no fold), or refused where too short.
        (A listener given no family, as a test's may be, queues them all.)"""
        if len(data) >= _STATS.size and _HEAD.unpack_from(data, 0)[0] >= _TGID_VERSION:
            pid = _IDS.unpack_from(data, 128)[0]
            stats_length = 4 + len(data)
            head = _MESSAGE.pack(
                _STATS_END + stats_length, self.family or 0, 0, 0, 0, TASKSTATS_CMD_NEW, 1,
                0, 12 + stats_length, TASKSTATS_TYPE_AGGR_PID, 8, TASKSTATS_TYPE_PID, pid,
                stats_length, TASKSTATS_TYPE_STATS,
            )  # fmt: skip
            message = head + data
            if self._take_one(message, 0, len(message), now, waited):
                return
        packed = pack_stats(data, now, waited)
        if packed is None:
            self.refused["malformed"] += 1
        else:
            self._queued(packed, _PACKED.unpack_from(packed)[2])

    def _queued(self, packed: bytes, ppid: int) -> bool:
        """Queue one record for the next pass, by its task's parent. Past MAX_QUEUED, one
        record of the parent with the most queued is dropped, the newest: a storm's
        records go first, not those of the tasks beside it; each loss is counted by
        parent (`lost`), for the pass to count by group. (Under the lock, as `_drain`
        takes records; at registration, before the thread starts.)"""
        self._queued_in += 1
        queues = self._queues
        queue = queues.get(ppid)
        if queue is None:
            queue = queues[ppid] = bytearray()
        size = len(queue) // PACKED_BYTES
        if self._queued_count < MAX_QUEUED:
            self._queued_count += 1
        else:
            self.dropped += 1
            if size >= self._most:  # its parent has the most queued (or as many): it goes
                self.lost[ppid] += 1
                return True
            most = next(iter(self._sizes[self._most]))  # the storm's newest goes instead
            del queues[most][-PACKED_BYTES:]
            self._shrink(most, self._most)
            self.lost[most] += 1
        queue += packed
        self._grow(ppid, size)
        return True

    def _grow(self, ppid: int, size: int) -> None:
        """Parent `ppid`, which had `size` records queued, has one more."""
        sizes = self._sizes
        if size:
            self._leave(ppid, size)
        sizes.setdefault(size + 1, set()).add(ppid)
        if size + 1 > self._most:
            self._most = size + 1

    def _shrink(self, ppid: int, size: int) -> None:
        """Parent `ppid`, which had `size` records queued, has one fewer: the most any has
        queued is then at least `size - 1` (it has that many)."""
        self._leave(ppid, size)
        if size > 1:
            self._sizes.setdefault(size - 1, set()).add(ppid)
        while self._most and self._most not in self._sizes:
            self._most -= 1

    def _leave(self, ppid: int, size: int) -> None:
        bucket = self._sizes[size]
        bucket.discard(ppid)
        if not bucket:
            del self._sizes[size]

    def pass_began(self) -> None:
        """A pass begins listing now: what the socket holds is taken first (those tasks
        exited before it), and what comes from now on may be of a task it reads, and is
        queued for it, not folded."""
        if self._thread.is_alive():
            self._drain()
        self._listing_from = self.clock()

    def pass_read(self, read_until_ns: int) -> None:
        """The pass under way had read every process by `read_until_ns`: a task begun
        after that, gone before the next pass lists, is read by no pass and may be folded."""
        with self._lock:
            self._born_after, self._listing_from = read_until_ns, None
        self._nudged.set()  # what the socket holds is taken now, the next batch soon after

    def take(self) -> tuple[ExitRecords, list[Fold]]:
        """The records queued since the last take, in the order they came, and the tasks
        folded meanwhile, by process; what the socket holds now taken first (a process the
        pass found gone has sent its record: its end, `ExitRecords.ends`)."""
        if self._thread.is_alive():
            self._drain()
        with self._lock:
            records = self._taken()
            folds = [*self._folds_done, *self._folds.values()]
            self._folds, self._folds_done = {}, []
        return records, folds

    def _taken(self) -> ExitRecords:
        """The records queued, every parent's in the order they came (under the lock)."""
        records = ExitRecords(b"".join(self._queues.values()))
        self._queues, self._queued_count, self._sizes, self._most = {}, 0, {}, 0
        return records

    def take_lost(self) -> Counter[int]:
        """The records dropped since the last take of them, by their tasks' parent."""
        with self._lock:
            lost, self.lost = self.lost, Counter()
        return lost

    def _wait(self) -> None:
        """Until the socket has something to read, or `_WAKE_SECONDS` (a pass that read
        every process meanwhile asks nothing more: the next batch is the least gather)."""
        self._nudged.clear()
        try:
            select.select([self._socket], [], [], _WAKE_SECONDS)
        except (OSError, TypeError, ValueError):  # closed meanwhile, or no descriptor
            time.sleep(0.01)

    def drain(self) -> ExitRecords:
        """The records queued since the last drain, in the order they came (`take` gives
        the folded ones too)."""
        with self._lock:
            return self._taken()

    def close(self) -> None:
        """Stop listening: the thread ends within `_WAKE_SECONDS`, then the socket closes
        (the kernel sends a closed listener nothing more)."""
        self._closed.set()
        self._nudged.set()
        if self._thread.is_alive():
            self._thread.join(2 * _WAKE_SECONDS)
        with self._lock:  # not while a read is made (`datagrams.Batches`: its descriptor)
            self._socket.close()
