"""Registry credentials the way registry clients find them, and the registry's challenges.

Credentials come from Docker's client configuration, ``$DOCKER_CONFIG/config.json`` (default
``~/.docker/config.json``; what ``docker login`` writes and what a Kubernetes secret of type
``kubernetes.io/dockerconfigjson`` holds as ``.dockerconfigjson``): its ``auths`` entry for the
registry, matched by ``HOST[:PORT]`` with or without ``https://`` and a path, holds ``auth``
(base64 of ``user:password``) or ``username`` and ``password``, or an ``identitytoken`` (an
OAuth2 refresh token) or a ``registrytoken`` (a bearer token used as it is).  Credential
helpers (``credsStore``, ``credHelpers``) are never run: no program is started on the word of
a configuration file; an error names them when they were the only source.

A challenge is a ``WWW-Authenticate`` header: ``Bearer realm="...",service="...",scope="..."``
(the token dance) or ``Basic realm="..."``.  Nothing here touches the network.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from cache_tools.errors import CacheError

#: Docker's client configuration above this size is refused before it is read
MAX_CONFIG_BYTES = 4 << 20
#: a WWW-Authenticate header longer than this is not parsed
MAX_CHALLENGE_CHARS = 8192
_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")
_HUB_KEY = "https://index.docker.io/v1/"
_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_.-]*)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,"]*)\s*(?:,|$)')
_SCHEME = re.compile(r"\s*,?\s*([A-Za-z][A-Za-z0-9_.-]*)(?=\s|$)")


@dataclass(frozen=True)
class Credentials:
    """What Docker's configuration holds for one registry (any field may be empty)."""

    username: str = ""
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)
    #: the configuration file they come from (for error lines)
    source: str = ""
    #: a credential helper configured for this registry (never run)
    helper: str = ""

    @property
    def usable(self) -> bool:
        return bool(self.username or self.identity_token or self.registry_token)

    def basic(self) -> str:
        """The value of an ``Authorization: Basic`` header."""
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class Challenge:
    """One ``WWW-Authenticate`` challenge: its scheme (lowercase) and parameters."""

    scheme: str
    params: Mapping[str, str]


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """Where Docker's client configuration is: ``$DOCKER_CONFIG/config.json`` or
    ``~/.docker/config.json``."""
    env = os.environ if env is None else env
    base = env.get("DOCKER_CONFIG")
    if base:
        return Path(base) / "config.json"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".docker" / "config.json"


def lookup(netloc: str, env: Mapping[str, str] | None = None) -> Credentials:
    """The credentials for the registry at ``netloc`` (``HOST[:PORT]``); empty ones when the
    configuration has none (or does not exist)."""
    path = config_path(env)
    doc = _read_config(path)
    if doc is None:
        return Credentials(source=str(path))
    host = netloc.split(":")[0] if not netloc.startswith("[") else netloc
    keys = {netloc} | ({_HUB_KEY} if host in _DOCKER_HUB else set())
    auths = doc.get("auths")
    entry = None
    if isinstance(auths, dict):
        entry = next((v for k, v in auths.items() if isinstance(k, str) and _key(k) in keys
                      and isinstance(v, dict)), None)
    helpers = doc.get("credHelpers")
    helper = helpers.get(netloc, "") if isinstance(helpers, dict) else ""
    helper = helper or (doc.get("credsStore") or "")
    helper = helper if isinstance(helper, str) else ""
    if entry is None:
        return Credentials(source=str(path), helper=helper)
    return _entry(entry, str(path), netloc, helper)


def _key(key: str) -> str:
    """An ``auths`` key as ``HOST[:PORT]``: ``https://host:5000/v1/`` -> ``host:5000``."""
    if key == _HUB_KEY:
        return key
    key = key.split("://", 1)[-1]
    return key.split("/", 1)[0]


def _entry(entry: dict[str, object], source: str, netloc: str, helper: str) -> Credentials:
    def text(name: str) -> str:
        value = entry.get(name, "")
        if not isinstance(value, str):
            raise CacheError(f"{source}: auths entry for {netloc}: {name} is not a string",
                             hint="log in again (docker login) or fix the file")
        return value

    user, password = text("username"), text("password")
    if text("auth"):
        try:
            decoded = base64.b64decode(text("auth"), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise CacheError(f"{source}: auths entry for {netloc}: auth is not base64 of "
                             "user:password", hint="log in again (docker login)") from None
        user, sep, password = decoded.partition(":")
        if not sep:
            raise CacheError(f"{source}: auths entry for {netloc}: auth holds no ':' between "
                             "user and password", hint="log in again (docker login)")
    return Credentials(user, password, text("identitytoken"), text("registrytoken"), source,
                       helper)


def _read_config(path: Path) -> dict[str, object] | None:
    """Docker's configuration, bounded; None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CacheError(f"{path}: cannot read: {exc.strerror}",
                         hint="check DOCKER_CONFIG and the file's permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheError(f"{path}: not a regular file", hint="check DOCKER_CONFIG")
        if st.st_size > MAX_CONFIG_BYTES:
            raise CacheError(f"{path}: {st.st_size} bytes exceeds the limit of "
                             f"{MAX_CONFIG_BYTES} bytes", hint="check DOCKER_CONFIG")
        data = os.read(fd, MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CacheError(f"{path}: not valid JSON",
                         hint="fix the file or log in again (docker login)") from None
    if not isinstance(doc, dict):
        raise CacheError(f"{path}: not a JSON object", hint="fix the file or log in again")
    return doc


def challenges(headers: list[str]) -> list[Challenge]:
    """Every challenge of the ``WWW-Authenticate`` headers (a malformed rest is ignored)."""
    out: list[Challenge] = []
    for header in headers:
        if len(header) > MAX_CHALLENGE_CHARS:
            continue
        pos = 0
        current: dict[str, str] | None = None
        while pos < len(header):
            m = _PARAM.match(header, pos)
            if m and current is not None:
                value = m.group(2)
                if value.startswith('"'):
                    value = re.sub(r"\\(.)", r"\1", value[1:-1])
                current.setdefault(m.group(1).lower(), value)
                pos = m.end()
                continue
            m = _SCHEME.match(header, pos)
            if not m:
                break
            current = {}
            out.append(Challenge(m.group(1).lower(), current))
            pos = m.end()
    return out
