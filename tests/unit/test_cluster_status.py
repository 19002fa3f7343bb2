"""`testbed status`: one gathered status, shown as tables for people and JSON for scripts."""

from __future__ import annotations

import json
from io import StringIO

from rich.console import Console

from testbed import clusterstatus as cs


def _status(**changes: object) -> cs.ClusterStatus:
    fleet = cs.Fleet(
        pools=[cs.Pool("gpu", "gpu8", "fake", ready=2, asked=2), cs.Pool("ref", "tiny", "real", ready=1, asked=1)],
        ray_address="127.0.0.1:6379",
        hosts=[
            cs.NodeHost(
                "nodehost-0",
                nodes=2,
                ready=2,
                pid=11,
                ray_node="a" * 40,
                ray_node_address="127.0.0.1",
                kubelet_restarts=1,
                code="abc",
            ),
            cs.NodeHost("nodehost-1", error="GetTimeoutError"),
        ],
        faults={"gpu-001": ["gpu-1 unhealthy (fatal): XID 79"]},
        fabric={"attached": 3, "failed": 1},
        identities="per-node",
        log_level="info",
    )
    status = cs.ClusterStatus(
        name="lab",
        root="/state/clusters/lab",
        components=[
            cs.Component("etcd", 10, True, True, 0, "", "/logs/etcd.log"),
            cs.Component(
                "kube-apiserver", 12, True, True, 2, "killed by SIGKILL", "/logs/apiserver.log", "line a\nline b"
            ),
        ],
        attached_to="",
        apiserver="https://127.0.0.1:6443",
        kubeconfig="/state/clusters/lab/kubeconfig",
        logs="/state/clusters/lab/logs",
        binaries="/cache/k8s",
        pending_leftovers=["run-1"],
        fleet=fleet,
        process_nodes=[
            cs.ProcessNode("ref-000", {"kubelet": True, "driver": False, "cri": True}, 3, False, "/n/ref-000/logs")
        ],
        external_drivers=[cs.ExternalDriver("gpu.example.com", 3, 2, 1, 4, 1, {1: 1, 2: 2})],
        cut_short="",
        starter_pid=None,
        code="abc",
    )
    for key, value in changes.items():
        setattr(status, key, value)
    return status


def _shown(status: cs.ClusterStatus) -> str:
    buffer = StringIO()
    cs.render(status, Console(file=buffer, width=200, highlight=False, soft_wrap=True))
    return buffer.getvalue()


def test_the_tables_show_every_part_a_person_reads() -> None:
    shown = _shown(_status())
    for expected in (
        "kube-apiserver",
        "killed by SIGKILL",
        "last lines of /logs/apiserver.log:",
        "line b",
        "apiserver: https://127.0.0.1:6443",
        "left behind by runs while the API server was gone, deleted once it answers: run-1",
        "2 / 2",
        "as here",
        "GetTimeoutError",
        "unreachable",
        "gpu-001 │ gpu-1 unhealthy (fatal): XID 79",
        "fabric manager (since it last started): 3 attached, 1 failed",
        "ref-000",
        "gpu.example.com",
        "1 (1 node), 2 (2 nodes)",
        "fleet pools (identities per-node, NodeHosts log at info)",
    ):
        assert expected in shown, f"{expected!r} not in\n{shown}"
    assert "last lines of /logs/etcd.log" not in shown, "a healthy component never restarted shows no log"
    assert "ended before" not in shown


def test_json_holds_the_same_status_and_says_whether_it_is_healthy() -> None:
    status = _status()
    document = json.loads(json.dumps(status.to_json()))
    assert document["healthy"] is True and document["fleet_complete"] is True
    assert document["components"][1]["restarts"] == 2
    assert document["fleet"]["pools"][0] == {
        "name": "gpu",
        "profile": "gpu8",
        "kubelet": "fake",
        "ready": 2,
        "asked": 2,
    }
    assert document["fleet"]["hosts"][1]["error"] == "GetTimeoutError"
    assert (document["fleet"]["identities"], document["fleet"]["log_level"]) == ("per-node", "info")
    assert document["fleet"]["faults"] == {"gpu-001": ["gpu-1 unhealthy (fatal): XID 79"]}
    assert document["external_drivers"][0]["generations"] == {"1": 1, "2": 2}
    assert document["process_nodes"][0]["alive"] == {"kubelet": True, "driver": False, "cri": True}


def test_an_unhealthy_component_or_a_start_cut_short_makes_it_unhealthy() -> None:
    sick = _status()
    sick.components[0].healthy = False
    assert not sick.healthy and sick.to_json()["healthy"] is False
    cut = _status(cut_short="control plane", starter_pid=99)
    assert not cut.healthy
    assert "the `testbed up` that started it (pid 99) ended before its control plane was up" in _shown(cut)


def test_a_fleet_short_of_ready_nodes_or_whose_api_did_not_answer_is_not_complete() -> None:
    short = _status()
    assert short.fleet is not None
    short.fleet.pools[0].ready = 1
    assert short.to_json()["fleet_complete"] is False
    unanswered = _status(fleet=cs.Fleet(api_error="ConnectionRefusedError"))
    assert unanswered.fleet is not None and not unanswered.fleet.complete
    assert "fleet: the API server did not answer (ConnectionRefusedError)" in _shown(unanswered)
