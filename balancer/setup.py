"""Build a Planner from a cluster file and command-line choices (shared by `plan` and `simulate`).

A cluster file is either just a ``nodes:`` list or a whole run config; from a
run config the ``balancing:`` section, ``model.preset``/``model.seq_len``/``model.precision``,
``diloco.local_steps``/``diloco.batch_size`` and the sync settings
``diloco.overlap``/``diloco.compression``/``diloco.fragments`` become defaults that flags
override.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from pydantic import TypeAdapter, ValidationError


from geodiloco.balancer.cluster import ClusterSpec, load_cluster
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.network import (CODEC_BITS, RUN_DEFAULT_COMPRESSION, RUN_DEFAULT_OVERLAP, SYNC_DTYPE_CODEC,
                                        SyncSettings, hivemind_codec)
from geodiloco.balancer.planner import Planner
from geodiloco.balancer.simulate import Slowdown
from geodiloco.common.schema import ConfigError, load_yaml_mapping, parse_set_value, validate, with_options
from geodiloco.predictor.workload import (ModelDims, check_workload_size, hf_config_json, parameter_tensor_count,
                                          resolve_dims)

log = logging.getLogger("geodiloco.balancer")

DEFAULT_MODEL = "llama-150m"
DEFAULT_SEQ_LEN = 1024
DEFAULT_LOCAL_STEPS = 100
DEFAULT_BATCH_SIZE = 4
DEFAULT_PRECISION = "bf16"
ASYNC_DEFAULT_POLICY = "adaptive"
"""The policy a run in async mode uses when its config names none (dynamic local updates)."""


@dataclass
class PlanningSetup:
    """Everything a planner needs, resolved from the file and the flags."""

    cluster: ClusterSpec
    balancing: BalancingConfig
    model: str
    dims: ModelDims
    seq_len: int
    local_steps: int
    batch_size: int
    precision: str
    sync: SyncSettings = SyncSettings()
    mode: str = "sync"
    """``diloco.mode`` of a run config (``sync`` for a bare cluster file)."""
    rounds: Optional[int] = None
    """``diloco.rounds`` of a run config (None for a bare cluster file): ``simulate``'s default."""

    def planner(self) -> Planner:
        return Planner(self.balancing.for_mode(self.mode), self.cluster.nodes, self.dims, self.seq_len,
                       self.local_steps, self.batch_size, self.precision, sync_settings=self.sync)

    def to_config(self, run_name: str) -> dict:
        """A run-config-shaped record of what was planned or simulated (``config.yaml``)."""
        return {
            "run": {"name": run_name},
            "model": {"preset": self.model, "seq_len": self.seq_len, "precision": self.precision},
            "diloco": {"local_steps": self.local_steps, "batch_size": self.batch_size,
                       "overlap": self.sync.overlap, "compression": self.sync.codec,
                       "fragments": self.sync.fragments},
            "balancing": self.balancing.model_dump(mode="json"),
            "nodes": [node.model_dump(mode="json", exclude_none=True) for node in self.cluster.nodes],
        }


