"""What a kubelet tells about a container as it starts and stops it, decided without I/O.

`kubectl describe pod` on a real node reads, per container: the image pulled (Pulling,
then Pulled "Successfully pulled image ... in 3ms") or found ("already present on
machine"), Created, Started, and Killing ("Stopping container main") when the pod is
deleted. Those Events are what users and tools look for; a fake node that showed only
the scheduler's looked broken. No runtime runs here, so the node keeps the images its
pods asked for (``ImageStore``) and a pull takes no time.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from testbed.kubeapi import Obj

log = logging.getLogger(__name__)

IMAGE_SIZE_BYTES = 64 << 20
"""The size every pulled image reports (a real runtime's is the image's)."""
MAX_IMAGES_IN_STATUS = 50
"""The kubelet's nodeStatusMaxImages."""
TAGGED = re.compile(r"(@|:[\w][\w.-]*$)")
"""An image reference with a digest, or a tag after its last ``/``."""


@dataclass(frozen=True)
class Told:
    """One Event about a container: its type, reason and message."""

    kind: str
    reason: str
    message: str


class ImageStore:
    """The images on this node, as its container runtime would keep them: across the
    kubelet's restarts (``path``, when given), so a restarted kubelet finds them present.
    ``on_change`` hears of each image added (the Node's status lists them). ``preloaded``:
    images the node was built with (a node image with its driver's baked in)."""

    def __init__(self, path: Path | None = None, preloaded: Iterable[str] = ()):
        self.path = path
        self.on_change: Callable[[], None] | None = None
        self._present: set[str] = {pulled_name(image) for image in preloaded}
        if path is not None and path.exists():
            try:
                self._present |= set(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("image list %s unreadable (%s): the images pulled before are forgotten", path, exc)

    def __contains__(self, image: str) -> bool:
        return pulled_name(image) in self._present

    def names(self) -> list[str]:
        return sorted(self._present)

    def node_status(self) -> list[Obj]:
        """``status.images`` as the kubelet reports them: each by the name it was pulled
        under (``:latest`` added when untagged, as the kubelet pulls it), with its size."""
        names = self.names()[:MAX_IMAGES_IN_STATUS]
        return [{"names": [name], "sizeBytes": IMAGE_SIZE_BYTES} for name in names]

    def ensure(self, container: Obj) -> list[Told]:
        """What the kubelet's image manager records before the container is created,
        per the pull policy the API server set on it (Always for ``:latest``). An image
        never to be pulled is taken to be on the node (preloaded): the kubelet would
        refuse the container if it were not (ErrImageNeverPull)."""
        image, policy = container.get("image", ""), container.get("imagePullPolicy", "IfNotPresent")
        if policy == "Never" or (policy != "Always" and image in self):
            message = f"Container image {json.dumps(image)} already present on machine and can be accessed by the pod"
            return [Told("Normal", "Pulled", message)]
        started = time.monotonic()
        self._add(image)
        took = go_milliseconds(time.monotonic() - started)
        return [
            Told("Normal", "Pulling", f"Pulling image {json.dumps(image)}"),
            Told(
                "Normal",
                "Pulled",
                f"Successfully pulled image {json.dumps(image)} in {took} ({took} including waiting). "
                f"Image size: {IMAGE_SIZE_BYTES} bytes.",
            ),
        ]

    def _add(self, image: str) -> None:
        if image in self:
            return
        self._present.add(pulled_name(image))
        if self.on_change is not None:
            self.on_change()
        if self.path is not None:
            try:
                self.path.write_text(json.dumps(sorted(self._present)))
            except OSError as exc:
                log.warning("could not keep the image list in %s: %s", self.path, exc)


def pulled_name(image: str) -> str:
    """The reference the kubelet asks the runtime for: ``:latest`` if none is given."""
    return image if TAGGED.search(image.rsplit("/", 1)[-1]) else f"{image}:latest"


def started(images: ImageStore, container: Obj) -> list[Told]:
    """The Events of one container start: its image, then Created and Started."""
    return [*images.ensure(container), CREATED, STARTED]


CREATED = Told("Normal", "Created", "Container created")
STARTED = Told("Normal", "Started", "Container started")


def stopping(container: Obj) -> Told:
    return Told("Normal", "Killing", f"Stopping container {container['name']}")


def removed_in_place(container: Obj) -> Told:
    """A running container killed to restart its pod in place (a RestartAllContainers
    rule fired): the kubelet's word for it is its kill message, lower case."""
    return Told("Normal", "Killing", "killing")


def field_path(pod: Obj, name: str) -> str:
    """Where the container is in the pod's spec, as the kubelet's container reference
    names it: ``spec.containers{main}``, ``spec.initContainers{setup}``,
    ``spec.ephemeralContainers{debugger}``."""
    spec = pod["spec"]
    if any(c["name"] == name for c in spec.get("containers", [])):
        return f"spec.containers{{{name}}}"
    if any(c["name"] == name for c in spec.get("initContainers", [])):
        return f"spec.initContainers{{{name}}}"
    if any(c["name"] == name for c in spec.get("ephemeralContainers", [])):
        return f"spec.ephemeralContainers{{{name}}}"
    return f"implicitly required container {name}"


def go_milliseconds(seconds: float) -> str:
    """A duration truncated to milliseconds as Go prints it: 0s, 3ms, 1.5s, 2m3.004s."""
    ms = int(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms" if ms else "0s"
    minutes, rest_ms = divmod(ms, 60_000)
    secs = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
