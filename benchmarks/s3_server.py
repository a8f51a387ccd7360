"""A real S3 endpoint for tests and benchmarks: moto's HTTP server behind a proxy we control.

:func:`start_moto` runs ``moto.server.ThreadedMotoServer`` on a free port of 127.0.0.1.
:class:`S3Proxy` is a small HTTP-aware TCP proxy placed in front of it.  It parses each
request's line and headers (bodies are relayed by ``Content-Length`` or chunked encoding),
so it can

* log every request (method and path) and count the bytes sent back to the client, which
  gives request and byte counts *on the wire*, whatever the client library does;
* simulate an outage: drop requests (close the connection before the server sees them),
  from now on or from the first request that matches a trigger, then recover;
* go silent: accept connections and read requests, but never answer (a black-holed load
  balancer or a paused server), until it recovers.

Nothing here patches boto, s3fs or zarr: clients just use the proxy's endpoint URL.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "REGION",
    "ProxyProcess",
    "Request",
    "S3Proxy",
    "create_bucket",
    "s3_storage_options",
    "start_moto",
    "unique_bucket_name",
]

REGION = "us-east-1"
DUMMY_KEY = "testing"
DUMMY_SECRET = "testing"
_HEADER_END = b"\r\n\r\n"
_RECV = 1 << 16
# Seconds the proxy's accept() waits before it looks again whether the proxy was closed.
_ACCEPT_WAIT = 0.5
# Bytes moved by one splice of a response (the pipe between the two sockets holds as much).
_SPLICE = 1 << 20


def start_moto() -> tuple[Any, str]:
    """Start moto's threaded S3 server on a free port; return ``(server, endpoint_url)``.

    Raises ``ImportError`` (never skips) if moto's server extra is not installed.
    """
    from moto.server import ThreadedMotoServer  # noqa: PLC0415  (heavy, test-only)

    # werkzeug logs one line per request; keep warnings only.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return server, f"http://{host}:{port}"


def s3_storage_options(endpoint_url: str, timeout: float = 2.0) -> dict[str, Any]:
    """fsspec/s3fs options for ``endpoint_url`` with dummy credentials and bounded waits.

    botocore makes a single attempt per call (s3fs adds its own few retries) and gives up
    connecting or reading after ``timeout`` seconds, so an outage surfaces quickly.
    ``max_concurrency=1`` stops s3fs from sending a HEAD before every whole-object GET.
    """
    return {
        "endpoint_url": endpoint_url,
        "key": DUMMY_KEY,
        "secret": DUMMY_SECRET,
        "client_kwargs": {"region_name": REGION},
        "config_kwargs": {
            "connect_timeout": timeout,
            "read_timeout": timeout,
            "retries": {"max_attempts": 1, "mode": "standard"},
        },
        "max_concurrency": 1,
    }


def unique_bucket_name(prefix: str = "rbzarr") -> str:
    """A bucket name no other test uses (moto keeps buckets for the server's lifetime)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def create_bucket(endpoint_url: str, name: str) -> None:
    """Create bucket ``name`` over HTTP with boto3."""
    import boto3  # noqa: PLC0415  (test-only dependency)

    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=DUMMY_KEY,
        aws_secret_access_key=DUMMY_SECRET,
        region_name=REGION,
    )
    try:
        client.create_bucket(Bucket=name)
    finally:
        client.close()


@dataclass(frozen=True)
class Request:
    """One HTTP request the proxy saw: its method, path (query string included) and the
    client's ``User-Agent``."""

    method: str
    path: str
    agent: str = ""

    @property
    def key(self) -> str:
        """The path without its query string."""
        return self.path.split("?", 1)[0]


Trigger = Callable[[Request], bool]


