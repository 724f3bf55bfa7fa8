"""An OCI reference as the cache commands take it: ``oci://HOST[:PORT]/REPO[:TAG][@sha256:HEX]``.

``oci://`` speaks HTTPS (TLS verified against the system's trust store, ``SSL_CERT_FILE`` and
Docker's ``/etc/docker/certs.d/HOST[:PORT]/*.crt``).  ``oci+http://`` is the explicit opt-out
for plain HTTP, accepted only for a loopback host (``localhost``, ``127.0.0.0/8``, ``[::1]``):
a registry elsewhere never gets credentials or serves caches in clear.

The grammar is the distribution project's: repository path components of lowercase letters
and digits joined by ``.``, ``_``, ``__`` or dashes, at most 255 characters; a tag of at most
128 characters; a digest in sha256 only (the one algorithm every registry supports).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from cache_tools.errors import CacheError, printable

SECURE = "oci"
PLAIN = "oci+http"
#: a reference longer than this is refused before it is parsed
MAX_REFERENCE_CHARS = 1024
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
_HINT = ("write oci://HOST[:PORT]/REPO[:TAG] or oci://HOST[:PORT]/REPO@sha256:DIGEST "
         "(oci+http:// for a plain-HTTP registry on loopback)")


@dataclass(frozen=True)
class Reference:
    """A parsed reference; ``str()`` is its one spelling in every message."""

    plain_http: bool
    host: str
    port: int | None
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def netloc(self) -> str:
        """``HOST[:PORT]``: the key of Docker's credentials and certificates."""
        return f"{self.host}:{self.port}" if self.port is not None else self.host

    @property
    def base_url(self) -> str:
        return f"{'http' if self.plain_http else 'https'}://{self.netloc}"

    def api(self, path: str) -> str:
        """The URL of ``/v2/<repository>/<path>``."""
        return f"{self.base_url}/v2/{self.repository}/{path}"

    def at(self, *, tag: str | None = None, digest: str | None = None) -> "Reference":
        """This repository at another tag or digest."""
        return Reference(self.plain_http, self.host, self.port, self.repository, tag, digest)

    def __str__(self) -> str:
        scheme = PLAIN if self.plain_http else SECURE
        return f"{scheme}://{self.netloc}/{self.repository}" + \
            (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def is_reference(text: str) -> bool:
    """Whether ``text`` is meant as an OCI reference (its scheme says so)."""
    return text.startswith((f"{SECURE}://", f"{PLAIN}://"))


def parse(text: str) -> Reference:
    """The reference ``text``; a CacheError (exit 1) naming what is wrong with it."""
    shown = printable(text[:200])
    if len(text) > MAX_REFERENCE_CHARS:
        raise CacheError(f"{shown}...: an OCI reference of {len(text)} characters (at most "
                         f"{MAX_REFERENCE_CHARS})", hint=_HINT)
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in (SECURE, PLAIN):
        raise CacheError(f"{shown}: not an OCI reference", hint=_HINT)
    netloc, slash, path = rest.partition("/")
    if not slash or not path:
        raise CacheError(f"{shown}: no repository after the registry", hint=_HINT)
    host, port = _host_port(netloc, shown)
    path, at, digest = path.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        what = "only sha256 digests are accepted" if not digest.startswith("sha256:") else \
            "a sha256 digest is 64 lowercase hex digits"
        raise CacheError(f"{shown}: digest '{printable(digest[:80])}': {what}", hint=_HINT)
    repo, colon, tag = path.rpartition(":") if ":" in path else (path, "", "")
    if colon and not _TAG.fullmatch(tag):
        raise CacheError(f"{shown}: tag '{printable(tag[:80])}' is not a valid tag (letters, "
                         "digits, '_', '.', '-'; at most 128; not starting with '.' or '-')",
                         hint=_HINT)
    if len(repo) > 255 or not _REPO.fullmatch(repo):
        raise CacheError(f"{shown}: repository '{printable(repo[:80])}' is not a valid name "
                         "(lowercase path components of letters and digits joined by '.', "
                         "'_' or '-'; at most 255 characters)", hint=_HINT)
    ref = Reference(scheme == PLAIN, host, port, repo, tag or None, digest or None)
    if ref.plain_http and not is_loopback(host):
        raise CacheError(f"{shown}: plain HTTP (oci+http://) is allowed for a registry on "
                         f"loopback only, not {host}",
                         hint="use oci:// (TLS); give the registry's CA with SSL_CERT_FILE or "
                              f"/etc/docker/certs.d/{ref.netloc}/ca.crt")
    return ref


def _host_port(netloc: str, shown: str) -> tuple[str, int | None]:
    if "@" in netloc:
        raise CacheError(f"{shown}: credentials do not go in the reference",
                         hint="log in with `docker login` (DOCKER_CONFIG/config.json is read)")
    host, port_text = netloc, ""
    if netloc.startswith("["):
        end = netloc.find("]")
        host, port_text = netloc[:end + 1], netloc[end + 1:]
        if port_text and not port_text.startswith(":"):
            port_text = "?"
        port_text = port_text[1:]
    elif ":" in netloc:
        host, _, port_text = netloc.partition(":")
    if not _HOST.fullmatch(host):
        raise CacheError(f"{shown}: '{printable(host[:80])}' is not a registry host", hint=_HINT)
    if port_text == "" and (netloc.endswith(":")):
        raise CacheError(f"{shown}: empty port", hint=_HINT)
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise CacheError(f"{shown}: port '{printable(port_text[:20])}' is not a port "
                             "number (1-65535)", hint=_HINT)
        return host, int(port_text)
    return host, None


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (by name or literal only: nothing is resolved)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
