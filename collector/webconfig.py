"""`--web.config.file`: TLS and basic auth in the Prometheus exporter-toolkit format.

    tls_server_config:
      cert_file: server.crt          # paths relative to this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional
      client_ca_file: ca.crt                         # optional
      min_version: TLS12                             # optional
    basic_auth_users:
      alice: $2y$10$...              # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

Everything is checked when the file is loaded, so a bad file fails at start-up. `serve`
re-reads it as exporter-toolkit does (`WebConfigFile`): a change to it, or to the files it
names, takes effect at the next request or connection, and a file that no longer loads
keeps the last good configuration in force, said once in the log.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import ssl
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import bcrypt
import yaml

from collector import tls as tlslib

log = logging.getLogger("procdelta")


class WebConfigError(ValueError):
    """A web configuration file that cannot be used, with the reason in one line."""


_CLIENT_AUTH: dict[str, ssl.VerifyMode | None] = {
    # exporter-toolkit's names, with Go's crypto/tls meaning; None: asked for, not verified
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": None,
    "RequireAnyClientCert": None,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
}
_TOP_KEYS = {"tls_server_config", "basic_auth_users"}
# The toolkit's other fields (cipher_suites, curve_preferences, http_server_config, …) are
# refused as unsupported rather than silently ignored.


BCRYPT_MAX_BYTES = 72
"""bcrypt reads no further into a password; htpasswd and bcrypt < 5 cut longer ones here
when they hash them, so the check cuts them too (bcrypt 5 raises instead)."""

MAX_BCRYPT_COST = 14
"""The highest bcrypt cost a user's hash may have. Each step doubles a check's CPU, and the
first scrape of a password waits for one; beyond this bound a check takes seconds, and at
Go's own bound (31) days: such a hash is refused when the file is loaded, at start-up too.
docs/operating.md gives a check's time at each cost."""

MAX_FILE_BYTES = 1 << 20
"""The largest web configuration, certificate, key or CA file read."""

_BCRYPT_HASH = re.compile(rb"\$2[aby]\$(?P<cost>[0-9]{2})\$[./A-Za-z0-9]{53}")


def _cost(hashed: bytes) -> int:
    return int(hashed[4:6])


