"""`python -m testbed.kubelet`: one fake kubelet as its own process, for one node.

What a driver developer runs next to their own driver (started as a DaemonSet would
start it, with ``--root-dir`` as its kubelet directory), and what the real-vs-fake
comparison runs opposite a real kubelet. SIGTERM or SIGINT stops it; the Node stays, as
a stopped kubelet leaves its Node (``--delete-node`` removes it too).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import signal
import sys
from pathlib import Path

from testbed.config import KUBELET_SYNC_FREQUENCY_S, LOG_FORMAT, REGISTRY_BURST, REGISTRY_PULL_QPS
from testbed.errors import TestbedError
from testbed.kubeapi import KubeClient, path_for
from testbed.kubelet.declared import cluster_declared_features
from testbed.kubelet.kubelet import FakeKubelet
from testbed.kubelet.node import NodeSpec
from testbed.metrics_server import MetricsServer


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return seconds


def _count(text: str, least: int) -> int:
    try:
        count = int(text)
    except ValueError:
        count = least - 1
    if count < least:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least {least}")
    return count


def _non_negative(text: str) -> int:
    return _count(text, 0)


def _positive(text: str) -> int:
    return _count(text, 1)


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m testbed.kubelet", description=__doc__.splitlines()[0])
    parser.add_argument("--node", required=True, help="the Node's name")
    parser.add_argument("--kubeconfig", type=Path, required=True, help="credentials to reach the API server")
    parser.add_argument("--root-dir", type=Path, required=True, help="the kubelet dir (plugins_registry/, plugins/)")
    parser.add_argument("--cdi-dir", type=Path, required=True, help="where drivers write CDI specs")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE, repeatable")
    parser.add_argument(
        "--sync-frequency",
        type=_seconds,
        default=KUBELET_SYNC_FREQUENCY_S,
        help="seconds between a pod's periodic syncs, as the KubeletConfiguration's syncFrequency (default 60)",
    )
    parser.add_argument(
        "--registry-pull-qps",
        type=_non_negative,
        default=REGISTRY_PULL_QPS,
        help=f"image pulls a second beyond the burst, as registryPullQPS (default {REGISTRY_PULL_QPS}; 0: no limit)",
    )
    parser.add_argument(
        "--registry-burst",
        type=_positive,
        default=REGISTRY_BURST,
        help=f"image pulls at once, as registryBurst (default {REGISTRY_BURST})",
    )
    parser.add_argument("--delete-node", action="store_true", help="delete the Node on exit")
    parser.add_argument("--metrics-port", type=int, help="serve /metrics on 127.0.0.1:PORT (0: any free port)")
    parser.add_argument("--metrics-socket", type=Path, help="serve /metrics on this unix socket (0600)")
    return parser.parse_args(argv)


async def _run(args: argparse.Namespace) -> None:
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not sep:
            raise TestbedError(f"--label {item!r} is not KEY=VALUE")
        labels[key] = value
    client = KubeClient.from_kubeconfig(args.kubeconfig)
    spec = NodeSpec(args.node, labels=labels, declared_features=await cluster_declared_features(client))
    kubelet = FakeKubelet(
        client,
        spec,
        args.root_dir,
        args.cdi_dir,
        sync_frequency_s=args.sync_frequency,
        pull_limit=(args.registry_pull_qps, args.registry_burst),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = None
    if args.metrics_port is not None or args.metrics_socket is not None:
        metrics = MetricsServer(port=args.metrics_port or 0, path=args.metrics_socket)
    try:
        await kubelet.start()
        if metrics is not None:
            port = await metrics.start()
            where = args.metrics_socket or f"http://127.0.0.1:{port}/metrics"
            logging.getLogger("testbed.kubelet").info("serving /metrics on %s", where)
        logging.getLogger("testbed.kubelet").info("fake kubelet for node %s running", args.node)
        await stop.wait()
    finally:
        if metrics is not None:
            await metrics.stop()
        await kubelet.stop()
        if args.delete_node:
            await client.delete_if_exists(path_for("v1", "nodes", args.node))
        await client.close()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        asyncio.run(_run(_arguments(sys.argv[1:] if argv is None else argv)))
    except TestbedError as exc:
        print(f"testbed.kubelet: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
