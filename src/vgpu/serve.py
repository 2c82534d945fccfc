"""The exporter's HTTP server: bounded connections, idle ones timed out, and who is asking.

prometheus-client's own server spends a thread per connection and waits on
each without a timeout: a local process that opens a few dozen connections
and sends nothing holds every thread the unit may start (``TasksMax=32``)
and no scrape is answered until they close. Here one thread (the caller's,
:meth:`Server.serve`) accepts and reads every request head, non-blocking,
holding at most :data:`CONNECTIONS` connections: when more come, the one
that has waited longest is closed, and one that has sent no whole request
head within :data:`IDLE` seconds is closed too. A whole request is answered
by one of at most :data:`WORKERS` threads (``503`` when all are busy), which
sends with the same timeout. Nothing else starts a thread.

:func:`peer_uid` says which user owns the connecting socket, read from the
kernel's socket tables (``/proc/net/tcp``, ``tcp6``: the ``uid`` column, as
identd reads it), for the answer to depend on it (tenant identities go to
root only). Nothing here imports ops or prometheus-client.
"""

from __future__ import annotations

import logging
import selectors
import socket
import struct
import threading
import time
from typing import Callable, Dict, Optional, Tuple

from . import hostroot
from .errors import HostReadError

log = logging.getLogger(__name__)

CONNECTIONS = 64  # open connections at once: file descriptors, no threads
WORKERS = 4  # requests answered at once, a thread each
IDLE = 10.0  # seconds for a whole request head to arrive, and for a send to progress
HEAD = 8192  # bytes of a request head
PROC_NET = ("/proc/net/tcp", "/proc/net/tcp6")  # this process' own network namespace

# (status line, content type, body) for a request: the peer's user id (None: unknown) and path.
Answer = Callable[[Optional[int], str], Tuple[str, str, bytes]]


