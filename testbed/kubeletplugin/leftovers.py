"""What prepared state nodes still hold for some claims: checkpoint entries and CDI specs.

The leak check of a run: after its pods are gone, none of its claims may be left in a
driver's checkpoint or as a CDI spec file on any node.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path


def prepared_state(
    node_roots: list[Path], namespace: str | None = None, claim_uids: set[str] | None = None
) -> dict[str, int]:
    """Checkpoint entries and CDI specs of the claims of ``namespace`` or ``claim_uids``
    (a user's own pods on the same nodes are not counted) under these node directories;
    with neither given, of every claim."""
    everything = namespace is None and claim_uids is None
    uids = set(claim_uids or ())
    entries = 0
    for root in node_roots:
        for checkpoint in root.glob("kubelet/plugins/*/checkpoint.json"):
            with contextlib.suppress(OSError, ValueError):
                for uid, entry in json.loads(checkpoint.read_text()).get("claims", {}).items():
                    if everything or uid in uids or entry.get("namespace") == namespace:
                        uids.add(uid)
                        entries += 1
    # CDI spec files are named <driver>-<claim UID>.json
    specs = sum(1 for root in node_roots for spec in root.glob("cdi/*.json") if everything or spec.stem[-36:] in uids)
    return {"checkpoint_entries": entries, "cdi_specs": specs}
