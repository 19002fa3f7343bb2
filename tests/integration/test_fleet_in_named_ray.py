"""A fleet in a Ray cluster the user runs (fleet file `ray.address`): joining it without
its token is one clear error, and `testbed down` takes the NodeHosts out of that Ray,
which outlives the testbed's cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.fleet import raycluster
from testbed.fleet.membership import KV_NAMESPACE

pytestmark = pytest.mark.controlplane

NAME = "namedray"


def _named_actors(address: str, env: dict[str, str]) -> list[str]:
    """The NodeHosts in the testbed cluster's Ray namespace, and what the GCS remembers of
    their nodes, asked from a process of its own."""
    query = (
        "import ray, sys\n"
        "from ray.experimental import internal_kv\n"
        "from ray.util import list_named_actors\n"
        f"ray.init(address={address!r}, namespace={raycluster.namespace(NAME)!r}, logging_level='ERROR')\n"
        "names = [n for n in list_named_actors() if n.startswith('nodehost-')]\n"
        f"kept = internal_kv._internal_kv_list(b'membership/', namespace={KV_NAMESPACE!r})\n"
        "print(' '.join(names + [k.decode() for k in kept]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", query], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_down_takes_the_nodehosts_out_of_a_ray_cluster_it_joined(short_tmp_path: Path) -> None:
    users_ray = short_tmp_path / "users-ray"
    users_ray.mkdir()
    record, address = raycluster.start_head(users_ray, users_ray / "ray.log")
    env = {**os.environ, **raycluster.auth_env(users_ray), **raycluster.LOOPBACK_ENV}
    fleet_file = short_tmp_path / "fleet.yaml"
    fleet_file.write_text(f"ray: {{address: '{address}'}}\npools: [{{name: nr, count: 1, profile: tiny}}]\n")
    where = ["--name", NAME, "--state-dir", str(short_tmp_path / "state")]
    base = [sys.executable, "-m", "testbed.cli"]
    try:
        tokenless = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
        command = [*base, "up", "--fleet", str(fleet_file), *where]
        refused = subprocess.run(command, env=tokenless, capture_output=True, text=True, timeout=600)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
        assert "needs its authentication token" in refused.stderr and "RAY_AUTH_TOKEN" in refused.stderr

        up = subprocess.run(
            [*base, "up", "--fleet", str(fleet_file), *where], env=env, capture_output=True, text=True, timeout=600
        )
        assert up.returncode == 0, up.stderr[-3000:]
        found = _named_actors(address, env)
        assert len(found) == 2 and found[1] == f"membership/{found[0]}", "the fleet's NodeHost runs in the user's Ray"
        status = subprocess.run([*base, "status", *where], env=env, capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stderr[-3000:]
        assert f"Ray at {address}" in status.stdout and "as here" in status.stdout, status.stdout

        down = subprocess.run([*base, "down", *where], env=env, capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, down.stderr[-3000:]
        assert _named_actors(address, env) == [], "no NodeHost nor its memory left in a Ray that outlives ours"
        assert record.alive(), "the user's Ray itself keeps running"
    finally:
        subprocess.run([*base, "down", *where], env=env, capture_output=True, timeout=300)
        raycluster.stop_head(record, users_ray)
