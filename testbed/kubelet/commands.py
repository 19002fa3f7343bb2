"""What a container's command says it does, for a kubelet that runs no process: how long
it runs (``sleep N``) and how it exits (``exit N``), through ``sh -c`` too.

The reference node's runtime (``testbed-cri``) reads commands by the same rules, so a pod
runs alike on a fake and a real kubelet: ``sleep 5`` ends after 5 s with status 0, ``sh
-c "sleep 2; exit 3"`` after 2 s with status 3, ``exit 1`` at once with 1; ``sleep
infinity``, or a command that neither sleeps nor exits, runs until stopped.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from testbed.keys import RUN_SECONDS_ANNOTATION
from testbed.kubeapi import Obj

_SEPARATORS = re.compile(r"[\s;]+")


@dataclass(frozen=True)
class Ending:
    """How a container's command ends: after ``seconds``, with ``exit_code``."""

    seconds: float
    exit_code: int


def _words(container: Obj) -> list[str]:
    text = " ".join([*(container.get("command") or []), *(container.get("args") or [])])
    return [word for word in (w.strip("\"'") for w in _SEPARATORS.split(text)) if word]


def _sleep(words: list[str]) -> float | None:
    """The first ``sleep``'s seconds: inf for ``sleep infinity``; None without a sleep
    that says how long (``sleep -1``, ``sleep 5m``: not read)."""
    for word, after in itertools.pairwise(words):
        if word == "sleep" or word.endswith("/sleep"):
            try:
                seconds = float(after)
            except ValueError:
                return None
            return seconds if seconds >= 0 else None  # NaN compares False: None too
    return None


def _exit(words: list[str]) -> int | None:
    """The first ``exit N``'s status, as a shell takes it (mod 256)."""
    for word, after in itertools.pairwise(words):
        if word == "exit" and after.isascii() and after.isdigit():
            return int(after) % 256
    return None


def ending(container: Obj) -> Ending | None:
    """How the container's command ends: after its ``sleep N`` (at once without one),
    with its ``exit N``'s status (0 without one); None if it runs until stopped."""
    words = _words(container)
    seconds, code = _sleep(words), _exit(words)
    if seconds is not None and math.isinf(seconds):
        return None
    if seconds is None and code is None:
        return None
    return Ending(seconds or 0.0, code or 0)


def exits_at_once(pod: Obj, container: Obj) -> bool:
    """Whether the container's command ends as it starts (``exit 1``, ``sh -c "exit 0"``):
    gone before the kubelet's next relist could see it running.
    Not for a pod whose run-seconds annotation says how long its containers run."""
    if RUN_SECONDS_ANNOTATION in pod["metadata"].get("annotations", {}):
        return False
    ended = ending(container)
    return ended is not None and ended.seconds == 0


def exit_code(container: Obj) -> int:
    """The status the container's command ends with (0 if it never ends of itself)."""
    ended = ending(container)
    return 0 if ended is None else ended.exit_code


def run_seconds(pod: Obj) -> float | None:
    """How long the pod's containers run before the pod ends (Succeeded, or Failed when
    one exits non-zero); None if it runs until deleted: when a container never ends, or
    is started again when it does (``should_restart``)."""
    annotation = pod["metadata"].get("annotations", {}).get(RUN_SECONDS_ANNOTATION)
    if annotation is not None:
        try:
            return max(0.0, float(annotation))
        except ValueError:
            return None
    containers = pod["spec"].get("containers", [])
    endings = [e for c in containers if (e := ending(c)) is not None]
    if not endings or len(endings) < len(containers):
        return None
    if any(should_restart(pod, c, e.exit_code) for c, e in zip(containers, endings, strict=True)):
        return None
    return max(e.seconds for e in endings)


def endings(pod: Obj) -> dict[str, Ending]:
    """How each container of a pod that ends (``run_seconds``) ends, after its own
    command's time, as a runtime ends each: the pod runs on, showing those that ended
    before the last exited, until its last one ends. Empty when the run-seconds
    annotation gives the pod's time (every container ends then)."""
    if run_seconds(pod) is None or RUN_SECONDS_ANNOTATION in pod["metadata"].get("annotations", {}):
        return {}
    return {c["name"]: e for c in pod["spec"].get("containers", []) if (e := ending(c)) is not None}