@dataclass
class WebConfig:
    tls: tlslib.Server | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    # by bcrypt cost, a hash of a random password: an unknown user is checked against the
    # highest cost's, a known one's check followed by those of the costs above its own
    _dummies: dict[int, bytes] = field(default_factory=dict)
    _verified: set[tuple[str, bytes]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _bcrypt: threading.Lock = field(default_factory=threading.Lock)
    files: tuple[str, ...] = ()  # the files it was read from: its own, then those it names
    client_auth: str = "NoClientCert"  # tls_server_config's client_auth_type

    @property
    def authenticates(self) -> bool:
        """Whether every client is someone: basic auth users, or TLS that wants a client
        certificate its CA verified (`RequireAndVerifyClientCert`); any certificate
        (`RequireAnyClientCert`) proves nothing."""
        return bool(self.users) or self.verifies_clients

    @property
    def verifies_clients(self) -> bool:
        """Whether every connection's handshake verified a client certificate."""
        return self.tls is not None and self.client_auth == "RequireAndVerifyClientCert"

    def __post_init__(self) -> None:
        if self.users and not self._dummies:
            self._dummies = _dummies(self.users, {})

    def current(self) -> WebConfig:
        """The configuration in force: this one (a `WebConfigFile` re-reads its file)."""
        return self

    def remembered(self, header: str | None) -> bool | None:
        """`authorized(header)` when it needs no bcrypt check (no users, a malformed
        header, credentials verified before), else None: cheap enough for the event loop."""
        if not self.users:
            return True
        credentials = _credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self.users.get(user)
        if hashed is not None:
            with self._lock:
                if (user, self._key(hashed, user, password)) in self._verified:
                    return True
        return None

    def authorized(self, header: str | None) -> bool:
        """Whether an `Authorization` header passes basic auth (always, without users).

        Every check costs what one at the users' highest cost does, so that the time of
        the answer tells nothing of the users: an unknown user's password is checked
        against a dummy hash of that cost (as exporter-toolkit does), and a known user's
        check at a lower cost c is followed by one against a dummy of each cost from c to
        the highest less one (2^c + 2^c + … + 2^(max-1) = 2^max). bcrypt checks run one at
        a time. A verified (user, password) pair is remembered by a keyed digest, as the
        toolkit does, so that a scrape with right credentials costs microseconds after its
        first."""
        quick = self.remembered(header)
        if quick is not None:
            return quick
        credentials = _credentials(header)
        assert credentials is not None
        user, password = credentials
        password = password[:BCRYPT_MAX_BYTES]
        hashed = self.users.get(user)
        highest = max(self._dummies)
        if hashed is None:
            checks = [self._dummies[highest]]
        else:
            checks = [hashed, *(self._dummies[c] for c in range(_cost(hashed), highest))]
        with self._bcrypt:
            ok = _checked(password, checks[0])
            for pad in checks[1:]:  # the time of a check at the highest cost
                _checked(password, pad)
        if not ok or hashed is None:
            return False
        with self._lock:
            self._verified.add((user, self._key(hashed, user, password)))
        return True

    def adopt(self, previous: WebConfig) -> None:
        """Remember what `previous` verified of each user whose hash did not change: a
        re-read (a renewed certificate, a Secret synced, SIGHUP) forgets no scraper."""
        with previous._lock:
            kept = {
                (u, k) for u, k in previous._verified if previous.users.get(u) == self.users.get(u)
            }
        with self._lock:
            self._verified |= kept

    @staticmethod
    def _key(hashed: bytes, user: str, password: bytes) -> bytes:
        # what bcrypt reads: a longer password's tail makes no entry of its own
        password = password[:BCRYPT_MAX_BYTES]
        return hmac.new(hashed, user.encode() + b":" + password, hashlib.sha256).digest()


def _checked(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a password bcrypt refuses (a NUL byte in older versions)
        return False


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """The (user, password) of a Basic `Authorization` header, None if it is not one."""
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        user, sep, password = base64.b64decode(header[6:].strip(), validate=True).partition(b":")
        name = user.decode("utf-8")
    except ValueError:  # not base64, or a user name that is not UTF-8
        return None
    if not sep:
        return None
    return name, password


def _dummies(users: dict[str, bytes], known: dict[int, bytes]) -> dict[int, bytes]:
    """A hash of a random password at each cost from the users' lowest to their highest,
    taken from `known` where it has one (a re-read of the same users makes none)."""
    costs = [_cost(hashed) for hashed in users.values()]
    return {
        cost: known.get(cost)
        or bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=cost))
        for cost in range(min(costs), max(costs) + 1)
    }


def _read(path: str, what: str) -> bytes:
    """A file's bytes, where it is a regular file of at most MAX_FILE_BYTES: a FIFO or a
    device would block the read or never end it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise WebConfigError(f"{what}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WebConfigError(f"{what}: not a regular file")
        data = source.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise WebConfigError(f"{what}: larger than {MAX_FILE_BYTES} bytes")
    return data


def load(path: str, previous: WebConfig | None = None) -> WebConfig:
    """The configuration `path` holds, every file it names checked; `previous`, the one in
    force, lends the dummy hashes it made."""
    text = _read(path, path)
    try:
        document = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as error:
        raise WebConfigError(f"{path}: not YAML: {str(error).splitlines()[0]}") from None
    config = WebConfig(files=(path,))
    if document is None:
        return config
    if not isinstance(document, dict):
        raise WebConfigError(f"{path}: want a mapping at the top")
    unknown = set(document) - _TOP_KEYS
    if unknown:
        raise WebConfigError(f"{path}: unknown or unsupported field {sorted(unknown)[0]!r}")
    base = os.path.dirname(os.path.abspath(path))
    tls = document.get("tls_server_config")
    if tls is not None:
        config.tls = _tls_server(path, base, tls)
        config.client_auth = str(tls.get("client_auth_type", "NoClientCert"))
        names = ("cert_file", "key_file", "client_ca_file")
        config.files += tuple(os.path.join(base, str(tls[n])) for n in names if n in tls)
    users = document.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise WebConfigError(f"{path}: basic_auth_users: want user: bcrypt-hash pairs")
    for user, hashed in users.items():
        config.users[str(user)] = _bcrypt_hash(path, str(user), str(hashed).encode())
    if config.users:
        config._dummies = _dummies(config.users, previous._dummies if previous else {})
    return config


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML has it: a re-read parses in C, off the interpreter."""


