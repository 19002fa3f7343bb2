"""The Kubernetes client's own HTTP/1.1 connections (testbed/http11.py), against a
scripted server on a real socket: framing, keep-alive, stale connections, timeouts."""

from __future__ import annotations

import asyncio
import socket
import ssl
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testbed import http11
from testbed.controlplane import pki
from testbed.fleet.tlsmemory import TLS_READ_BUFFER, small_tls_read_buffers
from testbed.http11 import ConnectionPool, TransportError


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    connection: int


Answer = Callable[[Seen, asyncio.StreamWriter], Awaitable[bool]]
"""Writes the answer; returns False to close the connection afterwards."""


@dataclass
class Server:
    answer: Answer
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    most_open: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                lines = head.decode().split("\r\n")
                method, target, _ = lines[0].split(" ")
                headers = dict(line.split(": ", 1) for line in lines[1:] if line)
                body = await reader.readexactly(int(headers.get("Content-Length", "0")))
                seen = Seen(method, target, headers, body, number)
                self.seen.append(seen)
                if not await self.answer(seen, writer):
                    return
        finally:
            self.open_now -= 1
            writer.close()


def serve(
    answer: Answer,
    test: Callable[[ConnectionPool, Server], Awaitable[None]],
    limit: int = 8,
    server: Server | None = None,
) -> Server:
    async def main() -> Server:
        nonlocal server
        server = server or Server(answer)
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        pool = ConnectionPool(f"http://127.0.0.1:{port}", None, limit=limit)
        try:
            await test(pool, server)
        finally:
            pool.close()
            listener.close()
        return server

    return asyncio.run(main())