class Server:
    """HTTP/1.0 GET on ``address``:``port`` (see the module doc); ``serve`` until ``stop``."""

    def __init__(self, address: str, port: int, answer: Answer, *,
                 connections: int = CONNECTIONS, workers: int = WORKERS,
                 idle: float = IDLE, identify: bool = False) -> None:
        """Listen now (OSError when the port cannot be taken); answer nothing until serve().

        ``identify``: look up each request's user (:func:`peer_uid`); else it is None.
        """
        self._answer = answer
        self._identify = identify
        self._connections = connections
        self._idle = idle
        self._workers = threading.BoundedSemaphore(workers)
        self._stopped = threading.Event()
        self._listener = socket.create_server((address, port), backlog=128)
        self._listener.setblocking(False)
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        # each open connection: (when it was accepted, the bytes of its head so far)
        self._pending: Dict[socket.socket, Tuple[float, bytearray]] = {}

    @property
    def port(self) -> int:
        """The port listened on (the one given, or the kernel's choice for 0)."""
        return self._listener.getsockname()[1]

    def serve(self) -> None:
        """Accept and read requests until :meth:`stop`; each whole one answered by a worker."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while not self._stopped.is_set():
                for key, _ in selector.select(timeout=self._next_timeout()):
                    if key.fileobj is self._listener:
                        self._accept(selector)
                    elif key.fileobj is not self._wake_read:
                        self._read(selector, key.fileobj)  # type: ignore[arg-type]
                self._expire(selector)
            for connection in list(self._pending):
                self._drop(selector, connection)
        self._listener.close()

    def stop(self) -> None:
        """Make :meth:`serve` return (from a signal handler or another thread)."""
        self._stopped.set()
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass

    def _next_timeout(self) -> float:
        if not self._pending:
            return 1.0
        oldest = min(started for started, _ in self._pending.values())
        return max(0.0, min(1.0, oldest + self._idle - time.monotonic()))

    def _accept(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of descriptors: the oldest go first, below
                log.warning("accept: %s", error)
                return
            connection.setblocking(False)
            while len(self._pending) >= self._connections:  # the longest waiting is dropped
                oldest = min(self._pending, key=lambda c: self._pending[c][0])
                self._drop(selector, oldest)
            self._pending[connection] = (time.monotonic(), bytearray())
            selector.register(connection, selectors.EVENT_READ)

    def _read(self, selector: selectors.BaseSelector, connection: socket.socket) -> None:
        entry = self._pending.get(connection)
        if entry is None:
            return
        try:
            data = connection.recv(HEAD)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(selector, connection)
            return
        head = entry[1]
        head += data
        if b"\r\n\r\n" not in head and b"\n\n" not in head:
            if len(head) > HEAD:
                self._drop(selector, connection)
            return
        selector.unregister(connection)
        del self._pending[connection]
        self._dispatch(connection, bytes(head))

    def _expire(self, selector: selectors.BaseSelector) -> None:
        limit = time.monotonic() - self._idle
        for connection, (started, _) in list(self._pending.items()):
            if started < limit:
                self._drop(selector, connection)

    def _drop(self, selector: selectors.BaseSelector, connection: socket.socket) -> None:
        self._pending.pop(connection, None)
        try:
            selector.unregister(connection)
        except (KeyError, ValueError):
            pass
        connection.close()

    def _dispatch(self, connection: socket.socket, head: bytes) -> None:
        connection.setblocking(True)
        connection.settimeout(self._idle)
        if not self._workers.acquire(blocking=False):
            _send(connection, "503 Service Unavailable", "text/plain", b"busy: try again\n")
            connection.close()
            return
        try:
            threading.Thread(target=self._work, args=(connection, head), daemon=True,
                             name="scrape").start()
        except RuntimeError:  # no thread can be started now
            self._workers.release()
            _send(connection, "503 Service Unavailable", "text/plain", b"busy: try again\n")
            connection.close()

    def _work(self, connection: socket.socket, head: bytes) -> None:
        try:
            request = head.split(b"\n", 1)[0].decode("latin-1").split()
            if len(request) < 2 or request[0] not in ("GET", "HEAD"):
                _send(connection, "405 Method Not Allowed", "text/plain", b"GET only\n")
                return
            try:
                uid = peer_uid(connection) if self._identify else None
                status, kind, body = self._answer(uid, request[1])
            except Exception:  # the answer says so; the server goes on
                log.exception("answering %s", request[1][:100])
                status, kind, body = "500 Internal Server Error", "text/plain", b"failed\n"
            _send(connection, status, kind, b"" if request[0] == "HEAD" else body)
        except OSError:
            pass  # the client went away, or stopped reading past the timeout
        finally:
            connection.close()
            self._workers.release()


def _send(connection: socket.socket, status: str, kind: str, body: bytes) -> None:
    head = (f"HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode("latin-1")
    try:
        connection.sendall(head + body)
    except OSError:
        pass


def peer_uid(connection: socket.socket) -> Optional[int]:
    """The user id owning the other end of a local TCP ``connection``; None when not found.

    The peer's socket is the row of the kernel's table whose local address is
    our peer's and whose remote address is ours.
    """
    try:
        ours, theirs = connection.getsockname(), connection.getpeername()
    except OSError:
        return None
    wanted = (_hex(theirs), _hex(ours))
    for name in PROC_NET:
        try:
            table = hostroot.read_text(name, limit=1 << 26) or ""
        except HostReadError as error:
            log.warning("%s", error)
            continue
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 7 and (fields[1].upper(), fields[2].upper()) == wanted:
                try:
                    return int(fields[7])
                except ValueError:
                    return None
    return None


def _hex(address: tuple) -> str:
    """``("127.0.0.1", 8080)`` as /proc/net/tcp writes it: ``0100007F:1F90`` (host byte order)."""
    host, port = address[0], address[1]
    if ":" in host:
        packed = socket.inet_pton(socket.AF_INET6, host)
        words = struct.unpack("=4I", packed)
        return "".join(f"{w:08X}" for w in words) + f":{port:04X}"
    return f"{struct.unpack('=I', socket.inet_aton(host))[0]:08X}:{port:04X}"