def _bcrypt_hash(path: str, user: str, hashed: bytes) -> bytes:
    """A user's bcrypt hash, checked for its shape and its cost before any bcrypt work: the
    salt is checked by a hash at the lowest cost, which reads it as the user's would."""
    shaped = _BCRYPT_HASH.fullmatch(hashed)
    try:
        if shaped is None:
            raise ValueError
        bcrypt.checkpw(b"", hashed[:4] + b"04" + hashed[6:])
    except ValueError:
        raise WebConfigError(f"{path}: basic_auth_users: {user}: not a bcrypt hash") from None
    if _cost(hashed) > MAX_BCRYPT_COST:
        raise WebConfigError(
            f"{path}: basic_auth_users: {user}: bcrypt cost {_cost(hashed)} is above "
            f"{MAX_BCRYPT_COST}: each check would take seconds or more; hash it anew "
            f"(htpasswd -nBC 10)"
        )
    return hashed


class WebConfigFile:
    """`--web.config.file`, re-read as exporter-toolkit re-reads it, so that rotating a
    Kubernetes Secret (a user removed, a password or a certificate changed) needs no
    restart. At most once every `every` seconds, at a request or a connection, the file and
    the files it names are looked at (their inode, size and times: a Secret's update swaps a
    symbolic link), for as long as it serves; where one changed, the file is loaded anew,
    off the event loop (`run`: a thread of its own), and swapped in once loaded. The
    passwords remembered of users whose hash did not change are kept.

    A re-read never turns TLS or authentication off: a file that no longer loads (not YAML,
    deleted, a certificate missing), or that loads to less authentication than the
    configuration in force (no users where there were, a client certificate no longer
    verified, an empty file), or TLS on or off, leaves the last good configuration in
    force, said once at warning level until the file changes again. Those take a restart,
    as in exporter-toolkit. `reload()` re-reads it at once (SIGHUP); re-reads asked while
    one runs are done once, after it, a second at least after it began."""

    def __init__(
        self,
        path: str,
        every: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        run: Callable[[Callable[[], None]], None] | None = None,
    ):
        self.path = path
        self.every = every
        self.monotonic = monotonic
        self._run = run or _in_a_thread
        self._config = load(path)  # a bad file fails at start-up
        self._stamp = _stamp(self._config.files)
        self._next = monotonic() + every
        self._failure: str | None = None
        self._lock = threading.Lock()
        self._loading = False  # a re-read runs
        self._asked: bool | None = None  # asked while one ran: forced (True) or not
        self._swapped: list[Callable[[WebConfig, WebConfig], None]] = []

    def current(self) -> WebConfig:
        """The configuration in force; where its files changed, a re-read is started."""
        if self.monotonic() < self._next:
            return self._config
        with self._lock:
            self._next = self.monotonic() + self.every
            stamp = _stamp(self._config.files)
            if stamp == self._stamp:
                return self._config
            self._stamp = stamp
        self._ask(force=False)
        return self._config

    def reload(self) -> WebConfig:
        """Re-read the file now, changed or not, and say what came of it; the
        configuration in force is returned (the new one, where `run` ran it already)."""
        self._ask(force=True)
        return self._config

    def on_swap(self, callback: Callable[[WebConfig, WebConfig], None]) -> None:
        """Call `callback(old, new)`, from the re-reading thread, at each swap."""
        self._swapped.append(callback)

    def _ask(self, force: bool) -> None:
        with self._lock:
            if self._loading:
                self._asked = bool(self._asked) or force
                return
            self._loading = True
        self._run(lambda: self._reread(force))

    def _reread(self, force: bool) -> None:
        while True:
            began = self.monotonic()
            try:
                self._load(force)
            finally:
                with self._lock:
                    asked, self._asked = self._asked, None
                    if asked is None:
                        self._loading = False
            if asked is None:
                return
            force = asked
            time.sleep(max(0.0, min(self.every, began + self.every - self.monotonic())))

    def _load(self, force: bool) -> None:
        old = self._config
        try:
            config = load(self.path, previous=old)
            _keeps_protection(self.path, old, config)
        except WebConfigError as error:
            if force or str(error) != self._failure:
                log.warning("--web.config.file not reloaded, the last good one stays: %s", error)
            self._failure = str(error)
            return
        self._failure = None
        config.adopt(old)
        with self._lock:
            self._config = config
            self._stamp = _stamp(config.files)
        log.info(
            "--web.config.file reloaded from %s: tls=%s basic_auth=%s users=%d",
            self.path,
            config.tls is not None,
            bool(config.users),
            len(config.users),
        )
        for callback in self._swapped:
            callback(old, config)


