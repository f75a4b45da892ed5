"""The one way kiln starts a child process, and the one way it talks to one.

Every child — a heuristic build, a submission's intake, the target compile, the tuner's
runner and compile workers, the child hashing Triton — is started here, in one of two ways:

- `spawn(target, ...)`: a fresh interpreter (`python -c _BOOT`, never multiprocessing's
  spawn, which re-runs the user's `__main__` script in each child), with the environment
  given. It pays its own imports.
- `ForkServer(preload).start(target, ...)`: forked from a warm server that imported
  `preload` (kiln, torch, Triton) once: a child starts in milliseconds with them loaded.
  The server is itself a spawned child, single-threaded, so no thread of the caller is
  ever forked; it reaps what it forks and reports each exit status back.

Either way the child runs `target` ("module:function") as `function(channel, *args)`, in its
own process group, after applying its `Limits`: a data-segment or address-space cap
(`RLIMIT_DATA` / `RLIMIT_AS`: an allocation past it fails in the child, as MemoryError
or `std::bad_alloc`), a CPU-time backstop (`RLIMIT_CPU`, for a child outliving its parent)
and a nice increment. The parent holds a `Child`: messages both ways over a socket, each
length-prefixed and either JSON or raw bytes, never pickle, none larger than the limit's
`max_message` (a larger one is refused, on either side, with `MessageTooLarge`); every wait
is bounded by the child's deadline, past which the child's whole process group is killed
(`ChildTimeout`); a child that dies is reported as `ChildDied` with its exit status; and
`close` kills the group and reaps it, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any

MAX_MESSAGE = 256 << 20  # default bound of one message, either way
_HEADER = struct.Struct("!cQ")  # kind (J: JSON, B: bytes), length
_JSON, _BYTES = b"J", b"B"
_STATUS = struct.Struct("!i")  # an exit status, as the fork server reports it
SERVER_START_S = 600.0  # a fork server's imports (torch, Triton) on a loaded host
_BOOT = ("import json, sys; spec = json.loads(sys.argv[1]); sys.path[:0] = spec['path']; "
         "from compiler.child import _spawned; _spawned(spec)")


class ChildError(RuntimeError):
    """A child process could not be started or talked to."""


class ChildDied(ChildError):
    """The child ended while the parent waited on it; `exitcode` as `subprocess` gives it
    (negative: killed by that signal), None when unknown."""

    def __init__(self, name: str, exitcode: int | None) -> None:
        if exitcode is not None and exitcode < 0:
            how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with status {exitcode}"
        super().__init__(f"the {name} process {how}")
        self.exitcode = exitcode


class ChildTimeout(ChildError):
    """The child gave no answer in time; it was killed."""


class MessageTooLarge(ChildError):
    """A message over the channel's `max_message`: refused before sending it, or announced
    by the other side (`received`), which leaves the stream unreadable."""

    def __init__(self, message: str, received: bool) -> None:
        super().__init__(message)
        self.received = received


@dataclass(frozen=True)
class Limits:
    """What a child may use. 0 means no limit."""

    memory_bytes: int = 0  # RLIMIT_DATA (heap, anonymous mappings), or RLIMIT_AS below
    address_space: bool = False  # cap the whole address space instead of the data segment
    cpu_s: int = 0  # RLIMIT_CPU: a backstop for a child that outlives its parent
    nice: int = 0  # added to the child's niceness
    max_message: int = MAX_MESSAGE


class Channel:
    """Length-prefixed messages over a stream socket: JSON values and raw bytes."""

    def __init__(self, sock: socket.socket, max_message: int = MAX_MESSAGE) -> None:
        self.sock, self.max_message = sock, max_message

    def send(self, value: Any, timeout: float | None = None) -> None:
        self._send(_JSON, json.dumps(value).encode(), timeout)

    def send_bytes(self, data: bytes, timeout: float | None = None) -> None:
        self._send(_BYTES, data, timeout)

    def recv(self, timeout: float | None = None) -> Any:
        """The next message, a JSON value. Raises EOFError when the other side is gone,
        TimeoutError past `timeout`, MessageTooLarge, ChildError for a bytes message."""
        kind, data = self._recv(timeout)
        if kind != _JSON:
            raise ChildError("expected a JSON message, got raw bytes")
        return json.loads(data)

    def recv_bytes(self, timeout: float | None = None) -> bytes:
        kind, data = self._recv(timeout)
        if kind != _BYTES:
            raise ChildError("expected a bytes message, got JSON")
        return data

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether a message (or the end of the stream) can be read within `timeout`."""
        return bool(select.select([self.sock], [], [], timeout)[0])

    def close(self) -> None:
        self.sock.close()

    def _send(self, kind: bytes, data: bytes, timeout: float | None) -> None:
        if len(data) > self.max_message:
            raise MessageTooLarge(f"a message of {len(data)} bytes is over the limit of "
                                  f"{self.max_message}", received=False)
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(_HEADER.pack(kind, len(data)))
            self.sock.sendall(data)
        finally:
            with contextlib.suppress(OSError):
                self.sock.settimeout(None)

    def _recv(self, timeout: float | None) -> tuple[bytes, bytes]:
        deadline = None if timeout is None else time.monotonic() + timeout
        kind, size = _HEADER.unpack(self._read(_HEADER.size, deadline))
        if kind not in (_JSON, _BYTES):
            raise ChildError(f"a garbled message (kind {kind!r})")
        if size > self.max_message:
            raise MessageTooLarge(f"the other side announced a message of {size} bytes, over "
                                  f"the limit of {self.max_message}", received=True)
        return kind, self._read(size, deadline)

    def _read(self, size: int, deadline: float | None) -> bytes:
        buf = bytearray(size)
        view, got = memoryview(buf), 0
        try:
            while got < size:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    self.sock.settimeout(left)
                n = self.sock.recv_into(view[got:])
                if n == 0:
                    raise EOFError("the other side closed the channel")
                got += n
        finally:
            with contextlib.suppress(OSError):
                self.sock.settimeout(None)
        return bytes(buf)


