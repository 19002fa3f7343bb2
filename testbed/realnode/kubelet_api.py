"""Reading a process node's kubelet: its /metrics, for comparing a real kubelet with the
fake one figure for figure.

The real kubelet serves HTTPS on port 10250 inside its own network namespace, as kubeadm
configures it: clients authenticate with a certificate from the cluster CA or a bearer
token (checked by TokenReview), and each request is authorized by SubjectAccessReview
(``nodes/metrics`` for /metrics). The host reaches that port through a socket made
inside the namespace (``dialer.py``, entered with ``nsenter``) and checks the kubelet's
self-signed serving certificate against the copy the kubelet wrote in its cert dir.

The fake kubelet as a process serves /metrics over a unix socket in the node's root,
reachable only to whoever may open that path.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
from pathlib import Path

from testbed.errors import TestbedError
from testbed.kubeapi import credentials_from_kubeconfig

KUBELET_PORT = 10250
FAKE_METRICS_SOCKET = "kubelet-metrics.sock"
"""Under the node's root: where a fake kubelet process serves /metrics."""
SERVING_CERT = Path("private/pki/kubelet.crt")
"""Under the node's root: the self-signed certificate the real kubelet serves with."""
TIMEOUT_S = 10.0


async def kubelet_metrics(root: Path, node: str, kubeconfig: Path, kubelet_pid: int | None) -> str:
    """The /metrics text of the kubelet serving the process node under ``root``, read
    with the credentials of ``kubeconfig`` (the cluster admin's, say). ``kubelet_pid``:
    the real kubelet's process, None if none runs."""
    fake = root / FAKE_METRICS_SOCKET
    if fake.is_socket():
        try:
            async with asyncio.timeout(TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(str(fake))
                return _body(node, await _get(reader, writer, "/metrics", node, token=None))
        except (OSError, TimeoutError) as exc:
            raise TestbedError(
                f"node {node}: its fake kubelet does not answer on {fake} ({exc or type(exc).__name__})",
                hint="is the node still running? `testbed status` shows it",
            ) from None
    if kubelet_pid is None:
        raise TestbedError(
            f"node {node}: no kubelet running",
            hint="only a `kubelet: real` pool's nodes (or a fake kubelet run as a process) have a kubelet of "
            "their own; a synthetic node's kubelet counts in its NodeHost's /metrics",
        )
    credentials = credentials_from_kubeconfig(kubeconfig, trust=_serving_certificate(root, node))
    try:
        async with asyncio.timeout(TIMEOUT_S):
            connection = await _connect_inside(kubelet_pid, KUBELET_PORT)
            reader, writer = await asyncio.open_connection(
                sock=connection, ssl=credentials.ssl_context, server_hostname=node
            )
            return _body(node, await _get(reader, writer, "/metrics", node, credentials.token))
    except ssl.SSLCertVerificationError as exc:
        raise TestbedError(
            f"node {node}: the kubelet's serving certificate does not match {root / SERVING_CERT} ({exc})",
            hint="the kubelet writes a new one when its cert dir is emptied; restart the node",
        ) from None
    except (OSError, TimeoutError) as exc:
        raise TestbedError(
            f"node {node}: its kubelet does not answer on port {KUBELET_PORT} ({exc or type(exc).__name__})",
            hint=f"the kubelet's log is {root / 'logs' / 'kubelet.log'}",
        ) from None


def _serving_certificate(root: Path, node: str) -> bytes:
    path = root / SERVING_CERT
    try:
        return path.read_bytes()
    except OSError:
        raise TestbedError(
            f"node {node}: the kubelet's serving certificate {path} is not there yet",
            hint="the kubelet writes it as it starts; try again once the node is Ready",
        ) from None


async def _connect_inside(pid: int, port: int) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port`` in the network namespace of process ``pid``."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        process = await asyncio.create_subprocess_exec(
            "nsenter",
            f"--target={pid}",
            "--net",
            "--",
            sys.executable,
            "-m",
            "testbed.realnode.dialer",
            f"--port={port}",
            f"--socket-fd={theirs.fileno()}",
            pass_fds=(theirs.fileno(),),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        theirs.close()
        _, stderr = await process.communicate()
        ours.setblocking(False)
        try:
            message, fds, _, _ = socket.recv_fds(ours, 1024, 1)
        except BlockingIOError:
            message, fds = b"", []
        if not fds:
            why = message.decode(errors="replace") or stderr.decode(errors="replace").strip()
            raise ConnectionError(why or f"nsenter exited with {process.returncode}")
        return socket.socket(fileno=fds[0])


async def _get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, host: str, token: str | None
) -> tuple[int, bytes]:
    """One HTTP/1.0 GET: the server answers without chunking and closes."""
    headers = [f"GET {path} HTTP/1.0", f"Host: {host}", "Accept: text/plain"]
    if token:
        headers.append(f"Authorization: Bearer {token}")
    try:
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode())
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {head[:80]!r}")
    return int(status_line[1]), body


def _body(node: str, answer: tuple[int, bytes]) -> str:
    status, body = answer
    if status != 200:
        raise TestbedError(
            f"node {node}: the kubelet answered /metrics with HTTP {status}: {body.decode(errors='replace')[:200]}",
            hint="the credentials need `get` on nodes/metrics (the cluster admin's have it)",
        )
    return body.decode()


REFERENCE_PREFIX = "real_kubelet:"
"""Prefixed to a real kubelet's DRA series in its NodeHost's metrics: read beside the fake
kubelets' figures, never summed with them (the real kubelet's buckets start at 0.1 s)."""
REFERENCE_FAMILIES = ("dra_operations_duration_seconds", "dra_grpc_operations_duration_seconds")


def reference_lines(node: str, text: str) -> list[str]:
    """A real kubelet's DRA histogram samples from its /metrics text, renamed with
    REFERENCE_PREFIX and labelled with its node (so nodes' series stay apart)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith(REFERENCE_FAMILIES):
            continue
        name, brace, rest = line.partition("{")
        if brace:
            lines.append(f'{REFERENCE_PREFIX}{name}{{node="{node}",{rest}')
        else:
            name, _, value = line.partition(" ")
            lines.append(f'{REFERENCE_PREFIX}{name}{{node="{node}"}} {value}')
    return lines