class S3Proxy:
    """An HTTP/1.1 proxy to ``target`` that logs requests and can simulate outages.

    Parameters
    ----------
    target_url
        ``http://host:port`` of the real server.
    """

    def __init__(self, target_url: str) -> None:
        host, port = target_url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_ACCEPT_WAIT)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._log: list[Request] = []
        self._dropped: list[Request] = []
        self._bytes_to_client = 0
        self._down = False
        self._trigger: Trigger | None = None
        self._error_status: int | None = None
        self._delay = 0.0
        # (which requests, status, delay, drop, how many more): see fault_requests.
        self._rule: tuple[Trigger, int | None, float, bool, int] | None = None
        self._answering = threading.Event()
        self._answering.set()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    # -- control ------------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        """The URL clients use instead of the server's."""
        return f"http://127.0.0.1:{self.port}"

    def go_down(self, when: Trigger | None = None) -> None:
        """Drop every request from now on, or from the first one ``when`` accepts."""
        with self._lock:
            if when is None:
                self._down = True
            else:
                self._trigger = when

    def go_up(self) -> None:
        """Forward (and answer) requests again."""
        with self._lock:
            self._down = False
            self._trigger = None
        self._answering.set()

    def go_silent(self) -> None:
        """Read every request from now on but never answer it (the connection stays open
        until :meth:`go_up` or :meth:`close`, then closes unanswered)."""
        self._answering.clear()

    def fail_with(self, status: int | None) -> None:
        """Answer every request with HTTP ``status`` (e.g. 503) instead of forwarding it;
        ``None`` forwards again."""
        with self._lock:
            self._error_status = status

    def fault_requests(
        self,
        when: Trigger,
        *,
        status: int | None = None,
        delay: float = 0.0,
        drop: bool = False,
        count: int = 1,
    ) -> None:
        """Fault the next ``count`` requests that ``when`` accepts (the others pass): drop
        each (its connection closed unanswered), answer it with HTTP ``status``, or hold it
        ``delay`` seconds before forwarding it."""
        with self._lock:
            self._rule = (when, status, delay, drop, count)

    def slow_down(self, seconds: float) -> None:
        """Hold every request ``seconds`` before forwarding it (0 to stop)."""
        with self._lock:
            self._delay = seconds

    @property
    def is_down(self) -> bool:
        """Whether requests are being dropped."""
        with self._lock:
            return self._down

    def reset_log(self) -> None:
        """Forget the logged requests and byte counts."""
        with self._lock:
            self._log.clear()
            self._dropped.clear()
            self._bytes_to_client = 0

    @property
    def requests(self) -> list[Request]:
        """Requests forwarded to the server since the last :meth:`reset_log`."""
        with self._lock:
            return list(self._log)

    @property
    def dropped(self) -> list[Request]:
        """Requests dropped (never forwarded) since the last :meth:`reset_log`."""
        with self._lock:
            return list(self._dropped)

    @property
    def bytes_to_client(self) -> int:
        """Bytes (headers and bodies) the server sent back since :meth:`reset_log`."""
        with self._lock:
            return self._bytes_to_client

    def close(self) -> None:
        """Stop accepting, end every connection and join the threads.

        Sockets are shut down here (which wakes every thread waiting on one) and closed by
        the thread that owns them once it has ended: a socket closed under a thread about to
        wait on it could have its number reused by a new one, and the thread wait there.
        """
        with self._lock:
            self._closed = True
            sockets = list(self._sockets)
        self._answering.set()
        _shut(self._listener)
        for sock in sockets:
            _shut(sock)
        self._acceptor.join()
        self._listener.close()
        for thread in self._threads:
            thread.join()

    # -- relaying -----------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                if self._closed:
                    return
                continue  # a wait bounded by _ACCEPT_WAIT: close() is seen even if no wake-up came
            except OSError:
                return
            with self._lock:
                if self._closed:
                    _close(client)
                    return
                self._sockets.add(client)
                thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        responder: threading.Thread | None = None
        try:
            reader = _Reader(client)
            while True:
                head = reader.read_head()
                if head is None:
                    return
                request, length, chunked = _parse_head(head)
                status = self._admit(request)
                if status is False:
                    return
                if status is not None:
                    if _refuse(client, reader, request, status, length, chunked):
                        continue
                    return
                if upstream is None:
                    upstream = socket.create_connection(self._target)
                    with self._lock:
                        self._sockets.add(upstream)
                    responder = threading.Thread(
                        target=self._pump_back, args=(upstream, client), daemon=True
                    )
                    responder.start()
                upstream.sendall(head)
                if chunked:
                    reader.relay_chunked(upstream)
                else:
                    reader.relay(length, upstream)
        except OSError:
            return
        finally:
            self._end_connection([s for s in (client, upstream) if s is not None], responder)

    def _admit(self, request: Request) -> int | bool | None:
        """Hold ``request`` for the delay asked, then: ``False`` to drop it, an error status
        to answer, ``None`` to forward it."""
        with self._lock:
            if not self._down and self._trigger is not None and self._trigger(request):
                self._down = True
                self._trigger = None
            mode = self._mode(request)
            if self._down or mode is None:
                self._dropped.append(request)
                return False
            self._log.append(request)
        if not self._answering.is_set():
            self._answering.wait()  # a silent endpoint: this request is never answered
            return False
        status, delay = mode
        if delay:
            time.sleep(delay)  # simulates a slow server, not a wait for work
        return status

    def _mode(self, request: Request) -> tuple[int | None, float] | None:
        """(Holding the lock.)  The status and delay of ``request``; ``None``: drop it."""
        rule = self._rule
        if self._down or rule is None or not rule[0](request):
            return self._error_status, self._delay
        when, status, delay, drop, count = rule
        self._rule = (when, status, delay, drop, count - 1) if count > 1 else None
        return None if drop else (status, delay + self._delay)

    def _pump_back(self, upstream: socket.socket, client: socket.socket) -> None:
        """Relay the server's responses to the client, in the kernel (``splice`` through a
        pipe): the proxy's own cost must not be what a benchmark measures."""
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _SPLICE)
        try:
            while moved := os.splice(upstream.fileno(), write_end, _SPLICE):
                with self._lock:
                    self._bytes_to_client += moved
                while moved:
                    moved -= os.splice(read_end, client.fileno(), moved)
        except OSError:
            pass
        finally:
            os.close(read_end)
            os.close(write_end)
            _shut(client)  # the server ended, so does the client's connection

    def _end_connection(
        self, sockets: list[socket.socket], responder: threading.Thread | None
    ) -> None:
        """Shut a connection's sockets (ending its responder's relay), wait for the
        responder, then close them: no thread uses a socket after it is closed."""
        for sock in sockets:
            _shut(sock)
        if responder is not None:
            responder.join()
        for sock in sockets:
            self._forget(sock)

    def _forget(self, sock: socket.socket) -> None:
        """Close a socket of this thread's connection (its other threads have ended)."""
        with self._lock:
            self._sockets.discard(sock)
        sock.close()


