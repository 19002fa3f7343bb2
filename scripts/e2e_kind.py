"""`make e2e CLUSTER=kind`: the testbed on a kind cluster, with the driver as a DaemonSet.

1. checks that docker (with a running engine) and kind are there;
2. creates the cluster from kind-configs/dra-testbed.yaml (1.37: control plane + 2 workers);
3. builds the driver image (deploy/Dockerfile), loads it into the kind nodes;
4. deploys it (`kubectl apply -k deploy/`) and waits for the DaemonSet;
5. runs a pod with a GPU claim on a real kind worker: the real kubelet calls the driver;
6. brings the synthetic fleet to the cluster (`testbed up --kubeconfig`: Ray and the
   NodeHost actors run on this machine and talk to kind's API server);
7. runs `smoke` and a short `cl2-dra` (each writes its report and prints its path);
8. takes the fleet out again and deletes the cluster (KEEP=1 keeps both).

Environment: NODES (default 4), PROFILE (default h100x8), KIND_CLUSTER (default
dra-testbed), KEEP.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("KIND_CLUSTER", "dra-testbed")
TESTBED_NAME = "kind"
IMAGE = "dra-testbed-driver:dev"

GPU_POD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: default}
spec:
  spec:
    devices:
      requests: [{name: gpu, exactly: {deviceClassName: gpu.dra-testbed.io}}]
---
apiVersion: v1
kind: Pod
metadata: {name: real-kubelet-gpu, namespace: default}
spec:
  restartPolicy: Never
  nodeSelector: {kubernetes.io/hostname: %(worker)s}
  resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]
  containers:
    - name: main
      image: %(image)s
      imagePullPolicy: IfNotPresent
      command: [sh, -c, "env | grep -i dra || true; sleep 5"]
      resources: {claims: [{name: gpu}]}
"""


class Failed(Exception):
    pass


def run(*args: str, capture: bool = False, stdin: str | None = None) -> str:
    print(f"+ {' '.join(args)}", file=sys.stderr, flush=True)
    result = subprocess.run(list(args), input=stdin, text=True, stdout=subprocess.PIPE if capture else None)
    if result.returncode != 0:
        raise Failed(f"`{' '.join(args)}` exited {result.returncode}")
    return result.stdout or ""


def testbed(*args: str, capture: bool = False) -> str:
    return run(sys.executable, "-m", "testbed.cli", *args, "--name", TESTBED_NAME, capture=capture)


def preflight() -> str:
    """docker with a reachable engine, kind, and a kubectl; say what is missing and how to fix it."""
    missing = [tool for tool in ("docker", "kind") if shutil.which(tool) is None]
    if missing:
        raise Failed(
            f"{' and '.join(missing)} not found on PATH. CLUSTER=kind needs Docker (https://docs.docker.com/get-docker/)"
            " and kind v0.33+ (https://kind.sigs.k8s.io/docs/user/quick-start/#installation); "
            "plain `make e2e` needs neither."
        )
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        raise Failed("docker is installed but its engine does not answer (`docker info` fails): start Docker")
    kubectl = shutil.which("kubectl")
    if kubectl is None:  # the one `make install` built or downloaded with the control plane
        binaries = run(sys.executable, "-m", "testbed.cli", "binaries", capture=True).strip().splitlines()[-1]
        kubectl = str(Path(binaries) / "kubectl")
    return kubectl


def main() -> int:
    started = time.monotonic()
    keep = os.environ.get("KEEP") == "1"
    nodes, profile = os.environ.get("NODES", "4"), os.environ.get("PROFILE", "h100x8")
    try:
        kubectl_path = preflight()
    except Failed as exc:
        print(f"e2e (kind): {exc}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="dra-testbed-kind-"))
    kubeconfig = workdir / "kubeconfig"
    created = fleet_up = False  # what was there before (a kind cluster, a testbed cluster) is the user's
    try:
        run("kind", "create", "cluster", "--name", CLUSTER, "--config", str(ROOT / "kind-configs" / "dra-testbed.yaml"),
            "--kubeconfig", str(kubeconfig), "--wait", "120s")  # fmt: skip
        created = True

        def kubectl(*args: str, stdin: str | None = None) -> str:
            return run(kubectl_path, f"--kubeconfig={kubeconfig}", *args, stdin=stdin, capture=True)

        run("docker", "build", "-f", str(ROOT / "deploy" / "Dockerfile"), "-t", IMAGE, str(ROOT))
        run("kind", "load", "docker-image", IMAGE, "--name", CLUSTER)
        kubectl("apply", "-k", str(ROOT / "deploy"))
        kubectl("-n", "dra-testbed", "rollout", "status", "daemonset/dra-testbed-driver", "--timeout=180s")

        worker = f"{CLUSTER}-worker"
        kubectl("apply", "-f", "-", stdin=GPU_POD % {"worker": worker, "image": IMAGE})
        kubectl("wait", "pod/real-kubelet-gpu", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=180s")
        print(kubectl("logs", "real-kubelet-gpu"), file=sys.stderr)
        kubectl("delete", "pod/real-kubelet-gpu", "resourceclaimtemplate/one-gpu")

        testbed("up", "--kubeconfig", str(kubeconfig), "--nodes", nodes, "--profile", profile)
        fleet_up = True
        testbed("run", "smoke")
        testbed("run", "cl2-dra", "--set", "phases.1.runSeconds=1")
        testbed("status")
    except Failed as exc:
        print(f"e2e (kind) FAILED: {exc}", file=sys.stderr)
        keep = False
        return 1
    finally:
        if not keep:
            if fleet_up:
                subprocess.run([sys.executable, "-m", "testbed.cli", "down", "--name", TESTBED_NAME])
            if created:
                subprocess.run(["kind", "delete", "cluster", "--name", CLUSTER])
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"e2e (kind) passed in {time.monotonic() - started:.0f}s", file=sys.stderr)
    if keep:
        print(f"kept (KEEP=1): export KUBECONFIG={kubeconfig}\n"
              f"end it with: testbed down --name {TESTBED_NAME}; kind delete cluster --name {CLUSTER}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
