"""Scenario files: phases of Jobs that use DRA claims, as validated YAML.

A phase creates Jobs at a rate (QPS), each Job's pods using one ResourceClaimTemplate.
``devices`` says how many Jobs: a count, or a fraction of the cluster's matching devices
(``fraction: 0.9``), or ``remaining`` (what earlier phases left free). Pods run for
``runSeconds`` and succeed (or fail, with ``exitCode``), or run until the scenario ends
(``runSeconds: null``).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.fields import FieldInfo

from fake_devices.specfiles import SpecFileError, parse_yaml, validate
from testbed import quantity
from testbed.fleet.spec import DEFAULT_NODES_PER_HOST

SHIPPED_DIR = Path(__file__).parent / "shipped"
JOB_BACK_OFF_S = 10.0
"""The Job controller's first wait before it replaces a failed pod; it doubles with each
failure (capped at six minutes)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class ClaimRequest(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    device_class: str = Field(alias="deviceClass")
    selector: str | None = None
    capacity: dict[str, str] = Field(default_factory=dict)
    """How much of each capacity of a shareable device the request takes (``bandwidth:
    40G``): pods then share devices, as on ``shared-nic`` nodes' ports."""

    @field_validator("capacity")
    @classmethod
    def _quantities(cls, capacity: dict[str, str]) -> dict[str, str]:
        for name, amount in capacity.items():
            try:
                quantity.parse(amount)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return capacity


class Phase(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=30)
    jobs: int | None = Field(default=None, ge=0)
    fraction: float | None = Field(default=None, gt=0, le=1)
    remaining: bool = False
    qps: float = Field(default=10.0, gt=0, le=1000)
    completions: int = Field(default=1, ge=1)
    parallelism: int = Field(default=1, ge=1)
    run_seconds: float | None = Field(default=None, alias="runSeconds", ge=0)
    exit_code: int = Field(default=0, alias="exitCode", ge=0, le=255)
    """The status each pod's container exits with after ``runSeconds``: non-zero fails the
    pod, its claim is released, and its Job makes another (up to ``backoffLimit``, after
    the Job controller's back-off of 10 s, doubling), each with a claim of its own."""
    backoff_limit: int = Field(default=0, alias="backoffLimit", ge=0, le=6)
    requests: list[ClaimRequest] = Field(
        default_factory=lambda: [ClaimRequest(name="gpu", deviceClass="gpu.dra-testbed.io")],
    )
    """Empty: pods with no claims, the baseline that shows what DRA adds."""
    constraints: list[dict[str, Any]] = Field(default_factory=list)
    request_as: Literal["claim", "extended-resource"] = Field(default="claim", alias="requestAs")
    """``extended-resource``: each pod asks for its requests' DeviceClasses as extended
    resources (``deviceclass.resource.kubernetes.io/<class>: N``, as a pod written for a
    device plugin asks), and the scheduler makes the claim; no selectors or constraints."""
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    """Node labels its pods must land on, as a pod's nodeSelector: e.g.
    ``{dra-testbed.io/kubelet: real}`` for the real-kubelet nodes only, the reference."""
    wait: Literal["running", "complete", "none"] = "running"
    """What the phase waits for before the next one: its pods Running, its Jobs done, or nothing."""
    timeout_seconds: float = Field(default=600, alias="timeoutSeconds", gt=0)
    stall_seconds: float = Field(default=30, alias="stallSeconds", gt=0)
    """End the phase (counting what never ran) after this long without progress."""

    @model_validator(mode="after")
    def _one_size(self) -> Phase:
        given = [x for x in (self.jobs is not None, self.fraction is not None, self.remaining) if x]
        if len(given) != 1:
            raise ValueError("give exactly one of jobs, fraction or remaining")
        if not self.requests and self.jobs is None:
            raise ValueError("a phase without requests has no devices to take a fraction of; give jobs")
        if self.request_as == "extended-resource" and (
            self.constraints or any(r.selector or r.capacity for r in self.requests)
        ):
            raise ValueError(
                "an extended resource carries no selector, capacity or constraint; use requestAs: claim, or drop them"
            )
        if self.jobs is None and any(r.capacity for r in self.requests):
            raise ValueError(
                "a request for capacity may put several pods on one device, so a fraction of the devices "
                "says nothing of how many pods fit; give jobs"
            )
        if self.exit_code and self.run_seconds is None:
            raise ValueError("exitCode needs runSeconds: a pod that runs until the scenario ends never exits")
        if self.exit_code and self.parallelism != 1:
            raise ValueError(
                "a phase whose pods fail (exitCode) runs one pod per Job at a time, so that each Job "
                "makes backoffLimit + 1 pods; set parallelism: 1"
            )
        return self

    @property
    def pods_per_job(self) -> int:
        """The pods of a Job the phase waits for: those that run at once (wait: running),
        else every pod it makes: its completions, or for pods that fail each try
        (backoffLimit + 1)."""
        if self.wait == "running":
            return self.parallelism
        return self.backoff_limit + 1 if self.exit_code else self.completions

    @property
    def retry_back_off_s(self) -> float:
        """The Job controller's longest wait before it makes a failed pod's successor (10 s,
        doubling with each failure): a phase shows no progress meanwhile."""
        return JOB_BACK_OFF_S * 2 ** (self.backoff_limit - 1) if self.exit_code and self.backoff_limit else 0.0


class Fault(_Strict):
    """A fault the run injects at a moment, on the nodes a pattern names: one of their
    hardware, a rollout of a command-line driver (the seamless-upgrade practice, tried
    while the phases' pods come and go), an admin's DeviceTaintRule taking a device
    out of service (``taint-rule``: one per node's pool whose slices have the device), or
    their kubelets restarted in place (``restart-kubelet``: an upgrade, a crash; the
    drivers must publish their slices again and keep their claims)."""

    at_seconds: float = Field(alias="atSeconds", ge=0)
    """Seconds after the run starts, or after ``afterRunning``'s moment."""
    after_running: str | None = Field(default=None, alias="afterRunning")
    """A phase's name: the fault comes ``atSeconds`` after every pod that phase's Jobs run
    at once is running, wherever that lands in time (a loaded machine starts pods late),
    so that it meets the pods it is meant for; a phase that ends first leaves it out,
    reported."""
    nodes: str = "*"
    """A shell-style pattern over node names, e.g. node-00*."""
    action: Literal[
        "unhealthy",
        "healthy",
        "lost",
        "fail-prepare",
        "latency",
        "fail-attach",
        "hang-attach",
        "rollout",
        "taint-rule",
        "restart-kubelet",
    ]
    device: str | None = None
    """For unhealthy, healthy, lost and taint-rule."""
    count: int | None = Field(default=None, ge=0)
    """For fail-prepare: how many prepares fail; fail-attach, hang-attach: how many attaches
    of devices behind a fabric."""
    latency_ms: float | None = Field(default=None, alias="latencyMs", ge=0)
    """For latency: added to every prepare."""
    driver: str | None = None
    """For rollout: the command-line driver rolled out anew (its same command) on every
    node that runs it, as `testbed rollout`."""
    max_surge: int | None = Field(default=None, alias="maxSurge", ge=1)
    max_unavailable: int | None = Field(default=None, alias="maxUnavailable", ge=1)
    """For rollout, one of them: nodes at a time, the new instance beside the old
    (maxSurge, the default: 1) or the old one stopped first (maxUnavailable)."""
    message: str = ""
    fatal: bool = False
    """For unhealthy: the device cannot serve even the work it has; built-in drivers taint
    it NoExecute, and the controller-manager evicts the pods whose claims do not tolerate
    that (their Jobs make new ones)."""
    effect: Literal["NoSchedule", "NoExecute"] | None = None
    """For taint-rule: the taint's effect (default NoExecute: its pods are evicted;
    NoSchedule only keeps new claims off the device)."""

    @model_validator(mode="after")
    def _what_the_action_needs(self) -> Fault:
        counted = ("count", self.count)
        needs = {
            "fail-prepare": counted,
            "fail-attach": counted,
            "hang-attach": counted,
            "latency": ("latencyMs", self.latency_ms),
            "rollout": ("driver", self.driver),
        }
        field, value = needs.get(self.action, ("device", self.device))
        if value is None and self.action != "restart-kubelet":
            raise ValueError(f"action {self.action} needs {field}")
        if self.fatal and self.action != "unhealthy":
            raise ValueError(f"fatal is for action unhealthy, not {self.action}")
        if self.effect and self.action != "taint-rule":
            raise ValueError(f"effect is for action taint-rule, not {self.action}")
        if self.action == "rollout":
            if self.nodes != "*":
                raise ValueError("a rollout covers every node that runs the driver: leave nodes out")
            if self.max_surge and self.max_unavailable:
                raise ValueError("rollout: give maxSurge or maxUnavailable, not both")
        return self

    @property
    def rollout_batch(self) -> tuple[int, int]:
        """(maxSurge, maxUnavailable) of a rollout, one of them 0."""
        return (0, self.max_unavailable) if self.max_unavailable else (self.max_surge or 1, 0)

    @property
    def target(self) -> str:
        """What `testbed fault` takes after the action (a rollout: its driver)."""
        if self.action in ("fail-prepare", "fail-attach", "hang-attach"):
            return str(self.count)
        if self.action == "latency":
            return f"{self.latency_ms:g}"
        if self.action == "rollout":
            return str(self.driver)
        if self.action == "restart-kubelet":
            return ""
        return str(self.device)


def faults_to_undo(injected: list[Fault]) -> list[Fault]:
    """What puts the nodes' hardware back as a run found them: for each fault it left in
    force (a later one of the same kind on the same nodes may have undone it already),
    its opposite, in the order they came. A lost device stays lost, a rollout or a
    kubelet's restart done; a taint-rule's DeviceTaintRules are the runner's to delete."""
    last: dict[tuple[str, str, str], Fault] = {}
    for fault in injected:
        if fault.action not in ("lost", "rollout", "taint-rule", "restart-kubelet"):
            kind = "health" if fault.action in ("healthy", "unhealthy") else fault.action
            last[(fault.nodes, kind, fault.device or "")] = fault
    undo = []
    for fault in last.values():
        if fault.action == "unhealthy":
            undo.append(fault.model_copy(update={"action": "healthy", "fatal": False, "message": ""}))
        elif fault.action == "latency" and fault.latency_ms:
            undo.append(fault.model_copy(update={"latency_ms": 0.0}))
        elif fault.action in ("fail-prepare", "fail-attach", "hang-attach") and fault.count:
            undo.append(fault.model_copy(update={"count": 0}))
    return undo


class Cluster(_Strict):
    """What `testbed run` starts when no cluster of that name is running."""

    nodes: int = Field(default=4, ge=0)
    profile: str = "gpu8"
    nodes_per_host: int = Field(default=DEFAULT_NODES_PER_HOST, alias="nodesPerHost", ge=1)
    kcm_qps: float = Field(default=75, alias="kcmQPS", gt=0)
    kcm_burst: int = Field(default=150, alias="kcmBurst", ge=1)
    scheduler_qps: float = Field(default=100, alias="schedulerQPS", gt=0)
    scheduler_burst: int = Field(default=200, alias="schedulerBurst", ge=1)
    percentage_of_nodes_to_score: int | None = Field(default=None, alias="percentageOfNodesToScore", ge=0, le=100)
    """The scheduler's share of feasible nodes to score (None: its adaptive default)."""
    scheduler_parallelism: int | None = Field(default=None, alias="schedulerParallelism", ge=1, le=1024)
    binding_timeout_s: int | None = Field(default=None, alias="bindingTimeoutSeconds", ge=1)
    """How long the scheduler waits for devices' binding conditions (None: its 600 s)."""
    devices_per_slice: int | None = Field(default=None, alias="devicesPerSlice", ge=1, le=128)
    """The drivers' slice layout: at most this many devices per ResourceSlice."""


class Scenario(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    description: str = ""
    cluster: Cluster = Field(default_factory=Cluster)
    slo_p99_seconds: float = Field(default=5.0, alias="sloP99Seconds", gt=0)
    phases: list[Phase] = Field(min_length=1)
    faults: list[Fault] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_that_lead_somewhere(self) -> Scenario:
        names = [phase.name for phase in self.phases]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(
                f"phases: more than one phase is named {', '.join(twice)}; give each its own name "
                "(its Jobs and pods are named after it)"
            )
        for i, fault in enumerate(self.faults):
            if fault.after_running is not None and fault.after_running not in names:
                raise ValueError(
                    f"faults[{i}].afterRunning: no phase is named {fault.after_running!r}; "
                    f"name one of {', '.join(names)}"
                )
        return self


class ScenarioError(SpecFileError):
    pass


class ScenarioNotFound(ScenarioError):
    """Neither a shipped scenario's name nor an existing file."""


def _field(model: type[BaseModel] | None, key: str) -> FieldInfo | None:
    """The field a file's key names (by alias or name)."""
    for name, field in (model.model_fields if model is not None else {}).items():
        if key in (name, field.alias):
            return field
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, directly, in a list or as an option."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for arg in typing.get_args(annotation) if (m := _model_in(arg)) is not None), None)


def _as_written(default: Any) -> Any:
    """A default as a file would spell it."""
    if isinstance(default, BaseModel):
        return default.model_dump(by_alias=True, exclude_none=True)
    if isinstance(default, list):
        return [_as_written(item) for item in default]
    return default


def shipped() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def load(name_or_path: str, overrides: dict[str, Any] | None = None) -> Scenario:
    """A shipped scenario by name or a YAML file by path; ``overrides`` are dotted keys
    (``cluster.nodes``, ``phases.0.qps``) applied before validation."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SHIPPED_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ScenarioNotFound(f"no scenario named {name_or_path!r}; shipped: {', '.join(shipped())}")
    elif not path.exists():
        raise ScenarioNotFound(f"scenario file {path} does not exist; shipped scenarios: {', '.join(shipped())}")
    try:
        data = parse_yaml(path.read_text(), str(path))
    except SpecFileError as exc:
        raise ScenarioError(str(exc)) from None
    for key, value in (overrides or {}).items():
        _set(data, key, value, str(path))
    return validate(Scenario, data, "scenario", str(path), ScenarioError)


def _set(data: Any, dotted: str, value: Any, source: str) -> None:
    """One override; a key that does not lead anywhere is an error naming where it stops.
    A key the file leaves out holds its default, so that ``phases.0.requests.0.deviceClass``
    reaches into a phase's default requests. The index just past a list's end adds an
    entry (``faults.0.action=...`` on a scenario without faults), which the overrides
    after it fill in and validation then checks whole."""
    parts = dotted.split(".")
    target = data
    model: type[BaseModel] | None = Scenario
    for depth, part in enumerate(parts):
        where = ".".join(parts[: depth + 1])
        last = depth == len(parts) - 1
        if isinstance(target, list):
            if not part.isdigit() or int(part) > len(target):
                raise ScenarioError(
                    f"--set {dotted}: {where!r} needs an index up to {len(target)} "
                    f"({'.'.join(parts[:depth]) or 'the top'} has {len(target)} entries; "
                    f"{len(target)} adds one)"
                )
            if int(part) == len(target):
                target.append({})
            if last:
                target[int(part)] = value
            else:
                target = target[int(part)]
        elif isinstance(target, dict):
            field = _field(model, part)
            if last:
                target[part] = value
                continue
            if part not in target and field is not None and not field.is_required():
                target[part] = _as_written(field.get_default(call_default_factory=True))
            target = target.setdefault(part, {})
            model = _model_in(field.annotation) if field is not None else None
        else:
            raise ScenarioError(
                f"{source}: --set {dotted}: {'.'.join(parts[:depth])} is a value, not a mapping or list"
            )
