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
import ssl
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


@dataclass
class WebConfig:
    tls: tlslib.Server | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    _dummy: bytes = b""  # compared against for an unknown user: the same cost as a known one
    _verified: set[bytes] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _bcrypt: threading.Lock = field(default_factory=threading.Lock)
    files: tuple[str, ...] = ()  # the files it was read from: its own, then those it names
    client_auth: str = "NoClientCert"  # tls_server_config's client_auth_type

    @property
    def authenticates(self) -> bool:
        """Whether every client is someone: basic auth users, or TLS that wants a client
        certificate its CA verified (`RequireAndVerifyClientCert`); any certificate
        (`RequireAnyClientCert`) proves nothing."""
        return bool(self.users) or (
            self.tls is not None and self.client_auth == "RequireAndVerifyClientCert"
        )

    def __post_init__(self) -> None:
        if self.users and not self._dummy:
            self._dummy = _dummy_hash(self.users)

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
                if self._key(hashed, user, password) in self._verified:
                    return True
        return None

    def authorized(self, header: str | None) -> bool:
        """Whether an `Authorization` header passes basic auth (always, without users).

        An unknown user's password is checked against a dummy hash of the users' cost, so
        that the answer takes as long as for a known user (exporter-toolkit does the same):
        the time does not tell which users exist. bcrypt checks run one at a time. A
        verified (user, password) pair is remembered by a keyed digest, as the toolkit
        does, so that a scrape with right credentials costs microseconds after its first."""
        quick = self.remembered(header)
        if quick is not None:
            return quick
        credentials = _credentials(header)
        assert credentials is not None
        user, password = credentials
        hashed = self.users.get(user)
        with self._bcrypt:
            try:
                ok = bcrypt.checkpw(password[:BCRYPT_MAX_BYTES], hashed or self._dummy)
            except ValueError:  # a password bcrypt refuses (a NUL byte in older versions)
                ok = False
        if not ok or hashed is None:
            return False
        with self._lock:
            self._verified.add(self._key(hashed, user, password))
        return True

    @staticmethod
    def _key(hashed: bytes, user: str, password: bytes) -> bytes:
        # what bcrypt reads: a longer password's tail makes no entry of its own
        password = password[:BCRYPT_MAX_BYTES]
        return hmac.new(hashed, user.encode() + b":" + password, hashlib.sha256).digest()


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


def _dummy_hash(users: dict[str, bytes]) -> bytes:
    """A hash of a random password at the highest cost among the users' hashes."""
    cost = max(int(hashed.split(b"$")[2]) for hashed in users.values())
    return bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=cost))


def load(path: str) -> WebConfig:
    try:
        with open(path, "rb") as source:
            document = yaml.safe_load(source)
    except OSError as error:
        raise WebConfigError(f"{path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise WebConfigError(f"{path}: not YAML: {str(error).splitlines()[0]}") from None
    if document is None:
        return WebConfig()
    if not isinstance(document, dict):
        raise WebConfigError(f"{path}: want a mapping at the top")
    unknown = set(document) - _TOP_KEYS
    if unknown:
        raise WebConfigError(f"{path}: unknown or unsupported field {sorted(unknown)[0]!r}")
    base = os.path.dirname(os.path.abspath(path))
    config = WebConfig(files=(path,))
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
        encoded = str(hashed).encode()
        try:
            bcrypt.checkpw(b"", encoded)
        except ValueError:
            raise WebConfigError(f"{path}: basic_auth_users: {user}: not a bcrypt hash") from None
        config.users[str(user)] = encoded
    if config.users:
        config._dummy = _dummy_hash(config.users)
    return config


class WebConfigFile:
    """`--web.config.file`, re-read as exporter-toolkit re-reads it, so that rotating a
    Kubernetes Secret (a user removed, a password or a certificate changed) needs no
    restart. At most once every `every` seconds, at a request or a connection, the file and
    the files it names are looked at (their inode, size and times: a Secret's update swaps a
    symbolic link); where one changed, the file is loaded anew and replaces the
    configuration in force, remembered passwords included. A file that no longer loads
    (not YAML, deleted, a certificate missing) leaves the last good configuration in force
    and is said once in the log, until it changes again. Turning TLS on or off takes a
    restart, as in exporter-toolkit: such a file is refused the same way. `reload()`
    re-reads it at once (SIGHUP)."""

    def __init__(
        self, path: str, every: float = 1.0, monotonic: Callable[[], float] = time.monotonic
    ):
        self.path = path
        self.every = every
        self.monotonic = monotonic
        self._config = load(path)  # a bad file fails at start-up
        self._stamp = _stamp(self._config.files)
        self._next = monotonic() + every
        self._failure: str | None = None
        self._lock = threading.Lock()

    def current(self) -> WebConfig:
        """The configuration in force, re-read first where its files changed."""
        if self.monotonic() < self._next:
            return self._config
        return self._check(force=False)

    def reload(self) -> WebConfig:
        """Re-read the file now, changed or not, and say what came of it."""
        return self._check(force=True)

    def _check(self, force: bool) -> WebConfig:
        with self._lock:
            self._next = self.monotonic() + self.every
            stamp = _stamp(self._config.files)
            if stamp == self._stamp and not force:
                return self._config
            self._stamp = stamp
            try:
                config = load(self.path)
                if (config.tls is None) != (self._config.tls is None):
                    raise WebConfigError(f"{self.path}: turning TLS on or off takes a restart")
            except WebConfigError as error:
                if force or str(error) != self._failure:
                    log.error("--web.config.file not reloaded, the last good one stays: %s", error)
                self._failure = str(error)
                return self._config
            self._failure = None
            self._config = config
            self._stamp = _stamp(config.files)
            log.info(
                "--web.config.file reloaded from %s: tls=%s basic_auth=%s users=%d",
                self.path,
                config.tls is not None,
                bool(config.users),
                len(config.users),
            )
            return config


def _stamp(paths: tuple[str, ...]) -> tuple:
    """What tells that a file changed: its device, inode, size and times, or why it
    cannot be looked at."""
    stamps = []
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
    if "client_ca_file" in tls:
        try:
            context.load_verify_locations(resolve("client_ca_file"))
        except (OSError, ssl.SSLError) as error:
            reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or error
            raise WebConfigError(
                f"{path}: tls_server_config: cannot load client_ca_file: {reason}"
            ) from None
    elif auth in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven"):
        raise WebConfigError(f"{path}: tls_server_config: {auth} needs a client_ca_file")
    if verify is None:  # asks for a certificate and takes any: what `ssl` cannot do
        return tlslib.UnverifiedServer(
            context,
            resolve("cert_file"),
            resolve("key_file"),
            required=auth == "RequireAnyClientCert",
        )
    return tlslib.StdlibServer(context)


def _bad(path: str, name: str, value: object):
    raise WebConfigError(f"{path}: tls_server_config: {name}: unsupported value {value!r}")