def restart_seconds(pod: Obj, container: Obj) -> float | None:
    """How long a container of a pod that does not end of itself (``run_seconds`` None)
    runs before it exits, to be started again (``restarts``) or to stay exited; None if
    it runs until the pod is deleted."""
    if run_seconds(pod) is not None:
        return None
    ended = ending(container)
    return None if ended is None else ended.seconds


def restarts(pod: Obj, container: Obj) -> bool:
    """Whether the kubelet starts the container again once its command exited."""
    return should_restart(pod, container, exit_code(container))


def should_restart(pod: Obj, container: Obj, code: int) -> bool:
    """Whether the kubelet starts a container that exited with ``code`` again, as kubelet
    v1.37 decides it (ContainerRestartRules, beta and on): by the first of the
    container's ``restartPolicyRules`` whose exit codes match, if any (Restart, or
    RestartAllContainers: ``restarts_all``); else by its own ``restartPolicy``; else by
    the pod's."""
    action = _rule_action(container, code)
    if action in ("Restart", "RestartAllContainers"):
        return True
    policy = container.get("restartPolicy") or pod["spec"].get("restartPolicy", "Always")
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def restarts_all(container: Obj, code: int) -> bool:
    """Whether a container that exited with ``code`` makes the kubelet restart ALL of its
    pod's containers in place (RestartAllContainersOnContainerExits, beta and on in
    1.37): its first rule that matches says RestartAllContainers."""
    return _rule_action(container, code) == "RestartAllContainers"


def may_restart_all(pod: Obj) -> bool:
    """Whether one of the pod's containers has a RestartAllContainers rule: the kubelet
    then shows the pod's AllContainersRestarting condition, False until one fires."""
    spec = pod["spec"]
    return any(
        rule.get("action") == "RestartAllContainers"
        for c in [*(spec.get("initContainers") or []), *spec.get("containers", [])]
        for rule in c.get("restartPolicyRules") or []
    )


def _rule_action(container: Obj, code: int) -> str | None:
    """The action of the first of the container's rules whose exit codes match ``code``
    (rules count only beside its own restartPolicy); None if none does. An action this
    version does not know leaves the decision to the container's policy, as upstream."""
    if container.get("restartPolicy") is None:
        return None
    for rule in container.get("restartPolicyRules") or []:
        codes = rule.get("exitCodes") or {}
        listed = code in (codes.get("values") or [])
        operator = codes.get("operator")
        if (operator == "In" and listed) or (operator == "NotIn" and not listed):
            return str(rule.get("action"))
    return None


def init_seconds(container: Obj) -> float | None:
    """How long an init container runs: N for ``sleep N``, None (until stopped) for
    ``sleep infinity``, no time at all for any other command (init containers end)."""
    seconds = _sleep(_words(container))
    if seconds is None:
        return 0.0
    return None if math.isinf(seconds) else seconds


def hook_seconds(container: Obj, hook: str) -> float:
    """How long a container's ``postStart`` or ``preStop`` hook takes: its sleep action's
    seconds (the kubelet itself sleeps); 0 for an exec hook (a runtime that runs no
    process answers at once), an HTTP one, or none."""
    action = ((container.get("lifecycle") or {}).get(hook) or {}).get("sleep") or {}
    try:
        return max(0.0, float(action.get("seconds", 0)))
    except (TypeError, ValueError):
        return 0.0


def pre_stop_seconds(running: list[Obj], grace_s: float) -> float:
    """How long stopping these containers takes: the kubelet runs their preStop hooks at
    once, each cut short at the grace period (none runs with a grace of 0), and stops
    each container after its hook (sidecars after the pod's own containers)."""
    if grace_s <= 0:
        return 0.0
    return max((min(hook_seconds(c, "preStop"), grace_s) for c in running), default=0.0)


def grace_seconds(pod: Obj) -> float:
    """The pod's grace period for stopping its containers: the one its deletion set, else
    its spec's (30 s by default)."""
    deleting = pod["metadata"].get("deletionGracePeriodSeconds")
    if deleting is not None:
        return float(deleting)
    spec = pod["spec"].get("terminationGracePeriodSeconds")
    return 30.0 if spec is None else float(spec)
