"""HTTP client to the kiln service (standard library only: a training node stays light).

Every request is bounded: each exchange (connect, send, status line, headers, body) has one
deadline, `request_timeout` from its start, and every socket operation waits at most the time
left until it, so a server that trickles bytes is cut off at the deadline too. A few retries
with backoff for connection errors, 429 and 502-504, never past the overall deadline. Every failure is a `ServiceError` whose `cause` is one of
`degrade.CAUSES`, so the backend can warn once per cause. Answers are validated before
anything uses them: a malformed answer is an error, never a crash later. An answer is
bounded before it is decoded (`kiln.bounded_json`: its declared and read size, containers
and nesting), then each field it gives is checked for type and length.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import io
import json
import logging
import re
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, quote, urlsplit

from compiler.runtime.gil import short_switch_interval
from kiln import bounded_json

log = logging.getLogger("kiln")

MAX_ANSWER_BYTES = 32 * 1024 * 1024
MAX_ID_CHARS = 128  # a job id, a binary's key or source hash
MAX_ERROR_CHARS = 1000  # a job's error, as a warning quotes it
MAX_BINARY_FILES = 16  # one kernel's metadata and binary (Triton writes a few)
MAX_FILE_NAME = 255
_SHA256 = re.compile(r"[0-9a-f]{64}")
USER_AGENT = "kiln-client/1"
_RETRY_STATUSES = {429, 502, 503, 504}


class ServiceError(Exception):
    """A request to the service failed; `cause` says how (a `degrade.CAUSES` key)."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


JOB_STATUSES = ("queued", "running", "done", "failed")


@dataclass(frozen=True)
class Answer:
    """What the service knows about one tuning key.

    `status`: `pending` (no schedule yet), `heuristic`, `tuned`, `failed` (the service could
    not build it: nothing will come), or `unknown` (404: the service has never seen the
    key, or it was invalidated). `job_status`: the job's state (`Job.status`) when the
    answer names it (a submission's and a lookup's do; None from a service that does not
    say).
    """

    key: str
    status: str
    schedule: dict[str, Any] | None = None
    job_id: str | None = None
    job_status: str | None = None  # the job's state read with the schedule

    @property
    def job_done(self) -> bool:
        """Whether this answer holds a schedule read with its job done: nothing better is
        coming (no tuner for the target, or it has finished)."""
        return self.job_status == "done" and self.schedule is not None


@dataclass(frozen=True)
class Job:
    """A service job's state (`GET /v1/jobs/{id}`)."""

    id: str
    status: str  # one of JOB_STATUSES
    error: str | None = None


@dataclass
class Binary:
    """A compiled kernel from the service: its kernel's source hash, and its files, each
    `name -> (sha256 the service recorded, bytes)`."""

    key: str
    source_hash: str
    files: dict[str, tuple[str, bytes]]

    @property
    def data(self) -> dict[str, bytes]:
        """Each file's bytes, by name (what Triton's cache holds)."""
        return {name: data for name, (_, data) in self.files.items()}


BINARY_KEYS_PER_REQUEST = 128  # a query string of 128 keys stays well under 16 KiB


def check_url(url: str) -> SplitResult:
    """`url`'s parts when it names a service kiln can talk to (http or https, with a host);
    raises ValueError naming KILN_URL otherwise."""
    parts = urlsplit(url)
    try:
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) \
            and parts.port != 0
    except ValueError:  # a port that is not a number, or out of range
        usable = False
    if not usable:
        raise ValueError(f"KILN_URL must be an http(s) URL, not {url!r}")
    return parts