class Child:
    """A running child process, seen from its parent. Every wait is bounded by `deadline`
    (monotonic; None: none) as well as its own timeout; past either the child is killed."""

    def __init__(self, name: str, pid: int, channel: Channel, waiter: Any,
                 deadline: float | None) -> None:
        self.name, self.pid, self.channel, self.deadline = name, pid, channel, deadline
        self._waiter = waiter

    def send(self, value: Any) -> None:
        """Send a JSON value (bounded by the deadline); MessageTooLarge sends nothing."""
        self._talk(lambda t: self.channel.send(value, t), None)

    def send_bytes(self, data: bytes) -> None:
        self._talk(lambda t: self.channel.send_bytes(data, t), None)

    def recv(self, timeout: float | None = None) -> Any:
        """The child's next JSON message within `timeout` and the deadline. Raises
        ChildTimeout (the child killed), ChildDied, MessageTooLarge (the child killed)."""
        return self._talk(self.channel.recv, timeout)

    def recv_bytes(self, timeout: float | None = None) -> bytes:
        return self._talk(self.channel.recv_bytes, timeout)

    @property
    def exitcode(self) -> int | None:
        """The exit status once the child has ended (negative: the signal), else None."""
        return self._waiter.wait(0)

    def wait(self, timeout: float | None = None) -> int | None:
        return self._waiter.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the child's process group (what it started too)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:  # no group yet (a child not yet in its own), or all gone
            if not self._waiter.ended():  # never blocks: a canceller may be an event loop
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGKILL)

    def close(self, grace_s: float = 0.0) -> None:
        """End the child: close the channel (a child reading it sees the end), give it
        `grace_s` to exit, then kill its process group and reap it."""
        self.channel.close()
        if grace_s > 0:
            self._waiter.wait(grace_s)
        self.kill()
        self._waiter.wait(None)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _talk(self, op: Any, timeout: float | None) -> Any:
        limit = timeout
        if self.deadline is not None:
            left = max(0.0, self.deadline - time.monotonic())
            limit = left if limit is None else min(limit, left)
        try:
            return op(limit)
        except TimeoutError:
            self.kill()
            raise ChildTimeout(f"the {self.name} process gave no answer within "
                               f"{limit:g} s and was killed") from None
        except MessageTooLarge as exc:
            if exc.received:  # the child broke the protocol; nothing more can be read
                self.kill()
            raise
        except (EOFError, OSError):
            raise ChildDied(self.name, self._waiter.wait(5)) from None


