"""What the fake kubelet knows of one pod bound to its node, and how far it took it: the
state a kubelet's pod worker keeps, in one object that is forgotten with the pod
(pods.py keeps one per pod UID)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from testbed.kubeapi import Obj
from testbed.kubelet import admission, podstatus


@dataclass
class PodState:
    pod: Obj
    """The pod as last seen, ``_deleted`` set once the API said it is gone."""
    changes: int = 0
    """How often the pod changed beyond its status, was deleted or passed its deadline."""
    updated: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at each such change: wakes its worker (``PodManager._pause``)."""

    admitted: bool = False
    """Taken by this kubelet (admission.py): counted while it admits another pod."""
    rejected: bool = False
    """Refused: never started (or stopped, if it ran through a restart), Failed until deleted."""
    verdict: admission.Refusal | None = None
    """Worked out with the pods that came in together, until its worker takes it."""
    past_deadline: bool = False
    """Past its activeDeadlineSeconds: its worker stops it (``ending``)."""
    deadline_timer: asyncio.TimerHandle | None = None

    running_since: str = ""
    """When its containers started (RFC 3339); "" while they do not run."""
    shown_pending: bool = False
    """Shown Pending with its containers waiting (``PodManager._set_waiting``)..."""
    refused: dict[str, tuple[str, str]] | None = None
    """... and, once its sandbox exists, the containers not started, with the reason and
    message they wait for (None: no sandbox yet, all ContainerCreating)."""
    inits: podstatus.InitRun | None = None
    """How far its init containers got, once they started."""
    initializing: bool = False
    """Its init containers run now."""
    restarted: dict[str, podstatus.Restarted] = field(default_factory=dict)
    """By container name: containers that exited, and were or are to be started again."""
    started_early: dict[str, podstatus.Restarted] = field(default_factory=dict)
    """By container name: containers started while others of the pod wait for their
    image, as they are; the pod does not run yet."""
    probing: dict[str, str] = field(default_factory=dict)
    """By container name: what a container's probes have yet to pass (probes.py)."""
    ephemeral: dict[str, Obj] = field(default_factory=dict)
    """By name: the state of each ephemeral container started (``kubectl debug``)."""
    ran_images: dict[str, str] = field(default_factory=dict)
    """By container name: the image each container was last made with (the spec's may
    have changed since)."""
    generation_sync: bool | None = None
    """A sync of its spec change runs (False), and another was asked for meanwhile (True)."""
    resources_status: list[list[Obj] | None] | None = None
    """Each container's allocatedResourcesStatus last written, to write only changes."""

    def changed(self) -> None:
        """A change its worker must see: counted, and the worker woken."""
        self.changes += 1
        self.updated.set()

    def deleting(self) -> bool:
        return bool(self.pod.get("_deleted") or self.pod["metadata"].get("deletionTimestamp"))

    def ending(self) -> bool:
        """Being deleted, or past its active deadline: its worker stops what it does."""
        return self.past_deadline or self.deleting()

    def init_run(self) -> podstatus.InitRun:
        """How far its init containers got; only asked once they started."""
        if self.inits is None:
            raise LookupError(f"pod {self.pod['metadata'].get('uid')}: its init containers have not started")
        return self.inits

    def forget_deadline(self) -> None:
        if self.deadline_timer is not None:
            self.deadline_timer.cancel()
            self.deadline_timer = None
