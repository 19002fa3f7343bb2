"""HTTP/1.1 over keep-alive connections: the Kubernetes client's one-shot requests.

Every synthetic node's kubelet and drivers make a request every few seconds (Lease
renewals, status writes, claim reads), thousands of nodes to a process. aiohttp spent
0.44 ms of CPU on a Lease PUT, of which the request's own work (JSON, TLS, the socket)
is 0.2 ms: the rest was its general machinery (URL objects, request and response
objects, tracing, cookies, decompression). This does only what the API server's
answers need: Content-Length or chunked bodies, keep-alive, ``Connection: close``.
Watches stream over the same connections (``ConnectionPool.stream``), line by line: an
aiohttp session of its own for each node's pod watch was 9% of a NodeHost's CPU while its
nodes started.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlencode, urlsplit

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
LATE_ANSWER_S = 65.0
"""How long a connection waits for the answer to a request given up on: the API server
answers every request within its own 60 s timeout (504 if need be)."""
HEAD_TIMEOUT_S = 30.0
"""A stream's connection made and its answer's head in: client-go's dial timeout."""


class TransportError(ConnectionError):
    """The server could not be reached, or went away before it answered in full."""

    stale = False
    """It was a kept-alive connection that failed before any byte of the answer."""
    unreachable = False
    """No connection could be made (refused, no route): the request never left."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


STREAM_HIGH_WATER = 1024 * 1024
"""Bytes of a streamed answer held unread before the connection stops reading: a slow
consumer makes the server wait (TCP's own flow control), not this process's memory grow."""


class LineStream:
    """The body of a streamed answer, line by line (a watch sends one event a line).
    Ends when the body does; a connection lost first, or a line over ``line_limit``
    bytes, ends it with a TransportError."""

    def __init__(self, transport: asyncio.Transport, line_limit: int) -> None:
        self._transport = transport
        self._line_limit = line_limit
        self._partial = bytearray()
        self._lines: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._paused = False
        self._wake = asyncio.Event()
        self._ended = False
        self._error: Exception | None = None

    def feed(self, data: bytes | bytearray) -> None:
        partial = self._partial
        partial += data
        if b"\n" in data:
            *lines, rest = partial.split(b"\n")
            for line in lines:
                if line.strip():
                    self._lines.append(bytes(line))
                    self._held += len(line)
            self._partial = bytearray(rest)
        if len(self._partial) > self._line_limit:
            self.end(TransportError(f"a streamed line over {self._line_limit} bytes"))
            return
        if self._held > STREAM_HIGH_WATER and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        self._wake.set()

    def end(self, error: Exception | None = None) -> None:
        if not self._ended:
            self._ended, self._error = True, error
            self._wake.set()

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def complete(self) -> bool:
        """The body ended as the server framed it (not cut short by an error)."""
        return self._ended and self._error is None

    def __aiter__(self) -> LineStream:
        return self

    async def __anext__(self) -> bytes:
        while not self._lines:
            if self._ended:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        line = self._lines.popleft()
        self._held -= len(line)
        if self._paused and self._held < STREAM_HIGH_WATER // 2:
            self._paused = False
            self._transport.resume_reading()
        return line


def check_health(transport: asyncio.BaseTransport, health_check: tuple[int, int] | None) -> None:
    """TCP keepalive on the connection: silent for ``idle`` seconds, it is probed, and
    closed when no answer comes within ``timeout`` (config.connection_health_check)."""
    sock = transport.get_extra_info("socket")
    if health_check is None or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    idle, timeout = health_check
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 1)


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _UNTIL_CLOSE = range(6)


class _Connection(asyncio.Protocol):
    """One connection, one request at a time; parses the answer as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self.idle_since = 0.0
        self.uses = 0
        self.answered = False
        """Some of the answer to the latest request arrived."""
        self._buffer = bytearray()
        self._answer: asyncio.Future[Response] | None = None
        self._state = _HEAD
        self._status = 0
        self._body = bytearray()
        self._remaining = 0
        self._keep_alive = True
        self._bodiless = False
        """The answer has no body, whatever its head says: a HEAD request's."""
        self._line_limit = 0
        """Above 0: the request is a stream's, and a 2xx answer's body goes to ``stream``."""
        self.stream: LineStream | None = None

    # --- asyncio.Protocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports (Ray runs actors on uvloop when it is installed) have the
        # asyncio.Transport methods without being its subclasses
        self.transport = cast(asyncio.Transport, transport)
        self.reusable = True

    def data_received(self, data: bytes) -> None:
        streaming = self.stream is not None and not self.stream.ended
        if not streaming and (self._answer is None or self._answer.done()):
            self.reusable = False  # bytes nobody asked for: the framing is lost
            self.close()
            return
        self.answered = True
        self._buffer += data
        try:
            self._parse()
        except (ValueError, IndexError) as exc:
            self._fail(TransportError(f"malformed HTTP answer: {exc}"))

    def eof_received(self) -> bool | None:
        self.reusable = False
        if self._state == _UNTIL_CLOSE:
            self._finish()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._state == _UNTIL_CLOSE:
            self._finish()
        self._fail(TransportError(f"connection closed before the answer was complete{f': {exc}' if exc else ''}"))

    # --- use -----------------------------------------------------------------------

    def send(self, request: bytes, line_limit: int = 0) -> asyncio.Future[Response]:
        """The answer, once whole; with ``line_limit``, a 2xx answer as soon as its head
        is in (an empty body), its body then arriving in ``stream``."""
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self.uses += 1
        self.answered = False
        self._state, self._status, self._keep_alive = _HEAD, 0, True
        self._body = bytearray()
        self._bodiless = request.startswith(b"HEAD ")
        self._line_limit, self.stream = line_limit, None
        self.transport.write(request)
        return self._answer

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    # --- parsing -------------------------------------------------------------------

    def _parse(self) -> None:
        buffer = self._buffer
        while True:
            if self._state == _HEAD:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                self._head(bytes(buffer[:end]))
                del buffer[: end + 4]
            elif self._state == _LENGTH:
                if len(buffer) < self._remaining:
                    return
                self._take(buffer[: self._remaining])
                del buffer[: self._remaining]
                self._finish()
                return
            elif self._state == _CHUNK_SIZE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buffer[:end]).split(b";", 1)[0], 16)
                del buffer[: end + 2]
                self._state, self._remaining = (_TRAILER, 0) if size == 0 else (_CHUNK_DATA, size)
            elif self._state == _CHUNK_DATA:
                if len(buffer) < self._remaining + 2:
                    return
                self._take(buffer[: self._remaining])
                del buffer[: self._remaining + 2]
                self._state = _CHUNK_SIZE
            elif self._state == _TRAILER:
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                del buffer[: end + 2]
                if end == 0:  # the empty line after the trailers
                    self._finish()
                    return
            else:  # _UNTIL_CLOSE
                self._take(buffer)
                buffer.clear()
                return

    def _take(self, data: bytearray) -> None:
        if self.stream is not None:
            self.stream.feed(data)
        else:
            self._body += data

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, code = lines[0].split(b" ", 2)[:2]
        self._status = int(code)
        self._keep_alive = version == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                token = value.strip().lower()
                self._keep_alive = token != b"close" and (self._keep_alive or token == b"keep-alive")
        if self._bodiless or self._status in (204, 304) or 100 <= self._status < 200:
            self._state, self._remaining = _LENGTH, 0  # no body, whatever the head says
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._state, self._remaining = _LENGTH, length
        else:
            self._state, self._keep_alive = _UNTIL_CLOSE, False
        if self._line_limit and 200 <= self._status < 300 and self._answer is not None:
            assert self.transport is not None
            self.stream = LineStream(self.transport, self._line_limit)
            self._answer.set_result(Response(self._status, b""))

    def _finish(self) -> None:
        answer = self._answer
        self._state = _HEAD
        if self.stream is not None:
            self.stream.end()
        if self._buffer or not self._keep_alive:
            self.reusable = False
        if answer is not None and not answer.done():
            answer.set_result(Response(self._status, bytes(self._body)))
        if not self.reusable:
            self.close()

    def _fail(self, exc: Exception) -> None:
        self.reusable = False
        if self.stream is not None:
            self.stream.end(exc)
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)
        self.close()