def spawn(target: str, args: list[Any] | tuple[Any, ...] = (), *, name: str = "child",
          limits: Limits = Limits(), env: dict[str, str | None] | None = None,
          deadline_s: float | None = None, _sockets: tuple[socket.socket, ...] = ()) -> Child:
    """Start `target` ("module:function", called as `function(channel, *args)`) in a fresh
    interpreter with this environment updated by `env` (None removes a variable); `args`
    are JSON. `deadline_s` bounds the child's whole life from now."""
    mine, theirs = socket.socketpair()
    fds = [theirs.fileno(), *(s.fileno() for s in _sockets)]
    spec = {"path": sys.path, "target": target, "args": list(args), "limits": asdict(limits),
            "fds": fds, "name": name}
    environ = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    try:
        proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(spec)], pass_fds=fds,
                                stdin=subprocess.DEVNULL, env=environ, start_new_session=True)
    except OSError as exc:
        mine.close()
        raise ChildError(f"could not start the {name} process: {exc}") from exc
    finally:
        theirs.close()
    return Child(name, proc.pid, Channel(mine, limits.max_message), _PopenWaiter(proc),
                 _deadline(deadline_s))


class ForkServer:
    """A warm process, started on first use, that forks children with `preload` imported
    (an entry "module:function" is also called: a warm-up every child then inherits).
    `env` updates the server's environment (so every child's) as `spawn` does. Thread-safe;
    a server that died is started again by the next `start`."""

    def __init__(self, preload: list[str], env: dict[str, str | None] | None = None,
                 name: str = "fork server") -> None:
        self.preload, self.env, self.name = list(preload), dict(env or {}), name
        self._lock = threading.Lock()
        self._server: Child | None = None
        self._control: socket.socket | None = None

    def start(self, target: str, args: list[Any] | tuple[Any, ...] = (), *, name: str = "child",
              limits: Limits = Limits(), deadline_s: float | None = None) -> Child:
        """`spawn`'s contract, forked from the server (started here first if need be)."""
        mine, theirs = socket.socketpair()
        status, status_theirs = socket.socketpair()
        spec = json.dumps({"target": target, "args": list(args), "limits": asdict(limits),
                           "name": name}).encode()
        try:
            with self._lock:
                control = self._ensure()
                try:
                    socket.send_fds(control, [spec], [theirs.fileno(), status_theirs.fileno()])
                    reply = control.recv(4096)
                except OSError as exc:
                    self._drop()
                    raise ChildError(f"the {self.name} is gone: {exc}") from exc
                if not reply:
                    self._drop()
                    raise ChildError(f"the {self.name} ended before starting the {name} process")
        except BaseException:
            mine.close()
            status.close()
            raise
        finally:
            theirs.close()
            status_theirs.close()
        return Child(name, json.loads(reply)["pid"], Channel(mine, limits.max_message),
                     _StatusWaiter(status), _deadline(deadline_s))

    def warm(self) -> int:
        """Start the server now (its imports take seconds); its process id."""
        with self._lock:
            self._ensure()
            assert self._server is not None
            return self._server.pid

    def close(self) -> None:
        """End the server (and any child of it still running); the next `start` starts another."""
        with self._lock:
            self._drop()

    def _ensure(self) -> socket.socket:
        if self._server is not None and self._server.exitcode is None:
            assert self._control is not None
            return self._control
        self._drop()
        control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            server = spawn("compiler.child:_serve_forks", [self.preload], name=self.name,
                           env=self.env, _sockets=(theirs,))
        finally:
            theirs.close()
        try:
            server.recv(SERVER_START_S)  # ready: the preload is imported
        except ChildError:
            control.close()
            server.close()
            raise
        self._server, self._control = server, control
        return control

    def _drop(self) -> None:
        server, control, self._server, self._control = self._server, self._control, None, None
        if control is not None:
            control.close()
        if server is not None:
            server.close(grace_s=5.0)  # on the end of its channel it kills its children


def _deadline(seconds: float | None) -> float | None:
    return None if seconds is None else time.monotonic() + seconds