def parse_assignment(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with a YAML value (``hysteresis=0.05``, ``simulation.seed=3``)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. --set hysteresis=0.05")
    key, value = text.split("=", 1)
    return key.strip(), parse_set_value(key.strip(), value)


def hf_config_file(model_section: dict) -> Optional[str]:
    """The config.json of a run config's ``model.hf`` (its dims are read from it), or None."""
    hf = model_section.get("hf")
    if not isinstance(hf, dict) or not (hf.get("config") or hf.get("pretrained")):
        return None
    return str(hf_config_json(hf.get("config"), hf.get("pretrained")))


def _section(data: dict, name: str) -> dict:
    value = data.get(name)
    return value if isinstance(value, dict) else {}


def balancing_options(file_data: dict, policy: Optional[str], assignments: Sequence[str],
                      simulation: dict, source: str) -> BalancingConfig:
    """The ``balancing:`` section of the file, then ``--policy``, ``--set`` and simulation flags."""
    options = dict(_section(file_data, "balancing"))
    if policy is not None:
        options["policy"] = policy
    elif "policy" not in options and _section(file_data, "diloco").get("mode") == "async":
        options["policy"] = ASYNC_DEFAULT_POLICY  # as runtime/config.py sets it for the run
    for text in assignments:
        key, value = parse_assignment(text)
        key = key.removeprefix("balancing.")  # the run's full path, as `geodiloco run --set` takes it
        section = key.split(".")[0].split("[")[0]
        if section in RUN_CONFIG_SECTIONS + ("model", "logging", "nodes", "gpu_files"):
            raise ConfigError(f"--set {text!r}: plan and simulate set balancing: options only (e.g. --set "
                              "hysteresis=0.05); the model, batch, steps and sync have their own flags (see --help)")
        target = options
        *parents, leaf = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
            if not isinstance(target, dict):
                raise ConfigError(f"--set {text!r}: balancing.{parent} is not a section")
        target[leaf] = value
    if simulation:
        options["simulation"] = {**options.get("simulation", {}), **simulation}
    return validate(BalancingConfig, options, source, prefix="balancing")


def load_setup(cluster_path: str, policy: Optional[str] = None, model: Optional[str] = None,
               seq_len: Optional[int] = None, local_steps: Optional[int] = None,
               batch_size: Optional[int] = None, precision: Optional[str] = None,
               assignments: Sequence[str] = (), simulation: Optional[dict] = None,
               overlap: Optional[str] = None, compression: Optional[str] = None) -> PlanningSetup:
    file_data = load_yaml_mapping(cluster_path)
    cluster = load_cluster(cluster_path)
    model_section, diloco = _section(file_data, "model"), _section(file_data, "diloco")
    model_name = model or model_section.get("preset") or model_section.get("file") or hf_config_file(model_section) \
        or DEFAULT_MODEL
    resolved_seq_len = first_given(seq_len, file_integer(model_section.get("seq_len")), DEFAULT_SEQ_LEN)
    steps = first_given(local_steps, file_integer(diloco.get("local_steps")), DEFAULT_LOCAL_STEPS)
    precision = first_given(precision, model_section.get("precision"), DEFAULT_PRECISION)
    batch = first_given(batch_size, file_integer(diloco.get("batch_size")), DEFAULT_BATCH_SIZE)
    for flag, value, field, flag_value in (("--seq-len", resolved_seq_len, "model.seq_len", seq_len),
                                           ("--local-steps", steps, "diloco.local_steps", local_steps),
                                           ("--batch-size", batch, "diloco.batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            where = flag if flag_value is not None else f"{cluster_path}: {field}"
            raise ConfigError(f"{where} must be a positive integer, got {value!r}")
    options = [f"--set {item}" for item in assignments] + [
        f"--{key.replace('_', '-')} {value}" for key, value in (simulation or {}).items() if key != "seed"]
    balancing = balancing_options(file_data, policy, assignments, simulation or {},
                                  with_options(str(cluster_path), options))
    for notice in balancing.unread_options():
        log.warning(notice)
    try:
        dims = resolve_dims(model_name)
        if seq_len is None and model_section.get("seq_len") is None:
            resolved_seq_len = min(resolved_seq_len, dims.max_seq_len)  # the default, within the model's reach
        check_workload_size(batch, resolved_seq_len, dims, "--batch-size (diloco.batch_size)",
                            "--seq-len (model.seq_len)")
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return PlanningSetup(cluster=cluster, balancing=balancing, model=model_name, dims=dims,
                         seq_len=resolved_seq_len, local_steps=steps, batch_size=batch, precision=precision,
                         sync=sync_settings(diloco, balancing, overlap, compression, run_sync_defaults(file_data),
                                            str(_section(file_data, "comm").get("backend", "torch")),
                                            parameter_tensor_count(dims)),
                         mode=diloco.get("mode", "sync"), rounds=file_integer(diloco.get("rounds")))


_INTEGER = TypeAdapter(int)


def file_integer(value: Any) -> Any:
    """A whole number read from the file as a run reads it (``4``, ``4.0`` and ``'4'`` are 4); anything else is
    returned as it is, for the caller to refuse with its field named."""
    if isinstance(value, bool):
        return value
    try:
        return _INTEGER.validate_python(value)
    except ValidationError:
        return value


def first_given(*values):
    """The first value that is not None (0 is a value, and is then refused, not replaced by a default)."""
    return next(value for value in values if value is not None)


RUN_CONFIG_SECTIONS = ("run", "diloco", "comm", "data", "optim", "checkpoint")


def run_sync_defaults(file_data: dict) -> Optional[tuple[str, str]]:
    """(overlap, compression) a run of this file syncs with where its ``diloco:`` leaves them out, or None
    for a bare cluster file (a ``nodes:`` list and no run section), which plans a blocking sync. These
    follow runtime/config.py: the run defaults, or ``none`` under hivemind (and no overlap in async mode)."""
    if not any(section in file_data for section in RUN_CONFIG_SECTIONS):
        return None
    comm = _section(file_data, "comm")
    if comm.get("backend") == "hivemind":
        hivemind = comm.get("hivemind") if isinstance(comm.get("hivemind"), dict) else {}
        return "none", hivemind_codec(str(hivemind.get("compression", "none")),
                                      str(_section(file_data, "diloco").get("compression", "none")))
    if _section(file_data, "diloco").get("mode") == "async":
        return "none", RUN_DEFAULT_COMPRESSION
    return RUN_DEFAULT_OVERLAP, RUN_DEFAULT_COMPRESSION


OVERLAP_MODES = ("none", "delayed", "streaming")


def sync_settings(diloco: dict, balancing: BalancingConfig, overlap: Optional[str],
                  compression: Optional[str], run_defaults: Optional[tuple[str, str]] = None,
                  backend: str = "torch", max_fragments: Optional[int] = None) -> SyncSettings:
    """The run's sync as the planner models it: flags, else the file's ``diloco:``, else what a run of a
    run config uses (``run_defaults``), else (a bare cluster file) blocking with ``balancing.sync_dtype``.
    ``max_fragments``: the model's parameter tensors (streaming sends whole tensors, so no more fragments)."""
    default_overlap, default_codec = run_defaults or ("none", SYNC_DTYPE_CODEC[balancing.sync_dtype])
    chosen_overlap = overlap or diloco.get("overlap") or default_overlap
    codec = compression or diloco.get("compression") or default_codec
    if backend == "hivemind":  # the wire's codec (run_sync_defaults), whatever diloco.compression says
        codec = compression or default_codec
    fragments = file_integer(diloco.get("fragments", 4))
    if chosen_overlap not in OVERLAP_MODES:
        raise ConfigError(f"diloco.overlap: {chosen_overlap!r} is not one of {', '.join(OVERLAP_MODES)}")
    if codec not in CODEC_BITS:
        raise ConfigError(f"diloco.compression: {codec!r} is not one of {', '.join(CODEC_BITS)}")
    if not isinstance(fragments, int) or isinstance(fragments, bool) or fragments < 1:
        raise ConfigError(f"diloco.fragments must be a positive integer, got {fragments!r}")
    if max_fragments is not None:
        fragments = min(fragments, max_fragments)
    return SyncSettings(chosen_overlap, codec, fragments if chosen_overlap == "streaming" else 1, backend)


MAX_SLOWDOWN_FACTOR = 1000.0
"""A node 1000x slower is as good as stopped; larger factors only overflow the simulated clock."""


def parse_slowdown(text: str) -> Slowdown:
    """``NODE:ROUND:FACTOR`` (or ``NODE:ROUND:FACTOR:UNTIL``) -> Slowdown."""
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise ConfigError(f"--slowdown {text!r}: expected NODE:ROUND:FACTOR, e.g. node1:5:2.0")
    try:
        until = int(parts[3]) if len(parts) == 4 else None
        event = Slowdown(node=parts[0], from_round=int(parts[1]), factor=float(parts[2]), until_round=until)
    except ValueError:
        raise ConfigError(f"--slowdown {text!r}: ROUND must be an integer and FACTOR a number") from None
    if event.from_round < 0 or not 0 < event.factor <= MAX_SLOWDOWN_FACTOR:  # also refuses nan and inf
        raise ConfigError(f"--slowdown {text!r}: ROUND must be >= 0 and FACTOR a number above 0 and at most "
                          f"{MAX_SLOWDOWN_FACTOR:g}")
    if until is not None and until <= event.from_round:
        raise ConfigError(f"--slowdown {text!r}: UNTIL ({until}) must come after ROUND ({event.from_round}); the "
                          "slowdown lasts from ROUND up to, not including, UNTIL")
    return event
