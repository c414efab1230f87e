"""The cluster description: the ``nodes:`` list of a run config or cluster file.

Shared by the runtime (what each node is and how to emulate it), the planner
and the simulator. Durations end in ``_s``, rates name their unit.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Union

from pydantic import Field, field_validator, model_validator

from geodiloco.common.schema import ConfigError, StrictModel, load_yaml_mapping, validate
from geodiloco.predictor.specs import expand_gpu_counts

class SlowdownEvent(StrictModel):
    """From ``from_round`` (inclusive) until ``until_round`` (exclusive), steps take ``factor`` x longer."""

    from_round: int = Field(ge=0)
    factor: float = Field(gt=0)
    until_round: Optional[int] = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _until_after_from(self) -> "SlowdownEvent":
        if self.until_round is not None and self.until_round <= self.from_round:
            raise ValueError(f"until_round ({self.until_round}) must come after from_round ({self.from_round}); "
                             "the slowdown lasts up to, not including, until_round")
        return self


class EmulateSpec(StrictModel):
    """How a node gets its speed on a machine that lacks its GPUs: one of three sources.

    - ``step_time_s``: a virtual GPU; each real step is padded with sleep up to
      ``step_time_s * (fixed_fraction + (1 - fixed_fraction) * B / batch_size)``
      (``fixed_fraction`` = share of the step that does not grow with the batch;
      ``batch_size`` defaults to the run's ``diloco.batch_size``);
    - ``gpu``: a virtual GPU padded to the predictor's t(B) for ``gpu`` (a GPU name, a list,
      or ``from_gpus`` = the node's gpus) running ``model`` (a preset or dims file; default the
      run's model) at ``seq_len`` (default the run's);
      with ``step_time_s``, ``model`` and ``seq_len`` name the workload that time was measured on
      (the virtual GPU stands for the node's ``gpus`` running it): the planner's prior is then the
      predictor's t(B) for those gpus on that workload, as a real run's would be for the model it trains;
    - ``cpu_share``: real compute; the node's processes run in a cgroup limited to that
      share of one CPU core (root needed), so a step takes whatever the real model takes.

    ``time_scale`` multiplies every padded target. ``slowdown`` events divide a
    ``cpu_share`` node's quota by their factor (a co-tenant arriving) and multiply a
    virtual GPU's target. ``jitter`` is the relative std of a virtual GPU's step time.
    The rule itself lives in :mod:`balancer.step_time`.
    """

    step_time_s: Optional[float] = Field(default=None, gt=0)
    batch_size: Optional[int] = Field(default=None, ge=1)
    fixed_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    gpu: Optional[Union[str, list[str]]] = None
    model: Optional[str] = None
    seq_len: Optional[int] = Field(default=None, ge=1)
    cpu_share: Optional[float] = Field(default=None, gt=0.0, le=64.0)
    cpu_period_ms: float = Field(default=20.0, ge=1.0, le=1000.0)
    time_scale: float = Field(default=1.0, gt=0)
    jitter: float = Field(default=0.0, ge=0.0, lt=1.0)
    slowdown: list[SlowdownEvent] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_source(self) -> "EmulateSpec":
        sources = [name for name, value in (("step_time_s", self.step_time_s), ("gpu", self.gpu),
                                             ("cpu_share", self.cpu_share)) if value is not None]
        if len(sources) != 1:
            given = ", ".join(f"emulate.{name}" for name in sources) or "none"
            raise ValueError("give exactly one of emulate.step_time_s (seconds per step), emulate.gpu (a GPU name, "
                             f"a list, or 'from_gpus') or emulate.cpu_share (cores, e.g. 0.35); given: {given}")
        if self.cpu_share is not None and (self.model is not None or self.seq_len is not None):
            raise ValueError("emulate.model and emulate.seq_len name the workload a virtual GPU stands for (with "
                             "emulate.gpu or emulate.step_time_s); a cpu_share node trains the run's model: remove them")
        if self.cpu_share is not None and (self.jitter or self.time_scale != 1.0 or self.batch_size
                                           or self.fixed_fraction):
            raise ValueError("emulate.cpu_share runs real compute: jitter, time_scale, batch_size and fixed_fraction "
                             "do not apply (its noise and t(B) are the real ones); remove them")
        return self

    @property
    def real_compute(self) -> bool:
        """True when the node's steps are real work under a CPU quota, not padded to a target."""
        return self.cpu_share is not None

    def gpu_names(self, node_gpus: list[str]) -> list[str]:
        """The GPUs whose time is emulated (``from_gpus`` = the node's own)."""
        if self.gpu == "from_gpus":
            return list(node_gpus)
        return [self.gpu] if isinstance(self.gpu, str) else list(self.gpu or [])

    def slowdown_factor(self, round_idx: int) -> float:
        """Product of the slowdown factors active in ``round_idx``."""
        factor = 1.0
        for event in self.slowdown:
            if round_idx >= event.from_round and (event.until_round is None or round_idx < event.until_round):
                factor *= event.factor
        return factor


class WanSpec(StrictModel):
    """A node's link to the others: ``bandwidth_mbps`` (Mbit/s, both ways) and one-way ``latency_ms``."""

    bandwidth_mbps: float = Field(gt=0)
    latency_ms: float = Field(default=0.0, ge=0)


class MeasuredPoint(StrictModel):
    """One measured point of a node's t(B): ``step_time_s`` seconds per step at ``batch_size``."""

    batch_size: int = Field(ge=1)
    step_time_s: float = Field(gt=0)


class MeasuredSpec(StrictModel):
    """Ground-truth step time for the simulator, from a different code path than the planner's prior.

    Either ``points`` (a measured t(B) curve, piecewise linear, so it can have a knee the
    predictor lacks), or seconds per step at ``batch_size`` (or a ``trace_s`` of steps)
    scaled to other batch sizes by ``fixed_fraction`` (share of the step that does not grow
    with the batch) when given, else by the shape of the predictor's t(B) for the node's
    GPUs. A trace is summarized by its mean and its relative spread (per-step noise).
    """

    batch_size: Optional[int] = Field(default=None, ge=1)
    step_time_s: Optional[float] = Field(default=None, gt=0)
    trace_s: Optional[list[float]] = None
    fixed_fraction: Optional[float] = Field(default=None, ge=0.0, lt=1.0)
    points: list[MeasuredPoint] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _point_fields_from_curve(cls, data):
        """With ``points``, ``batch_size``/``step_time_s`` (the reference point) are the first point."""
        if isinstance(data, dict) and data.get("points"):
            if any(data.get(key) is not None for key in ("batch_size", "step_time_s", "trace_s", "fixed_fraction")):
                raise ValueError("measured.points is a whole t(B) curve: drop measured.batch_size, step_time_s, "
                                 "trace_s and fixed_fraction, or drop points")
            first = data["points"][0]
            if isinstance(first, dict):
                data = dict(data, batch_size=first.get("batch_size"), step_time_s=first.get("step_time_s"))
        return data

    @model_validator(mode="after")
    def _has_time(self) -> "MeasuredSpec":
        if self.points:
            batches = [point.batch_size for point in self.points]
            if len(set(batches)) != len(batches):
                raise ValueError(f"measured.points: each batch_size once; got {batches}")
            return self
        if self.batch_size is None:
            raise ValueError("give measured.batch_size (the batch the time was measured at), or measured.points")
        if self.step_time_s is None and not self.trace_s:
            raise ValueError("give measured.step_time_s, a non-empty measured.trace_s, or measured.points")
        if self.step_time_s is None:
            self.step_time_s = sum(self.trace_s) / len(self.trace_s)
        return self


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_safe_name(value: str, what: str) -> str:
    """Names become file and directory names (``node_<name>.safetensors``, ``runs/<name>``): letters, digits,
    ``_ . -``, starting with a letter or digit, at most 64 characters, so none leaves its folder."""
    if not SAFE_NAME.fullmatch(value):
        raise ValueError(f"{what} {value!r} may only hold ASCII letters, digits, '_', '.' and '-', start with a letter "
                         "or digit and be at most 64 characters (it names files and folders); rename it, "
                         "e.g. 'node1' or 'seoul-a30'")
    return value


class NodeSpec(StrictModel):
    """One site's machine: a name, its GPUs, and optionally its emulation, WAN and measurements."""

    name: str = Field(min_length=1)
    site: Optional[str] = None
    gpus: list[str] = Field(default_factory=list)
    emulate: Optional[EmulateSpec] = None
    wan: Optional[WanSpec] = None
    measured: Optional[MeasuredSpec] = None
    local_steps: Optional[int] = Field(default=None, ge=1)
    batch_size: Optional[int] = Field(default=None, ge=1)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return check_safe_name(value, "node name")

    @field_validator("gpus", mode="before")
    @classmethod
    def _expand_counts(cls, value):
        """Accept ``"4 x A30"`` as shorthand for four ``"A30"`` entries."""
        if isinstance(value, dict):
            listed = ", ".join(f'"{count} x {name}"' for name, count in value.items())
            raise ValueError(f"a list of GPU names, not a mapping; write [{listed}]")
        return expand_gpu_counts([value] if isinstance(value, str) else list(value or []))

    @model_validator(mode="after")
    def _workload_needs_gpus(self) -> "NodeSpec":
        emulate = self.emulate
        if (emulate is not None and emulate.step_time_s is not None and not self.gpus
                and (emulate.model is not None or emulate.seq_len is not None)):
            raise ValueError("emulate.model and emulate.seq_len beside emulate.step_time_s name the workload the "
                             "node's gpus ran at that time (the planner predicts those gpus on it); list the node's "
                             "gpus, or remove them")
        return self

    @model_validator(mode="after")
    def _default_site(self) -> "NodeSpec":
        if self.site is None:
            self.site = self.name
        return self

    @property
    def num_gpus(self) -> int:
        return max(1, len(self.gpus))

    @property
    def ranks(self) -> int:
        """Processes the node trains with: one per GPU (torchrun --nproc-per-node), each taking at least one
        sample of a step (runtime/batching.py); an emulated node runs as one process."""
        return 1 if self.emulate is not None else self.num_gpus


class ClusterSpec(StrictModel):
    gpu_files: list[str] = Field(default_factory=list)
    nodes: list[NodeSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> "ClusterSpec":
        load_gpu_files(self.gpu_files, "gpu_files")
        check_unique_names(self.nodes)
        return self


def load_gpu_files(paths: list[str], field: str) -> None:
    """Add the GPU rows of ``paths`` to the predictor's table; a bad file fails naming ``field``."""
    from geodiloco.predictor.specs import load_user_gpus
    for index, path in enumerate(paths):
        try:
            load_user_gpus(path)
        except ConfigError as err:
            raise ValueError(f"{field}[{index}]: {err}") from None


def check_unique_names(nodes: list[NodeSpec]) -> None:
    """Node names identify nodes in plans and logs, so a repeated name is an error."""
    names = [node.name for node in nodes]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        where = ", ".join(f"nodes[{index}].name" for index, name in enumerate(names) if name in repeated)
        raise ValueError(f"node names must be unique; {where} repeat {', '.join(map(repr, repeated))}: rename "
                         "all but one")


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read the ``nodes:`` list of a cluster file or of a whole run config."""
    data = load_yaml_mapping(path)
    if "nodes" not in data:
        raise ConfigError(f"{path}: no 'nodes:' list; a cluster file lists nodes with name, site and gpus")
    base = Path(path).parent
    listed = data.get("gpu_files") or []
    if not isinstance(listed, list):
        raise ConfigError(f"{path}: gpu_files: a list of GPU files, e.g. gpu_files: [{listed}]")
    gpu_files = [str(base / file) for file in listed]
    return validate(ClusterSpec, {"nodes": data["nodes"], "gpu_files": gpu_files}, str(path))