class _PopenWaiter:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class _StatusWaiter:
    """A forked child's exit status, which its fork server sends when it reaps it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.code, self.done = sock, None, False
        self._lock = threading.Lock()  # a request's thread and a canceller may both wait

    def ended(self) -> bool:
        return self.done

    def wait(self, timeout: float | None) -> int | None:
        with self._lock:
            if self.done:
                return self.code
            try:
                if not select.select([self.sock], [], [], timeout)[0]:
                    return None
                data = self.sock.recv(_STATUS.size)
            except OSError:
                data = b""
            self.done = True  # the status, or the server gone (the status unknown)
            self.code = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else None
            self.sock.close()
            return self.code


# ---- in the child ---------------------------------------------------------------------------

def _spawned(spec: dict[str, Any]) -> None:
    """A spawned child's start (`_BOOT`): already the leader of its own session."""
    code = _run(spec, socket.socket(fileno=spec["fds"][0]), spec["fds"][1:])
    sys.stdout.flush()
    sys.exit(code)


def _run(spec: dict[str, Any], sock: socket.socket, extra_fds: list[int]) -> int:
    """Apply the limits, then run the target; the exit status."""
    with contextlib.suppress(OSError):  # a spawned child leads its own session already
        os.setpgid(0, 0)
    limits = Limits(**spec["limits"])
    if limits.nice:
        with contextlib.suppress(OSError):
            os.nice(limits.nice)
    if limits.cpu_s:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
    if limits.memory_bytes:
        which = resource.RLIMIT_AS if limits.address_space else resource.RLIMIT_DATA
        resource.setrlimit(which, (limits.memory_bytes, limits.memory_bytes))
    channel = Channel(sock, limits.max_message)
    module, _, function = spec["target"].partition(":")
    try:
        getattr(importlib.import_module(module), function)(channel, *spec["args"], *extra_fds)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return 0  # the parent no longer wants an answer
    except BaseException as exc:  # noqa: BLE001 - reported as the exit status, and on stderr
        if isinstance(exc, SystemExit):
            return exc.code if isinstance(exc.code, int) else 1
        traceback.print_exc()
        return 1
    finally:
        channel.close()
    return 0


def _serve_forks(channel: Channel, preload: list[str], control_fd: int) -> None:
    """The fork server: import (and call) `preload`, say so, then fork one child per request on the
    control socket (a spec and two descriptors: the child's channel and where its exit
    status goes) until the parent closes its channel; then kill what is still running."""
    for entry in preload:  # a module to import, or "module:function" to call
        module, _, function = entry.partition(":")
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()
    control = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    statuses: dict[int, socket.socket] = {}  # running child -> where its status goes
    channel.send({"ready": os.getpid()})
    try:
        while True:
            ready = select.select([channel.sock, control, wake_r], [], [])[0]
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _reap(statuses)
            if channel.sock in ready or control in ready and not _fork_one(
                    control, statuses, (wake_r, wake_w), channel):
                break
    finally:  # nothing forked here outlives the server
        for pid in statuses:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        while statuses:
            _reap(statuses, block=True)
    # The parent is done with the server: nothing here needs the interpreter's teardown (a
    # second or more with torch and Triton loaded), which would hold up the service's stop.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _fork_one(control: socket.socket, statuses: dict[int, socket.socket],
              wake_fds: tuple[int, int], channel: Channel) -> bool:
    """Fork the child one request asks for; False when the parent has gone."""
    message, fds, _flags, _addr = socket.recv_fds(control, 1 << 16, 2)
    if not message or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return bool(message)
    spec = json.loads(message)
    pid = os.fork()
    if pid == 0:  # the child: drop the server's descriptors and handlers, then run
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (*wake_fds, fds[1]):
            os.close(fd)
        for sock in (control, channel.sock, *statuses.values()):
            sock.close()
        code = 1
        try:
            code = _run(spec, socket.socket(fileno=fds[0]), [])
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(fds[0])
    statuses[pid] = socket.socket(fileno=fds[1])
    control.send(json.dumps({"pid": pid}).encode())
    return True


def _reap(statuses: dict[int, socket.socket], block: bool = False) -> None:
    """Report the status of each child that has ended (`block`: of the first to end)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:  # none left (their statuses were reported)
            for sock in statuses.values():
                sock.close()
            statuses.clear()
            return
        if pid == 0:
            return
        block = False
        sock = statuses.pop(pid, None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.send(_STATUS.pack(os.waitstatus_to_exitcode(status)))
            sock.close()