def with_length(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def echo(seen: Seen, writer: asyncio.StreamWriter) -> bool:
    writer.write(with_length(f'{{"target": "{seen.target}"}}'.encode()))
    await writer.drain()
    return True


def test_requests_share_one_kept_alive_connection_and_arrive_as_sent() -> None:
    async def test(pool: ConnectionPool, server: Server) -> None:
        for i in range(3):
            answer = await pool.request(
                "PUT", f"/api/v1/x{i}", {"Authorization": "Bearer t"}, b'{"a": 1}', {"fieldSelector": "a=b,c!=d"}
            )
            assert answer.status == 200
            assert answer.body == f'{{"target": "/api/v1/x{i}?fieldSelector=a%3Db%2Cc%21%3Dd"}}'.encode()

    server = serve(echo, test)
    assert server.connections == 1
    first = server.seen[0]
    assert (first.method, first.body) == ("PUT", b'{"a": 1}')
    assert first.headers["Authorization"] == "Bearer t"
    assert first.headers["Host"].startswith("127.0.0.1:")
    assert first.headers["Content-Length"] == "8"


def test_answers_that_have_no_body_whatever_their_head_says_end_with_the_head() -> None:
    """A HEAD request's answer, a 204 and a 304 carry no body (their Content-Length
    says what a GET would get): the request ends with the head, and the connection serves
    the next one."""

    async def answer(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        status = {"HEAD": "200 OK", "DELETE": "204 No Content", "PUT": "304 Not Modified"}.get(seen.method)
        if status is None:
            return await echo(seen, writer)
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 1234\r\n\r\n".encode())
        await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        for method, status in (("HEAD", 200), ("DELETE", 204), ("PUT", 304)):
            answer = await pool.request(method, "/api/v1/x", {}, timeout_s=5)
            assert (answer.status, answer.body) == (status, b""), method
        assert (await pool.request("GET", "/api/v1/y", {}, timeout_s=5)).body == b'{"target": "/api/v1/y"}'

    assert serve(answer, test).connections == 1


def test_a_chunked_answer_arriving_a_byte_at_a_time_is_whole() -> None:
    body = b'{"items": [' + b",".join(b'{"n": %d}' % i for i in range(50)) + b"]}"

    async def chunked(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for start in range(0, len(body), 37):
            piece = body[start : start + 37]
            wire += b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n"
        wire += b"0\r\nX-Trailer: yes\r\n\r\n"
        for i in range(len(wire)):
            writer.write(wire[i : i + 1])
            await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        for _ in range(2):
            answer = await pool.request("GET", "/list", {})
            assert answer.body == body

    assert serve(chunked, test).connections == 1


def test_connection_close_and_an_answer_framed_by_the_close() -> None:
    async def closing(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.target == "/until-close":
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n" + b"x" * 5000)
        else:
            writer.write(with_length(b"{}", extra="Connection: close\r\n"))
        await writer.drain()
        return False

    async def test(pool: ConnectionPool, server: Server) -> None:
        assert (await pool.request("GET", "/a", {})).body == b"{}"
        answer = await pool.request("GET", "/until-close", {})
        assert (answer.status, answer.body) == (500, b"x" * 5000)
        assert (await pool.request("GET", "/b", {})).body == b"{}"

    assert serve(closing, test).connections == 3


def test_a_stale_kept_alive_connection_is_retried_only_when_idempotent() -> None:
    """The race every keep-alive client meets: the server closes a connection it thinks
    idle just as a request goes out on it, which then gets no answer at all."""

    async def hang_up_on_the_second_request(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if sum(1 for s in server.seen if s.connection == seen.connection) == 2:
            return False  # closes without an answer
        writer.write(with_length(seen.target.encode()))
        await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        await pool.request("GET", "/first", {})
        assert (await pool.request("GET", "/again", {})).body == b"/again"  # again, on a new connection
        with pytest.raises(TransportError) as failure:
            await pool.request("POST", "/create", {}, b"{}")  # it may have landed: the caller decides
        assert failure.value.stale
        assert (await pool.request("GET", "/after", {})).body == b"/after"

    server = Server(hang_up_on_the_second_request)
    serve(server.answer, test, server=server)
    assert [(s.target, s.connection) for s in server.seen] == [
        ("/first", 1),
        ("/again", 1),
        ("/again", 2),
        ("/create", 2),
        ("/after", 3),
    ]


def test_a_request_that_times_out_leaves_no_connection_to_reuse() -> None:
    async def late(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.target == "/slow":
            await asyncio.sleep(0.5)
        writer.write(with_length(seen.target.encode()))
        await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        with pytest.raises(TimeoutError, match=r"^GET /slow: no answer from .* within 0.1 s$"):
            await pool.request("GET", "/slow", {}, timeout_s=0.1)
        assert (await pool.request("GET", "/fast", {})).body == b"/fast", "not the late answer to /slow"

    assert serve(late, test).connections == 2


def test_a_connection_owed_a_late_answer_serves_again_once_it_is_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing it would cost the next request a TLS handshake: on an overloaded API server
    every timeout then made more work."""

    async def late(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.target == "/slow":
            await asyncio.sleep(0.3)
        writer.write(with_length(seen.target.encode()))
        await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/slow", {}, timeout_s=0.05)
        async with asyncio.timeout(5):
            while not pool._idle:  # the late answer arrived and was set aside
                await asyncio.sleep(0.01)
        assert (await pool.request("GET", "/next", {})).body == b"/next"

    server = serve(late, test)
    assert server.connections == 1
    assert [s.target for s in server.seen] == ["/slow", "/next"]


def test_a_connection_whose_late_answer_never_comes_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http11, "LATE_ANSWER_S", 0.1)

    async def silent_once(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.target == "/never":
            await asyncio.sleep(3600)
        return await echo(seen, writer)

    async def test(pool: ConnectionPool, server: Server) -> None:
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/never", {}, timeout_s=0.05)
        async with asyncio.timeout(5):
            while pool.connections:  # closed on our side
                await asyncio.sleep(0.01)
        assert (await pool.request("GET", "/next", {})).status == 200
        assert pool.connections == 1

    assert serve(silent_once, test).connections == 2


def test_at_most_limit_connections_at_once() -> None:
    async def slowish(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.05)
        return await echo(seen, writer)

    async def test(pool: ConnectionPool, server: Server) -> None:
        answers = await asyncio.gather(*(pool.request("GET", f"/{i}", {}) for i in range(6)))
        assert all(a.status == 200 for a in answers)

    server = serve(slowish, test, limit=2)
    assert server.most_open == 2
    assert len(server.seen) == 6


def test_a_limit_of_0_is_no_limit() -> None:
    async def test(pool: ConnectionPool, server: Server) -> None:
        async with asyncio.timeout(10):
            answers = await asyncio.gather(*(pool.request("GET", f"/{i}", {}) for i in range(3)))
        assert all(a.status == 200 for a in answers)

    assert serve(echo, test, limit=0).seen


def test_an_unreachable_server_is_named() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: refused

        async def main() -> None:
            pool = ConnectionPool(f"http://127.0.0.1:{port}", None)
            with pytest.raises(TransportError, match=f"cannot reach http://127.0.0.1:{port}"):
                await pool.request("GET", "/", {})

        asyncio.run(main())


async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def test_a_large_answer_arrives_whole_over_tls_with_a_nodehosts_small_read_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NodeHost shrinks asyncio's per-connection TLS read buffer (tlsmemory.py): a
    multi-megabyte answer (a large slice list) must still arrive whole."""
    monkeypatch.setattr(sslproto.SSLProtocol, "max_size", sslproto.SSLProtocol.max_size)  # restored after
    small_tls_read_buffers()
    paths = pki.generate(tmp_path)
    serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.load_cert_chain(paths.serving_cert, paths.serving_key)
    body = b'{"items": [' + b",".join(b'{"n": %d}' % i for i in range(300_000)) + b"]}"

    async def main() -> bytes:
        server = Server(lambda seen, writer: _answer_with(writer, body))
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=serving)
        port = listener.sockets[0].getsockname()[1]
        pool = ConnectionPool(f"https://127.0.0.1:{port}", ssl.create_default_context(cafile=paths.ca_cert))
        try:
            first = await pool.request("GET", "/big", {})
            second = await pool.request("GET", "/big", {})  # the kept-alive connection still frames right
            assert first.body == second.body
            return first.body
        finally:
            pool.close()
            listener.close()

    received = asyncio.run(main())
    assert len(body) > 3 * 1024 * 1024 and received == body

    async def buffer_size() -> int:
        loop = asyncio.get_running_loop()
        protocol = sslproto.SSLProtocol(loop, asyncio.Protocol(), ssl.create_default_context(), loop.create_future())
        return len(protocol._ssl_buffer)  # type: ignore[attr-defined] # what the memory saving rests on: a newer Python may size it otherwise

    assert asyncio.run(buffer_size()) == TLS_READ_BUFFER


async def _answer_with(writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(with_length(body))
    await writer.drain()
    return True


def test_after_close_idle_the_next_request_connects_afresh_and_a_busy_one_is_left_alone() -> None:
    release = asyncio.Event()

    async def held(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.target == "/held":
            await release.wait()
        return await echo(seen, writer)

    async def test(pool: ConnectionPool, server: Server) -> None:
        await pool.request("GET", "/first", {})
        busy = asyncio.create_task(pool.request("GET", "/held", {}))
        async with asyncio.timeout(5):
            while len(server.seen) < 2:
                await asyncio.sleep(0.01)
        pool.close_idle()  # the first connection is idle again; the second is busy
        await pool.request("GET", "/third", {})
        release.set()
        assert (await busy).body == b'{"target": "/held"}'

    server = serve(held, test)
    assert [s.connection for s in server.seen] == [1, 1, 2]
    assert server.connections == 2, "the busy connection was closed under its request"


def test_new_connections_are_health_checked_with_keepalive() -> None:
    async def test(pool: ConnectionPool, server: Server) -> None:
        await pool.request("GET", "/", {})
        (connection,) = pool._idle
        assert connection.transport is not None
        sock = connection.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 1

    async def main() -> None:
        server = Server(echo)
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        pool = ConnectionPool(f"http://127.0.0.1:{port}", None, health_check=(7, 3))
        try:
            await test(pool, server)
        finally:
            pool.close()
            listener.close()

    asyncio.run(main())


# --- streamed answers (watches) ------------------------------------------------------


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_stream_yields_each_line_as_it_comes_then_its_connection_serves_again() -> None:
    """A watch: the events arrive while the answer is still open, a line may be cut across
    chunks, and a watch whose time ran out leaves its connection for the next request."""
    go_on = asyncio.Event()

    async def watch_then_echo(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.target != "/watch?watch=1":
            return await echo(seen, writer)
        writer.write(STREAM_HEAD + chunk(b'{"n": 1}\n{"n"'))
        await writer.drain()
        await go_on.wait()  # the first event must be out before the answer ends
        writer.write(chunk(b": 2}\n\n") + chunk(b'{"n": 3}\n') + b"0\r\n\r\n")
        await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        lines = []
        async with pool.stream("/watch", {"Accept": "application/json"}, {"watch": "1"}) as (head, stream):
            assert head.status == 200 and stream is not None
            async for line in stream:
                lines.append(line)
                go_on.set()
        assert lines == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
        assert (await pool.request("GET", "/next", {})).body == b'{"target": "/next"}'

    server = serve(watch_then_echo, test)
    assert server.connections == 1
    assert server.seen[0].headers["Accept"] == "application/json"


def test_a_stream_left_before_its_end_closes_its_connection() -> None:
    async def endless(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.target != "/watch":
            return await echo(seen, writer)
        writer.write(STREAM_HEAD + chunk(b'{"n": 1}\n'))
        await writer.drain()
        await asyncio.sleep(3600)
        return False

    async def test(pool: ConnectionPool, server: Server) -> None:
        async with pool.stream("/watch", {}) as (_, stream):
            assert stream is not None
            assert await anext(stream) == b'{"n": 1}'
        assert pool.connections == 0, "the rest of that answer would be read as the next one's"
        assert (await pool.request("GET", "/next", {})).status == 200

    assert serve(endless, test).connections == 2


def test_a_refused_stream_gives_its_whole_answer_and_keeps_the_connection() -> None:
    gone = b'{"kind": "Status", "code": 410, "reason": "Expired"}'

    async def refuse(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(with_length(gone, status="410 Gone"))
        await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        for _ in range(2):
            async with pool.stream("/watch", {}) as (head, stream):
                assert (head.status, head.body, stream) == (410, gone, None)

    assert serve(refuse, test).connections == 1


def test_a_stream_ends_with_an_error_on_a_cut_connection_an_overlong_line_or_its_deadline() -> None:
    async def misbehave(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD + chunk(b'{"n": 1}\n'))
        if seen.target == "/long":
            writer.write(chunk(b"x" * 2048))
        await writer.drain()
        if seen.target == "/cut":
            return False
        await asyncio.sleep(3600)
        return False

    async def read_all(pool: ConnectionPool, target: str, timeout_s: float = 60.0) -> list[bytes]:
        lines = []
        async with pool.stream(target, {}, timeout_s=timeout_s, line_limit=1024) as (_, stream):
            assert stream is not None
            async for line in stream:
                lines.append(line)
        return lines

    async def test(pool: ConnectionPool, server: Server) -> None:
        async with asyncio.timeout(10):
            with pytest.raises(TransportError, match="closed before the answer was complete"):
                await read_all(pool, "/cut")
            with pytest.raises(TransportError, match="a streamed line over 1024 bytes"):
                await read_all(pool, "/long")
            started = asyncio.get_running_loop().time()
            with pytest.raises(TransportError):
                await read_all(pool, "/hang", timeout_s=0.2)
            assert asyncio.get_running_loop().time() - started < 5
        assert pool.connections == 0

    serve(misbehave, test)


def test_a_consumer_that_falls_behind_stops_the_connection_reading_and_loses_nothing() -> None:
    """Flow control: unread lines are held up to a bound, then the server is made to wait."""
    line = b'{"pad": "' + b"p" * 1000 + b'"}\n'
    count = 4 * http11.STREAM_HIGH_WATER // len(line)

    async def flood(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        writer.write(STREAM_HEAD)
        for i in range(count):
            writer.write(chunk(line))
            if i % 100 == 0:
                await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        async with pool.stream("/watch", {}) as (_, stream):
            assert stream is not None
            transport = next(iter(pool._busy)).transport
            assert transport is not None
            async with asyncio.timeout(10):
                while transport.is_reading():
                    await asyncio.sleep(0.01)
            assert stream._held <= http11.STREAM_HIGH_WATER + 256 * 1024  # and the read that passed it
            received = [item async for item in stream]
        assert len(received) == count and all(item == line[:-1] for item in received)

    serve(flood, test)


def test_a_stream_sent_on_a_connection_the_server_just_closed_goes_again_afresh() -> None:
    async def hang_up_on_the_second_request(seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if sum(1 for s in server.seen if s.connection == seen.connection) == 2:
            return False  # closes without an answer
        if seen.target == "/watch":
            writer.write(STREAM_HEAD + chunk(b'{"n": 1}\n') + b"0\r\n\r\n")
        else:
            writer.write(with_length(b"{}"))
        await writer.drain()
        return True

    async def test(pool: ConnectionPool, server: Server) -> None:
        await pool.request("GET", "/list", {})
        async with pool.stream("/watch", {}) as (head, stream):
            assert head.status == 200 and stream is not None
            assert [line async for line in stream] == [b'{"n": 1}']

    server = Server(hang_up_on_the_second_request)
    serve(server.answer, test, server=server)
    assert [(s.target, s.connection) for s in server.seen] == [("/list", 1), ("/watch", 1), ("/watch", 2)]
