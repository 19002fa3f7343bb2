"""`testbed logs NODE nodehost`: one node's part of a log its NodeHost shares with
hundreds of others."""

from testbed.nodelogs import lines_of_node

LOG = """\
2026-12-01 18:00:00,001 WARNING ray: some host-level line before the nodes start
2026-12-01 18:00:01,000 INFO testbed.kubelet.plugins: node-001: registered DRA plugin gpu.dra-testbed.io
2026-12-01 18:00:01,100 INFO testbed.kubelet.plugins: node-0010: registered DRA plugin gpu.dra-testbed.io
2026-12-01 18:00:02,000 ERROR testbed.kubeletplugin.plugin: gpu.dra-testbed.io on node-001: publishing slices failed
Traceback (most recent call last):
  File "plugin.py", line 1, in publish
ValueError: boom
2026-12-01 18:00:03,000 WARNING testbed.kubelet.pods: node-002: error syncing pod default/p (u), skipping: x
2026-12-01 18:00:04,000 WARNING testbed.kubelet.pods: node-001-000: error syncing pod default/q (v), skipping: y
2026-12-01 18:00:05,000 WARNING testbed.fleet.nodehost: lease renewal slow: 3 s
""".splitlines()


def test_a_nodes_lines_keep_their_tracebacks_and_the_hosts_own_lines_not_the_other_nodes() -> None:
    host = ["node-001", "node-002", "node-0010", "node-001-000"]
    assert lines_of_node(LOG, "node-001", host) == [LOG[0], LOG[1], *LOG[3:7], LOG[9]]
    assert lines_of_node(LOG, "node-002", host) == [LOG[0], LOG[7], LOG[9]]
    assert lines_of_node(LOG, "node-001-000", host) == [LOG[0], LOG[8], LOG[9]], "a name is a whole word"


def test_a_line_naming_a_node_of_another_host_is_the_hosts_own() -> None:
    line = "2026-12-01 18:00:00,000 ERROR x: claim ns/c is allocated on node(s) node-500, not on node-001"
    assert lines_of_node([line], "node-002", ["node-001", "node-002"]) == []
    assert lines_of_node([line], "node-001", ["node-001", "node-002"]) == [line]
    assert lines_of_node([line.replace("node-001", "node-777")], "node-002", ["node-001", "node-002"]) != []