class ServiceClient:
    """Talks to one kiln service. Thread-safe: each request opens its own connection."""

    def __init__(self, url: str, token: str | None = None, connect_timeout: float = 2.0,
                 request_timeout: float = 10.0, retries: int = 2) -> None:
        parts = check_url(url)
        self.url = url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._base = parts.path.rstrip("/")
        self.token = token
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.retries = retries

    # -- the three calls the backend makes -------------------------------------------------

    def submit(self, graph: dict[str, Any] | str, target: dict[str, Any], key: str,
               tag: str | None = None) -> Answer:
        """POST /v1/graphs: the service dedupes by key and answers what it has. `graph`: the
        kiln.graph/1 dict, or its JSON text."""
        rest: dict[str, Any] = {"target": target}
        if tag:
            rest["tag"] = tag
        if isinstance(graph, str):  # spliced in as it is, not parsed and encoded again
            tail = json.dumps(rest, allow_nan=False)
            body: Any = '{"graph":' + graph + "," + tail[1:]
        else:
            body = {"graph": graph, **rest}
        status, doc = self._request("POST", "/v1/graphs", body)
        if status not in (200, 202):
            raise self._unexpected(status, doc)
        return _parse_answer(doc, key, status)

    def schedule(self, key: str) -> Answer:
        """GET /v1/schedules/{key}."""
        status, doc = self._request("GET", f"/v1/schedules/{quote(key, safe='')}")
        if status == 404:
            return Answer(key=key, status="unknown")
        if status not in (200, 202):
            raise self._unexpected(status, doc)
        return _parse_answer(doc, key, status)

    def job(self, job_id: str) -> Job:
        """GET /v1/jobs/{id}."""
        status, doc = self._request("GET", f"/v1/jobs/{quote(str(job_id), safe='')}")
        if status != 200:
            raise self._unexpected(status, doc)
        if not isinstance(doc, dict) or not _one_of(doc.get("status"), JOB_STATUSES):
            raise ServiceError("malformed", f"job answer without a valid status: {_short(doc)}")
        error = doc.get("error")
        return Job(id=str(job_id), status=doc["status"],
                   error=error[:MAX_ERROR_CHARS] if isinstance(error, str) else None)

    def binaries(self, keys: list[str]) -> dict[str, Binary]:
        """GET /v1/binaries: the compiled kernels the service holds among `keys` (Triton
        cache keys), decoded and shape-checked, not yet verified (`kiln.binaries` checks
        each file's sha256 and the kernel's source hash). Asks again for what an answer
        left out to stay small."""
        found: dict[str, Binary] = {}
        todo = list(dict.fromkeys(keys))
        while todo:
            batch, todo = todo[:BINARY_KEYS_PER_REQUEST], todo[BINARY_KEYS_PER_REQUEST:]
            status, doc = self._request("GET", f"/v1/binaries?keys={','.join(batch)}")
            if status != 200:
                raise self._unexpected(status, doc)
            got, left_out = _parse_binaries(doc, set(batch))
            if not got and left_out:
                raise ServiceError("malformed", "binaries answer sent none of what it found")
            found.update(got)
            todo = left_out + todo
        return found

    # -- plans (kiln.plans): AOTAutograd's results, by dynamo graph key -------------------

    def plan(self, key: str) -> str | None:
        """GET /v1/plans/{key}: the plan document's text as sent, not decoded (the caller
        parses and checks it with the wire format's own bounds), or None when the service
        has none."""
        path = f"/v1/plans/{quote(key, safe='')}"
        status, raw = self._request("GET", path, decode=False)
        if status == 404:
            return None
        if status != 200:
            raise self._unexpected(status, _decode("GET", path, status, raw))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ServiceError("malformed", f"GET {path}: a plan that is not UTF-8") from exc

    def put_plan(self, key: str, text: str) -> bool:
        """PUT /v1/plans/{key} with the plan's JSON text; whether the service stored it (a
        plan it already held for the key stays)."""
        status, doc = self._request("PUT", f"/v1/plans/{quote(key, safe='')}", text)
        if status not in (200, 201):
            raise self._unexpected(status, doc)
        return status == 201

    # -- `kiln stats` ----------------------------------------------------------------------

    def admin_stats(self) -> dict[str, Any]:
        """GET /v1/admin/stats (needs an admin token): what `kiln stats` prints."""
        status, doc = self._request("GET", "/v1/admin/stats")
        if status != 200:
            raise self._unexpected(status, doc)
        if not isinstance(doc, dict) or not isinstance(doc.get("entries_by_status"), dict):
            raise ServiceError("malformed", f"stats answer without entries_by_status: "
                               f"{_short(doc)}")
        return doc

    # -- transport --------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None,
                 decode: bool = True) -> tuple[int, Any]:
        """One request with retries (`body`: a JSON value, or JSON text); returns (HTTP
        status, decoded JSON or None; without `decode`, the body's bytes).
        Connection errors, 429 and 502-504 are retried (with backoff, within the deadline);
        a timeout is not, so a hung service costs one timeout, not several."""
        deadline = time.monotonic() + self.request_timeout * (self.retries + 1)
        if body is None or isinstance(body, str):
            data = None if body is None else body.encode()  # JSON text already
        else:
            data = json.dumps(body, allow_nan=False).encode()
        delay = 0.2
        attempt = 0
        while True:
            retry_ok = attempt < self.retries and time.monotonic() + delay < deadline
            exchange_deadline = min(deadline, time.monotonic() + self.request_timeout)
            try:
                status, raw = self._once(method, path, data, exchange_deadline)
            except ServiceError as exc:
                if not retry_ok or exc.cause != "unreachable":
                    raise
                log.debug("kiln: %s %s failed (%s), retrying", method, path, exc)
            else:
                if status not in _RETRY_STATUSES or not retry_ok:
                    return status, (_decode(method, path, status, raw) if decode else raw)
                log.debug("kiln: %s %s answered %d, retrying", method, path, status)
            time.sleep(delay)
            delay *= 2
            attempt += 1

    def _once(self, method: str, path: str, data: bytes | None,
              deadline: float) -> tuple[int, bytes]:
        """One exchange, all of it (connect included) done by `deadline` or a timeout, with
        a short switch interval: on a first step it runs beside kiln's compiling threads,
        and each receive would otherwise wait up to 5 ms for the GIL (compiler/runtime/gil.py)."""
        with short_switch_interval():
            return self._exchange(method, path, data, deadline)

    def _exchange(self, method: str, path: str, data: bytes | None,
                  deadline: float) -> tuple[int, bytes]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn_cls = (http.client.HTTPSConnection if self._scheme == "https"
                    else http.client.HTTPConnection)
        connect_s = max(0.01, min(self.connect_timeout, deadline - time.monotonic()))
        kwargs: dict[str, Any] = {"timeout": connect_s}
        if self._scheme == "https":
            kwargs["context"] = ssl.create_default_context()
        conn = conn_cls(self._host, self._port, **kwargs)
        resp = None
        try:
            try:
                conn.connect()
            except TimeoutError as exc:
                raise ServiceError("unreachable", f"connect to {self.url} timed out") from exc
            except OSError as exc:
                raise ServiceError("unreachable", f"cannot connect to {self.url}: {exc}") from exc
            assert conn.sock is not None
            conn.sock = _DeadlineSocket(conn.sock, deadline)
            try:
                conn.request(method, self._base + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = _read_bounded(resp)
            except TimeoutError as exc:
                raise ServiceError("timeout", f"{method} {path}: no answer in time") from exc
            except (OSError, http.client.HTTPException) as exc:
                # A reset or an unparseable status line: the peer is not a working service.
                cause = "unreachable" if isinstance(exc, ConnectionError) else "malformed"
                raise ServiceError(cause, f"{method} {path}: {exc!r}") from exc
        finally:
            if resp is not None:
                resp.close()
            conn.close()
        return resp.status, raw

    def _unexpected(self, status: int, doc: Any) -> ServiceError:
        if status == 422 or status == 413:
            return ServiceError("rejected", f"HTTP {status}: {_error_message(doc)}")
        return ServiceError("malformed", f"unexpected HTTP {status}: {_error_message(doc)}")


def _decode(method: str, path: str, status: int, raw: bytes) -> Any:
    if status in (401, 403):
        raise ServiceError("auth", f"{method} {path}: HTTP {status}")
    if status >= 500:
        raise ServiceError("server_error", f"{method} {path}: HTTP {status}")
    if not raw:
        return None
    try:
        return bounded_json.loads(raw, max_bytes=MAX_ANSWER_BYTES)
    except bounded_json.Refused as exc:
        raise ServiceError("malformed", f"{method} {path}: HTTP {status} with a body kiln "
                           f"does not decode ({exc}): {raw[:40]!r}") from None


def _read_bounded(resp: http.client.HTTPResponse) -> bytes:
    """The answer's body, refused as soon as it is known to pass `MAX_ANSWER_BYTES`: from
    its Content-Length before reading any, else while it arrives."""
    declared = resp.getheader("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise ServiceError("malformed", f"answer of {int(declared)} bytes declared, more than "
                           f"{MAX_ANSWER_BYTES}")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = resp.read(65536)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > MAX_ANSWER_BYTES:
            raise ServiceError("malformed", f"answer larger than {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)


class _DeadlineSocket:
    """A connected socket whose every send and receive may wait only the time left until
    one deadline. `http.client` sets one timeout per socket operation, so a server sending a
    byte just inside it would otherwise hold an exchange forever; this is all it calls."""

    def __init__(self, sock: Any, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the exchange passed its deadline")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self._arm()
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb") -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"only 'rb' is supported, not {mode!r}")
        # An unbuffered socket file keeps the socket's own reference count, so the
        # connection closing before the response is read does not close the descriptor.
        return io.BufferedReader(_DeadlineReader(self._sock.makefile("rb", buffering=0),
                                                 self._arm))

    def close(self) -> None:
        self._sock.close()


class _DeadlineReader(io.RawIOBase):
    """The raw stream under the response's buffered reader: each read armed first."""

    def __init__(self, raw: Any, arm: Any) -> None:
        super().__init__()
        self._raw, self._arm = raw, arm

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._arm()
        return self._raw.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def _parse_answer(doc: Any, key: str, http_status: int) -> Answer:
    if not isinstance(doc, dict):
        raise ServiceError("malformed", f"answer is not a JSON object: {_short(doc)}")
    if doc.get("key") != key:
        raise ServiceError("malformed", f"answer for key {_short(doc.get('key'))}, "
                           f"asked for {key[:12]}")
    status = doc.get("status")
    schedule = doc.get("schedule")
    job_id = doc.get("job_id")
    if job_id is not None and not _identifier(job_id):
        raise ServiceError("malformed", f"job_id is not an id: {_short(job_id)}")
    if http_status == 200 and not _one_of(status, ("heuristic", "tuned")):
        raise ServiceError("malformed", f"HTTP 200 with status {_short(status)}")
    if not _one_of(status, ("pending", "heuristic", "tuned", "failed")):
        raise ServiceError("malformed", f"unknown schedule status {_short(status)}")
    if status in ("heuristic", "tuned") and not isinstance(schedule, dict):
        if status == "tuned":
            raise ServiceError("malformed", "status tuned without a schedule object")
        status, schedule = "pending", None  # heuristic announced, not yet attached
    if status in ("pending", "failed"):
        schedule = None
    job_status = doc.get("job_status")
    if job_status is not None and not _one_of(job_status, JOB_STATUSES):
        raise ServiceError("malformed", f"unknown job status {_short(job_status)}")
    return Answer(key=key, status=status, schedule=schedule,
                  job_id=None if job_id is None else str(job_id), job_status=job_status)


def _one_of(value: Any, choices: tuple[str, ...]) -> bool:
    return isinstance(value, str) and value in choices


def _identifier(value: Any) -> bool:
    """A job id as services send it: a short string, or an integer (not a bool)."""
    if isinstance(value, str):
        return 0 < len(value) <= MAX_ID_CHARS
    return type(value) is int and 0 <= value < 10**18


def _error_message(doc: Any) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err = doc["error"]
        return f"{_short(err.get('code'), 40)}: {_short(err.get('message'), 200)}"
    return _short(doc)


def _short(value: Any, limit: int = 80) -> str:
    if isinstance(value, str | bytes) and len(value) > limit:
        value = value[:limit]  # not repr() of megabytes first
    elif isinstance(value, dict | list) and len(value) > 8:
        return f"<{type(value).__name__} of {len(value)}>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_binaries(doc: Any, asked: set[str]) -> tuple[dict[str, Binary], list[str]]:
    """The binaries of a `/v1/binaries` answer (only keys that were asked), and the keys it
    left out; ServiceError("malformed") for anything not of that shape."""
    if not isinstance(doc, dict) or not isinstance(doc.get("binaries"), list) \
            or not isinstance(doc.get("left_out", []), list):
        raise ServiceError("malformed", f"binaries answer of the wrong shape: {_short(doc)}")
    found: dict[str, Binary] = {}
    for item in doc["binaries"]:
        binary = _parse_binary(item, asked)
        found[binary.key] = binary
    left_out = [k for k in doc.get("left_out", []) if isinstance(k, str) and k in asked
                and k not in found]
    return found, left_out


def _parse_binary(item: Any, asked: set[str]) -> Binary:
    """One binary of the answer, each field's type and length checked, its files decoded."""
    def refuse(why: str) -> ServiceError:
        return ServiceError("malformed", f"a binary in the answer {why}")

    if not isinstance(item, dict) or not isinstance(item.get("files"), list):
        raise refuse("is not an object with a list of files")
    key, source_hash = item.get("key"), item.get("source_hash")
    if not isinstance(key, str) or key not in asked:
        raise refuse(f"names key {_short(key, 20)}, which was not asked")
    if not isinstance(source_hash, str) or not 0 < len(source_hash) <= MAX_ID_CHARS:
        raise refuse("has no source hash")
    if len(item["files"]) > MAX_BINARY_FILES:
        raise refuse(f"has {len(item['files'])} files, more than {MAX_BINARY_FILES}")
    files: dict[str, tuple[str, bytes]] = {}
    for f in item["files"]:
        if not isinstance(f, dict) or not all(isinstance(f.get(k), str)
                                              for k in ("name", "sha256", "data")):
            raise refuse("has a file without a name, sha256 and data as strings")
        name, digest = f["name"], f["sha256"]
        if not 0 < len(name) <= MAX_FILE_NAME or name in files or not _SHA256.fullmatch(digest):
            raise refuse(f"has a file {_short(name, 40)} of a bad name or sha256")
        try:
            files[name] = (digest, base64.b64decode(f["data"], validate=True))
        except (binascii.Error, ValueError) as exc:
            raise refuse(f"has file {_short(name, 40)} of bad base64 ({exc})") from None
    return Binary(key, source_hash, files)
