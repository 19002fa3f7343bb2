"""Run inside another network namespace (``nsenter --net``): connect to 127.0.0.1:PORT
there and hand the connected socket back over ``--socket-fd`` (SCM_RIGHTS). A socket
keeps the namespace it was made in, so the caller, in the host's namespace, talks over
it to a server (the real kubelet's port) that listens only inside.

    python -m testbed.realnode.dialer --port 10250 --socket-fd N
"""

from __future__ import annotations

import argparse
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.realnode.dialer")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--socket-fd", type=int, required=True)
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    with socket.socket(fileno=options.socket_fd) as channel:
        try:
            connection = socket.create_connection(("127.0.0.1", options.port), timeout=5)
        except OSError as exc:
            channel.sendall(f"connect to 127.0.0.1:{options.port} in the namespace: {exc}".encode())
            return 1
        with connection:
            socket.send_fds(channel, [b"connected"], [connection.fileno()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