class _Reader:
    """Buffered reads of one client connection."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def _fill(self) -> bool:
        data = self._sock.recv(_RECV)
        self._buffer += data
        return bool(data)

    def read_head(self) -> bytes | None:
        """The next request's line and headers (through the blank line); None at EOF."""
        while _HEADER_END not in self._buffer:
            if not self._fill():
                return None
        end = self._buffer.index(_HEADER_END) + len(_HEADER_END)
        head, self._buffer = self._buffer[:end], self._buffer[end:]
        return head

    def _read_line(self) -> bytes:
        while b"\r\n" not in self._buffer:
            if not self._fill():
                raise ConnectionError("client closed inside a chunked body")
        end = self._buffer.index(b"\r\n") + 2
        line, self._buffer = self._buffer[:end], self._buffer[end:]
        return line

    def relay(self, count: int, upstream: socket.socket) -> None:
        """Send the next ``count`` bytes of the client's stream upstream."""
        while count > 0:
            if not self._buffer and not self._fill():
                raise ConnectionError("client closed inside a request body")
            part, self._buffer = self._buffer[:count], self._buffer[count:]
            upstream.sendall(part)
            count -= len(part)

    def relay_chunked(self, upstream: socket.socket) -> None:
        """Send a chunked body (chunks, the last-chunk and trailers) upstream."""
        while True:
            line = self._read_line()
            upstream.sendall(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                break
            self.relay(size + 2, upstream)  # the chunk and its CRLF
        while (line := self._read_line()) != b"\r\n":
            upstream.sendall(line)
        upstream.sendall(line)


class _Sink:
    """A socket stand-in that swallows a request body."""

    def sendall(self, data: bytes) -> None:
        del data


def _discard_body(reader: _Reader, length: int, chunked: bool) -> None:
    sink: Any = _Sink()
    if chunked:
        reader.relay_chunked(sink)
    else:
        reader.relay(length, sink)


def _refuse(
    client: socket.socket,
    reader: _Reader,
    request: Request,
    status: int,
    length: int,
    chunked: bool,
) -> bool:
    """Answer ``request`` with HTTP ``status``; whether the connection stays open.

    A request with a body is answered at once and its connection closed: the client may
    wait for ``100 Continue`` before it sends the body (botocore does, for PUTs)."""
    if length or chunked:
        client.sendall(_error_response(status, with_body=True, close=True))
        return False
    _discard_body(reader, length, chunked)
    client.sendall(_error_response(status, with_body=request.method != "HEAD"))
    return True


def _error_response(status: int, with_body: bool, close: bool = False) -> bytes:
    body = (
        f"<?xml version='1.0'?><Error><Code>ServiceUnavailable</Code>"
        f"<Message>injected HTTP {status}</Message></Error>"
    ).encode()
    closing = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n{closing}\r\n"
    ).encode()
    return head + body if with_body else head