def _keeps_protection(path: str, old: WebConfig, new: WebConfig) -> None:
    """Raise unless `new` protects what `old` did: TLS as it was, users where there were,
    client certificates verified where they were."""
    if (new.tls is None) != (old.tls is None):
        raise WebConfigError(f"{path}: turning TLS on or off takes a restart")
    if old.users and not new.users:
        raise WebConfigError(f"{path}: no basic_auth_users: turning basic auth off takes a restart")
    if old.verifies_clients and not new.verifies_clients:
        raise WebConfigError(
            f"{path}: client_auth_type {new.client_auth}: turning client certificate "
            "verification off takes a restart"
        )


def _in_a_thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="web-config", daemon=True).start()


def _stamp(paths: tuple[str, ...]) -> tuple:
    """What tells that a file changed: its device, inode, size and times, or why it
    cannot be looked at."""
    stamps: list[tuple[str | int | None, ...]] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as error:
            stamps.append((path, error.errno))
        else:
            stamps.append((path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamps)


def _tls_server(path: str, base: str, tls: object) -> tlslib.Server:
    if not isinstance(tls, dict):
        raise WebConfigError(f"{path}: tls_server_config: want a mapping")
    unknown = set(tls) - _TLS_KEYS
    if unknown:
        raise WebConfigError(
            f"{path}: tls_server_config: unknown or unsupported field {sorted(unknown)[0]!r}"
        )
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise WebConfigError(f"{path}: tls_server_config: cert_file and key_file are required")

    def resolve(name: str) -> str:
        return os.path.join(base, str(tls[name]))

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS.get(str(tls.get("min_version", "TLS12"))) or _bad(
        path, "min_version", tls.get("min_version")
    )
    if "max_version" in tls:
        context.maximum_version = _VERSIONS.get(str(tls["max_version"])) or _bad(
            path, "max_version", tls["max_version"]
        )
    for name in ("cert_file", "key_file"):
        _read(resolve(name), f"{path}: tls_server_config: cannot load cert_file/key_file")
    try:
        context.load_cert_chain(resolve("cert_file"), resolve("key_file"))
    except (OSError, ssl.SSLError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or error
        raise WebConfigError(
            f"{path}: tls_server_config: cannot load cert_file/key_file: {reason}"
        ) from None
    auth = str(tls.get("client_auth_type", "NoClientCert"))
    if auth not in _CLIENT_AUTH:
        _bad(path, "client_auth_type", auth)
    verify = _CLIENT_AUTH[auth]
    context.verify_mode = ssl.CERT_NONE if verify is None else verify
    authorities = b""
    if "client_ca_file" in tls:
        what = f"{path}: tls_server_config: cannot load client_ca_file"
        authorities = _read(resolve("client_ca_file"), what)
        try:
            context.load_verify_locations(resolve("client_ca_file"))
        except (OSError, ssl.SSLError) as error:
            reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or error
            raise WebConfigError(f"{what}: {reason}") from None
    elif auth in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven"):
        raise WebConfigError(f"{path}: tls_server_config: {auth} needs a client_ca_file")
    # what a client is asked for, and by which CAs it is verified: a connection made under
    # other terms is closed once idle (a renewed server certificate changes none of them)
    versions = (context.minimum_version, context.maximum_version)
    terms = hashlib.sha256(repr((auth, versions)).encode() + authorities).digest()
    if verify is None:  # asks for a certificate and takes any: what `ssl` cannot do
        return tlslib.UnverifiedServer(
            context,
            resolve("cert_file"),
            resolve("key_file"),
            required=auth == "RequireAnyClientCert",
            terms=terms,
        )
    return tlslib.StdlibServer(context, terms=terms)


def _bad(path: str, name: str, value: object):
    raise WebConfigError(f"{path}: tls_server_config: {name}: unsupported value {value!r}")