class ConnectionPool:
    """Keep-alive connections to one server, at most ``limit`` requests at once (0: no
    limit; a connection still owed the answer to a request given up on is not counted);
    an idle connection is closed after ``keepalive_s`` (under the API server's own idle
    limit). ``health_check``: (idle, timeout) seconds of TCP keepalive (check_health)."""

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext | None,
        limit: int = 64,
        keepalive_s: float = 60.0,
        health_check: tuple[int, int] | None = None,
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"server {server!r}: want https://host[:port]")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl_context = ssl_context if url.scheme == "https" else None
        authority = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = f"{authority}:{self.port}".encode()
        self.server = server
        self.keepalive_s = keepalive_s
        self.health_check = health_check
        self.limit = limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = self._new_slots()
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self.closed = False

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        params: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> Response:
        request = self._encode(method, path, headers, body, params)
        try:
            async with asyncio.timeout(timeout_s), self._slots:
                try:
                    return await self._exchange(request)
                except TransportError as exc:
                    # A kept-alive connection the server had just closed: as HTTP clients
                    # do, an idempotent request goes again at once on a new connection.
                    if not exc.stale or method not in IDEMPOTENT:
                        raise
                return await self._exchange(request)
        except TimeoutError as exc:  # asyncio's says nothing; a teardown's log should say what
            if exc.args:
                raise
            raise TimeoutError(f"{method} {path}: no answer from {self.server} within {timeout_s:g} s") from None

    @contextlib.asynccontextmanager
    async def stream(
        self,
        path: str,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
        line_limit: int = 4 * 1024 * 1024,
    ) -> AsyncIterator[tuple[Response, LineStream | None]]:
        """GET ``path`` and read its answer's body line by line as it comes (a watch): the
        head, and the lines of a 2xx answer (None otherwise: the Response holds the whole
        body). A connection of its own, outside the request limit, for ``timeout_s`` at
        most (connected and answered within ``HEAD_TIMEOUT_S``); back to the pool when
        the body ended as framed, closed when the block is left before."""
        request = self._encode("GET", path, headers, None, params)
        async with asyncio.timeout(min(timeout_s, HEAD_TIMEOUT_S)):
            for attempt in (1, 2):
                connection = await self._connection()
                try:
                    head = await connection.send(request, line_limit)
                    break
                except BaseException as exc:
                    connection.close()
                    self._release(connection)
                    # A kept-alive connection the server had just closed: again, afresh.
                    stale = connection.uses > 1 and not connection.answered
                    if not (isinstance(exc, TransportError) and stale and attempt == 1):
                        raise
        deadline = asyncio.get_running_loop().call_later(timeout_s, connection.close)
        try:
            yield head, connection.stream
        finally:
            deadline.cancel()
            if connection.stream is not None and not connection.stream.complete:
                connection.close()
            self._release(connection)

    def _encode(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None,
        params: Mapping[str, str] | None,
    ) -> bytes:
        if self.closed:
            raise TransportError(f"the client for {self.server} is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections and waiters belong to the loop that made them
            self._idle.clear()
            self._busy.clear()
            self._loop, self._slots = loop, self._new_slots()
        target = f"{path}?{urlencode(params)}" if params else path
        lines = [f"{method} {target} HTTP/1.1\r\n".encode(), b"Host: ", self._host_header, b"\r\n"]
        lines += [f"{name}: {value}\r\n".encode() for name, value in headers.items()]
        lines.append(f"Content-Length: {len(body)}\r\n\r\n".encode() if body is not None else b"\r\n")
        if body is not None:
            lines.append(body)
        return b"".join(lines)

    async def _exchange(self, request: bytes) -> Response:
        connection = await self._connection()
        answer = connection.send(request)
        try:
            response = await asyncio.shield(answer)  # given up on, it may still come: see below
        except TransportError as exc:
            exc.stale = connection.uses > 1 and not connection.answered
            self._release(connection)
            raise
        except BaseException:
            self._await_late_answer(connection, answer)
            raise
        self._release(connection)
        return response

    def _await_late_answer(self, connection: _Connection, answer: asyncio.Future[Response]) -> None:
        """A request given up on (timed out, cancelled) may still be answered, and HTTP/1.1
        carries nothing else on its connection until then. Closing the connection instead
        cost the next request a TLS handshake on both sides, so an overloaded API server
        got more work from every timeout: 5,000 nodes starting on 2 cores opened about 440
        connections a second. The connection goes back to the pool once its answer is in,
        or closes after ``LATE_ANSWER_S``."""
        if answer.done() or not connection.reusable or self.closed:
            connection.close()
            self._release(connection)
            return
        timer = asyncio.get_running_loop().call_later(LATE_ANSWER_S, connection.close)

        def settled(late: asyncio.Future[Response]) -> None:
            timer.cancel()
            if not late.cancelled():
                late.exception()  # nobody waits for it any more: not an error to report
            self._release(connection)

        answer.add_done_callback(settled)

    def _new_slots(self) -> asyncio.Semaphore | contextlib.nullcontext[None]:
        return asyncio.Semaphore(self.limit) if self.limit > 0 else contextlib.nullcontext()

    async def _connection(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable and now - connection.idle_since < self.keepalive_s:
                self._busy.add(connection)
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                _Connection,
                self.host,
                self.port,
                ssl=self.ssl_context,
                server_hostname=self.host if self.ssl_context is not None else None,
            )
        except ssl.SSLError:
            raise  # a certificate problem: trying again will not help
        except OSError as exc:
            error = TransportError(f"cannot reach {self.server}: {exc}")
            error.unreachable = True
            raise error from exc
        assert connection.transport is not None
        check_health(connection.transport, self.health_check)
        self._busy.add(connection)
        return connection

    def _release(self, connection: _Connection) -> None:
        self._busy.discard(connection)
        if connection.reusable and not self.closed:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)

    @property
    def connections(self) -> int:
        """Open connections, idle or in use."""
        return sum(1 for c in [*self._idle, *self._busy] if c.reusable)

    def close_idle(self) -> None:
        """Close the connections no request is using: the next requests connect afresh."""
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def close(self) -> None:
        self.closed = True
        for connection in [*self._idle, *self._busy]:
            connection.close()
        self._idle.clear()
        self._busy.clear()