def _parse_head(head: bytes) -> tuple[Request, int, bool]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = int(headers.get("content-length", "0") or 0)
    request = Request(method=method, path=path, agent=headers.get("user-agent", ""))
    return request, length, chunked


def _shut(sock: socket.socket) -> None:
    """End both directions of ``sock`` (waking whoever waits on it), keeping its number."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _close(sock: socket.socket) -> None:
    _shut(sock)
    sock.close()


class ProxyProcess:
    """An :class:`S3Proxy` in a process of its own, for benchmarks: its threads then do not
    share the measured client's interpreter lock (a real S3 endpoint is not in the client's
    process either).  It answers the counting and delaying half of the proxy's interface.

    Parameters
    ----------
    target_url
        ``http://host:port`` of the real server.
    """

    def __init__(self, target_url: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__, target_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.endpoint_url = self._ask("endpoint")

    def _ask(self, command: str, *arguments: Any) -> Any:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps([command, *arguments]) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the proxy process exited ({self._process.wait()})")
        return json.loads(answer)

    def slow_down(self, seconds: float) -> None:
        """Hold every request ``seconds`` before forwarding it (0 to stop)."""
        self._ask("slow_down", seconds)

    def reset_log(self) -> None:
        """Forget the logged requests and byte counts."""
        self._ask("reset_log")

    @property
    def requests(self) -> list[Request]:
        """Requests forwarded to the server since the last :meth:`reset_log`."""
        return [Request(*fields) for fields in self._ask("requests")]

    @property
    def bytes_to_client(self) -> int:
        """Bytes (headers and bodies) the server sent back since :meth:`reset_log`."""
        return int(self._ask("bytes_to_client"))

    def close(self) -> None:
        """Close the proxy and wait for its process."""
        with contextlib.suppress(RuntimeError, OSError):
            self._ask("close")
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                pipe.close()
        self._process.wait(timeout=30)


def _serve_commands(target_url: str) -> None:
    """The child of :class:`ProxyProcess`: a proxy driven by JSON lines on stdin."""
    proxy = S3Proxy(target_url)
    answers: dict[str, Callable[..., Any]] = {
        "endpoint": lambda: proxy.endpoint_url,
        "slow_down": proxy.slow_down,
        "reset_log": proxy.reset_log,
        "requests": lambda: [[r.method, r.path, r.agent] for r in proxy.requests],
        "bytes_to_client": lambda: proxy.bytes_to_client,
        "close": proxy.close,
    }
    for line in sys.stdin:
        command, *arguments = json.loads(line)
        print(json.dumps(answers[command](*arguments)), flush=True)
        if command == "close":
            return


if __name__ == "__main__":
    _serve_commands(sys.argv[1])
