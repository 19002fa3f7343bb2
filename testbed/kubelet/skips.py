"""Which of a claim's drivers the kubelet does not call (DRAOptionalNodeOperations, alpha
in Kubernetes 1.37).

A ResourceSlice can say that its driver needs no NodePrepareResources or
NodeUnprepareResources call for its devices (``spec.skipNodeOperations``; ``*`` for
both), and the scheduler copies that into each allocation result of those devices. The kubelet skips a call to a driver
for a claim only when every result of that driver in the claim skips it. The API server
drops the field unless the gate is on, as the testbed turns it on for every component
(``TESTBED_ALPHA=1``), so a claim that carries it comes from a cluster where the kubelet
has the gate too.
"""

from __future__ import annotations

from collections import Counter

from testbed.kubeapi import Obj

PREPARE = "NodePrepareResources"
UNPREPARE = "NodeUnprepareResources"
ALL = "*"


def skipped_calls(claim: Obj) -> dict[str, list[str]]:
    """Per driver of the claim's allocation, the calls the kubelet makes none of (sorted;
    drivers whose every call is made are left out)."""
    devices: Counter[str] = Counter()
    skips: dict[str, Counter[str]] = {}
    for result in claim["status"]["allocation"]["devices"]["results"]:
        driver = result["driver"]
        devices[driver] += 1
        operations = set(result.get("skipNodeOperations") or ())
        counted = skips.setdefault(driver, Counter())
        # "*" already stands for every call of this result.
        counted.update({ALL} if ALL in operations else operations)
    skipped: dict[str, list[str]] = {}
    for driver, total in devices.items():
        counted = skips[driver]
        calls = [call for call in (PREPARE, UNPREPARE) if counted[call] + counted[ALL] == total]
        if calls:
            skipped[driver] = calls
    return skipped
