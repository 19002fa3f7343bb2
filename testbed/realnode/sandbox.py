"""The sandbox a real kubelet runs in, entered through ``unshare --net --mount``.

Run as ``python -m testbed.realnode.sandbox [options] -- kubelet ARGS...``, already inside
a new network and mount namespace (private propagation), it:

1. brings up ``lo`` and gives it the node's IP (the kubelet refuses a loopback node IP,
   and the address exists only in this namespace: nothing leaves the machine);
2. binds a listening socket on 127.0.0.1:<API server port> in this namespace and hands
   it to the parent over ``--socket-fd`` (SCM_RIGHTS): the parent, in the host's
   namespace, relays it to the real API server on the host's loopback;
3. masks the sysctls the kubelet sets (files holding the values it wants, so it reads
   them and writes nothing), then makes all of /proc/sys read-only, and puts a private
   directory over /var/log (the kubelet links container logs into /var/log/containers):
   nothing on the host changes;
4. mounts the node's kubelet directory at /var/lib/kubelet, on a tmpfs over /var/lib
   (a real node's path, and one short enough for the sockets drivers name after their
   pod's UID: a unix socket path holds 107 bytes);
5. execs the kubelet.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
"""What kubelet v1.37 sets at start (container_manager_linux.go setupKernelTunables)."""
KUBELET_ROOT = Path("/var/lib/kubelet")
"""The kubelet's root directory inside the sandbox."""


def _run(*command: str) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def enter(node_ip: str, api_port: int, socket_fd: int, private_dir: Path, kubelet_dir: Path | None = None) -> None:
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "addr", "add", f"{node_ip}/32", "dev", "lo")

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", api_port))
    listener.listen(128)
    with socket.socket(fileno=socket_fd) as channel:
        socket.send_fds(channel, [b"listener"], [listener.fileno()])
    listener.close()

    # Read-only first: masks mounted after it sit on top of it.
    _run("mount", "--bind", "/proc/sys", "/proc/sys")
    _run("mount", "-o", "remount,bind,ro", "/proc/sys")
    sysctl_dir = private_dir / "sysctl"
    sysctl_dir.mkdir(parents=True, exist_ok=True)
    for name, value in KUBELET_SYSCTLS.items():
        mask = sysctl_dir / name.replace("/", ".")
        mask.write_text(value + "\n")
        _run("mount", "--bind", str(mask), f"/proc/sys/{name}")
    var_log = private_dir / "var-log"
    var_log.mkdir(parents=True, exist_ok=True)
    _run("mount", "--bind", str(var_log), "/var/log")
    if kubelet_dir is not None:
        _run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(KUBELET_ROOT.parent))
        KUBELET_ROOT.mkdir()
        _run("mount", "--bind", str(kubelet_dir), str(KUBELET_ROOT))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args:
        sys.exit("usage: python -m testbed.realnode.sandbox OPTIONS -- KUBELET ARGS...")
    split = args.index("--")
    parser = argparse.ArgumentParser(prog="python -m testbed.realnode.sandbox")
    parser.add_argument("--node-ip", required=True)
    parser.add_argument("--api-port", type=int, required=True)
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--private-dir", type=Path, required=True)
    parser.add_argument("--kubelet-dir", type=Path)
    options = parser.parse_args(args[:split])
    command = args[split + 1 :]
    enter(options.node_ip, options.api_port, options.socket_fd, options.private_dir, options.kubelet_dir)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
