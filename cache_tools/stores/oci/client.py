"""One repository of a registry through the OCI distribution API, over the standard library's
``http.client`` (docs/cache.md says why no client library): TLS verified by default, the
registry's auth challenge answered (a Bearer token from its realm, or Basic), every answer
bounded before it is read and every exchange bounded in time.

Bounds: a connect within ``CONNECT_TIMEOUT_S``, no socket read or write silent for longer than
``SOCKET_TIMEOUT_S``, and each whole exchange (headers and body) within its deadline, enforced
by a watchdog that shuts the socket down: ``DOCUMENT_DEADLINE_S`` for a manifest, a config, a
token or an upload's start, ``BLOB_DEADLINE_S`` plus a second per ``MIN_BLOB_RATE`` bytes for a
blob.  A document's size is checked against its limit from ``Content-Length`` before it is
read, and no more than the limit plus one byte is ever read.  At most ``MAX_REDIRECTS``
redirects (registries send blob downloads to their storage): to HTTPS only (plain HTTP only
from an ``oci+http://`` registry to loopback), the ``Authorization`` header dropped when the
host changes.  Every failure is a :class:`RemoteError` (exit 5) whose one line names the
reference and what went wrong.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from pathlib import Path
from typing import IO, Mapping
from urllib.parse import quote, urlencode, urljoin, urlsplit

from cache_tools.errors import RemoteError, printable
from cache_tools.stores.oci import auth
from cache_tools.stores.oci.answer import Answer, Sink, Watchdog
from cache_tools.stores.oci.reference import Reference, is_loopback

CONNECT_TIMEOUT_S = 10.0
SOCKET_TIMEOUT_S = 30.0
DOCUMENT_DEADLINE_S = 60.0
BLOB_DEADLINE_S = 60.0
#: a blob's deadline grows by a second per this many bytes (a registry that trickles is cut)
MIN_BLOB_RATE = 1 << 20
MAX_REDIRECTS = 5
#: a token answer above this is refused
MAX_TOKEN_BYTES = 1 << 20
_CHUNK = 1 << 20
_REDIRECTS = (301, 302, 303, 307, 308)
HINT = "check the reference, the registry and the network, then rerun (nothing was written)"
_HINT_TLS = ("give the registry's CA with SSL_CERT_FILE or /etc/docker/certs.d/HOST:PORT/ca.crt; "
             "a plain-HTTP registry on loopback is oci+http://")
_HINT_AUTH = "log in again (docker login HOST) or fix the auths entry of DOCKER_CONFIG/config.json"


def blob_deadline(size: int) -> float:
    """Seconds a blob of ``size`` bytes may take to send or receive."""
    return BLOB_DEADLINE_S + size / MIN_BLOB_RATE


def _where(url: str) -> str:
    """A URL without its query (a storage redirect's signature stays out of error lines)."""
    parts = urlsplit(url)
    return printable(f"{parts.scheme}://{parts.netloc}{parts.path}")[:200]


class Registry:
    """One repository of one registry, for ``actions`` (``pull``, or ``pull`` and ``push``)."""

    def __init__(self, ref: Reference, actions: tuple[str, ...] = ("pull",), *,
                 env: Mapping[str, str] | None = None,
                 socket_timeout_s: float = SOCKET_TIMEOUT_S,
                 document_deadline_s: float = DOCUMENT_DEADLINE_S) -> None:
        self.ref = ref
        self.scope = f"repository:{ref.repository}:{','.join(actions)}"
        self.env = env
        self.socket_timeout_s = socket_timeout_s
        self.document_deadline_s = document_deadline_s
        self._auth: str | None = None
        self._creds: auth.Credentials | None = None
        self._context: ssl.SSLContext | None = None

    # -- errors ---------------------------------------------------------------------------------

    def error(self, problem: str, hint: str = HINT) -> RemoteError:
        return RemoteError(f"{self.ref}: {problem}", hint=hint)

    def network_error(self, exc: BaseException, what: str, watchdog: Watchdog | None
                      ) -> RemoteError:
        if watchdog is not None and watchdog.fired:
            return self.error(f"{what}: no complete answer within {watchdog.seconds:g} s",
                              hint="the registry hangs or is too slow; " + HINT)
        if isinstance(exc, ssl.SSLCertVerificationError):
            return self.error(f"{what}: TLS certificate not trusted ({exc.verify_message})",
                              hint=_HINT_TLS)
        if isinstance(exc, ssl.SSLError):
            return self.error(f"{what}: TLS failed ({exc.reason or exc})", hint=_HINT_TLS)
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return self.error(f"{what}: no answer within {self.socket_timeout_s:g} s",
                              hint="the registry hangs or is too slow; " + HINT)
        if isinstance(exc, socket.gaierror):
            return self.error(f"{what}: cannot resolve the host ({exc.strerror})")
        if isinstance(exc, ConnectionRefusedError):
            return self.error(f"{what}: connection refused", hint="is the registry running "
                              "at that address and port? " + HINT)
        if isinstance(exc, http.client.RemoteDisconnected):
            return self.error(f"{what}: the registry closed the connection without an answer")
        if isinstance(exc, http.client.HTTPException):
            text = printable(" ".join(str(exc).split()))[:120]
            return self.error(f"{what}: not a valid HTTP answer ({type(exc).__name__}"
                              + (f": {text})" if text else ")"))
        text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return self.error(f"{what}: lost the connection ({printable(text)[:120]})")

    def refusal(self, answer: Answer, what: str) -> RemoteError:
        """The error for an answer of an unexpected status (its body read for the reason)."""
        if answer.status == 401:        # a body that could not be sent twice, or after login
            return self._refused(what)
        said = answer.message()
        status = f"{answer.status}" + (f" {said}" if said else "")
        if answer.status == 403:
            return self.error(f"{what}: access denied ({status})",
                              hint=f"the registry's account needs {self.scope.rsplit(':', 1)[1]}"
                                   f" access to {self.ref.repository}")
        return self.error(f"{what}: the registry answered {status}")

    # -- exchanges ------------------------------------------------------------------------------

    def _connection(self, url: str) -> http.client.HTTPConnection:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=CONNECT_TIMEOUT_S,
                                               context=self._tls(), blocksize=_CHUNK)
        return http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S,
                                          blocksize=_CHUNK)

    def _tls(self) -> ssl.SSLContext:
        """The system's trust store (``SSL_CERT_FILE``, ``SSL_CERT_DIR`` included) plus Docker's
        certificates for this registry, ``/etc/docker/certs.d/HOST[:PORT]/*.crt``."""
        if self._context is None:
            context = ssl.create_default_context()
            certs = Path("/etc/docker/certs.d") / self.ref.netloc
            try:
                for crt in sorted(certs.glob("*.crt")) if certs.is_dir() else ():
                    context.load_verify_locations(cafile=str(crt))
            except (OSError, ssl.SSLError) as exc:
                raise self.error(f"{certs}: cannot load the registry's certificates ({exc})",
                                 hint=_HINT_TLS) from None
            self._context = context
        return self._context

    def exchange(self, method: str, url: str, what: str, *, headers: Mapping[str, str] = {},
                 body: bytes | IO[bytes] | None = None, deadline_s: float | None = None
                 ) -> Answer:
        """One request and its answer's head, within ``deadline_s`` (the body is the caller's,
        still under the same watchdog)."""
        conn = self._connection(url)
        watchdog = Watchdog(deadline_s or self.document_deadline_s, conn)
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        sent = {"User-Agent": "sglang-warmup", **headers}
        if self._auth and parts.netloc == urlsplit(self.ref.base_url).netloc:
            sent.setdefault("Authorization", self._auth)
        try:
            conn.connect()
            if watchdog.fired:
                raise TimeoutError()
            conn.sock.settimeout(self.socket_timeout_s)
            conn.request(method, target, body=body, headers=sent)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            watchdog.stop()
            conn.close()
            raise self.network_error(exc, what, watchdog) from None
        except BaseException:  # the connection is closed on any way out, then raised as it was
            watchdog.stop()
            conn.close()
            raise
        return Answer(self, url, what, conn, resp, watchdog)

    def request(self, method: str, url: str, what: str, *, headers: Mapping[str, str] = {},
                body: bytes | IO[bytes] | None = None, deadline_s: float | None = None,
                follow: bool = True) -> Answer:
        """``exchange``, logging in when the registry asks (once: a body that is a file is
        never sent twice, log in first) and following redirects."""
        for _ in range(MAX_REDIRECTS + 1):
            answer = self.exchange(method, url, what, headers=headers, body=body,
                                   deadline_s=deadline_s)
            if answer.status == 401 and not hasattr(body, "read"):
                self._answer_challenge(answer, what)
                answer = self.exchange(method, url, what, headers=headers, body=body,
                                       deadline_s=deadline_s)
                if answer.status == 401:
                    answer.close()
                    raise self._refused(what)
            if not (follow and answer.status in _REDIRECTS):
                return answer
            location = answer.header("Location") or ""
            answer.close()
            url = self._redirect(url, location, what)
        raise self.error(f"{what}: more than {MAX_REDIRECTS} redirects")

    def _redirect(self, url: str, location: str, what: str) -> str:
        target = urljoin(url, location)
        parts = urlsplit(target)
        if not location or parts.scheme not in ("https", "http") or not parts.hostname:
            raise self.error(f"{what}: a redirect to '{printable(location[:120])}', not a URL")
        if parts.scheme == "http" and not (self.ref.plain_http and is_loopback(parts.hostname)):
            raise self.error(f"{what}: a redirect to plain HTTP ({_where(target)}) refused",
                             hint="a registry over TLS must send its blobs over TLS too")
        return target

    # -- authentication -------------------------------------------------------------------------

    def credentials(self) -> auth.Credentials:
        if self._creds is None:
            self._creds = auth.lookup(self.ref.netloc, self.env)
        return self._creds

    def _refused(self, what: str) -> RemoteError:
        creds = self.credentials()
        if creds.usable:
            return self.error(f"{what}: the registry refused the credentials for "
                              f"{self.ref.netloc} from {creds.source} (401)", hint=_HINT_AUTH)
        helper = f"; its credential helper {creds.helper!r} is not run" if creds.helper else ""
        return self.error(f"{what}: the registry requires a login and {creds.source} holds no "
                          f"credentials for {self.ref.netloc}{helper}",
                          hint="docker login " + self.ref.netloc + " (or a Kubernetes "
                               "dockerconfigjson secret as DOCKER_CONFIG/config.json)")

    def login(self) -> None:
        """Ask ``/v2/`` and answer its challenge: a refused login is found before any
        transfer (and before a push sends a body that could not be sent twice)."""
        what = "GET /v2/"
        answer = self.request("GET", f"{self.ref.base_url}/v2/", what, follow=False)
        try:
            if answer.status != 200:
                raise self.refusal(answer, what)
        finally:
            answer.close()

    def _answer_challenge(self, answer: Answer, what: str) -> None:
        """A fresh token for a Bearer challenge (also when one was sent: tokens expire, and a
        pull of large layers outlives them), Basic credentials once."""
        found = auth.challenges(answer.headers("WWW-Authenticate"))
        answer.close()
        creds = self.credentials()
        bearer = next((c for c in found if c.scheme == "bearer"), None)
        if bearer is not None:
            self._auth = "Bearer " + (creds.registry_token or self._token(bearer, creds))
        elif any(c.scheme == "basic" for c in found) and creds.username and \
                self._auth != creds.basic():
            self._auth = creds.basic()
        elif any(c.scheme == "basic" for c in found):
            raise self._refused(what)
        else:
            raise self.error(f"{what}: 401 without a Bearer or Basic challenge",
                             hint="the registry's authentication is not one registry clients "
                                  "speak; " + HINT)

    def _token(self, challenge: auth.Challenge, creds: auth.Credentials) -> str:
        realm = challenge.params.get("realm", "")
        parts = urlsplit(realm)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise self.error(f"the registry's token realm '{printable(realm[:120])}' is not a "
                             "URL")
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise self.error(f"the registry's token realm {_where(realm)} is plain HTTP off "
                             "loopback: refused (credentials would travel in clear)",
                             hint="configure the token service with TLS")
        query = {"scope": challenge.params.get("scope") or self.scope}
        if "service" in challenge.params:
            query["service"] = challenge.params["service"]
        what = f"token from {_where(realm)}"
        if creds.identity_token:        # an OAuth2 refresh token: the POST form
            form = urlencode({**query, "grant_type": "refresh_token", "client_id":
                              "sglang-warmup", "refresh_token": creds.identity_token}).encode()
            answer = self.exchange("POST", realm, what, body=form, headers={
                "Content-Type": "application/x-www-form-urlencoded"})
        else:
            sep = "&" if parts.query else "?"
            headers = {"Authorization": creds.basic()} if creds.username else {}
            answer = self.exchange("GET", realm + sep + urlencode(query), what, headers=headers)
        try:
            if answer.status in (401, 403):
                raise self._refused(what)
            if answer.status != 200:
                raise self.refusal(answer, what)
            return self._token_of(answer.read(MAX_TOKEN_BYTES), what)
        finally:
            answer.close()

    def _token_of(self, body: bytes, what: str) -> str:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise self.error(f"{what}: not JSON") from None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token or \
                not all("\x21" <= c <= "\x7e" for c in token):
            raise self.error(f"{what}: the answer holds no usable token")
        return token

    # -- the API --------------------------------------------------------------------------------

    def has_blob(self, digest: str, what: str) -> bool:
        answer = self.request("HEAD", self.ref.api(f"blobs/{digest}"), what)
        try:
            if answer.status in (200, 404):
                return answer.status == 200
            raise self.refusal(answer, what)
        finally:
            answer.close()

    def get_blob(self, digest: str, size: int, out: Sink, what: str) -> None:
        """The blob ``digest`` of ``size`` bytes into ``out``, verified."""
        answer = self.request("GET", self.ref.api(f"blobs/{digest}"), what,
                              deadline_s=blob_deadline(size))
        try:
            if answer.status == 404:
                said = answer.message()
                raise self.error(f"{what}: missing from the registry (404"
                                 + (f" {said})" if said else ")"),
                                 hint="the artifact is incomplete; push it again")
            if answer.status != 200:
                raise self.refusal(answer, what)
            answer.save(out, digest, size, what)
        finally:
            answer.close()

    def put_blob(self, digest: str, size: int, path: Path, what: str) -> None:
        """Upload ``path`` (``size`` bytes, ``digest``) in one PUT after a POST."""
        start = self.request("POST", self.ref.api("blobs/uploads/"), what, body=b"",
                             follow=False)
        try:
            if start.status != 202 or not start.header("Location"):
                raise self.refusal(start, what)
            url = self._redirect(start.url, start.header("Location") or "", what)
        finally:
            start.close()
        url += ("&" if urlsplit(url).query else "?") + "digest=" + quote(digest)
        with open(path, "rb") as body:
            answer = self.request("PUT", url, what, body=body, deadline_s=blob_deadline(size),
                                  follow=False, headers={
                                      "Content-Type": "application/octet-stream",
                                      "Content-Length": str(size)})
        try:
            if answer.status != 201:
                raise self.refusal(answer, what)
        finally:
            answer.close()

    def get_manifest(self, reference: str, accept: tuple[str, ...], limit: int, what: str
                     ) -> tuple[str, bytes, str | None]:
        """The manifest at a tag or digest: its media type, bytes, and the registry's
        ``Docker-Content-Digest`` (None when it sent none)."""
        answer = self.request("GET", self.ref.api(f"manifests/{reference}"), what,
                              headers={"Accept": ", ".join(accept)})
        try:
            if answer.status == 404:
                said = answer.message()
                raise self.error(f"{what}: no such manifest in the registry (404"
                                 + (f" {said})" if said else ")"),
                                 hint="check the tag or digest; a cache is tagged by its "
                                      "toolchain's fingerprint (`sglang-warmup cache "
                                      "fingerprint`)")
            if answer.status != 200:
                raise self.refusal(answer, what)
            body = answer.read(limit)
            media = (answer.header("Content-Type") or "").split(";")[0].strip()
            return media, body, answer.header("Docker-Content-Digest")
        finally:
            answer.close()

    def put_manifest(self, tag: str, body: bytes, media_type: str, what: str) -> str | None:
        """PUT the manifest under ``tag``; the registry's ``Docker-Content-Digest``."""
        answer = self.request("PUT", self.ref.api(f"manifests/{tag}"), what, body=body,
                              follow=False, headers={"Content-Type": media_type})
        try:
            if answer.status != 201:
                raise self.refusal(answer, what)
            return answer.header("Docker-Content-Digest")
        finally:
            answer.close()
