"""Run config: one YAML file -> validated objects. Bad input fails here, naming the field.

Sections follow the shape in the README (run, model, data, optim, diloco,
balancing, comm, checkpoint, nodes). Durations end in ``_s``.
"""
from __future__ import annotations

import copy
import glob
import importlib.util
import os
import re
from importlib import resources
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import Field, field_validator, model_validator

from geodiloco.balancer.cluster import NodeSpec, check_safe_name, check_unique_names, load_gpu_files
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.network import RUN_DEFAULT_COMPRESSION, RUN_DEFAULT_OVERLAP
from geodiloco.common.schema import ConfigError, StrictModel, load_yaml_mapping, parse_set_value, validate, with_options
from geodiloco.predictor.workload import ModelDims, dims_from_mapping, hf_config_json, preset_dims, resolve_dims

DEFAULT_CONFIG_NAME = "default.yaml"

LONGEST_WAIT_S = 2_592_000
"""Upper bound of every timeout and period (30 days): larger finite values pass as numbers but overflow the C
integer torch.distributed and the threading waits take, in every worker, after the nodes started."""


class RunSection(StrictModel):
    """``deterministic``: deterministic torch kernels (bitwise resume on CPU).
    ``gpu_sample_interval_s``: NVML utilization/power sampling period (0 = off)."""

    name: str = Field(default="run", min_length=1)
    out_dir: str = "runs"
    seed: int = 0
    deterministic: bool = False
    gpu_sample_interval_s: float = Field(default=1.0, ge=0, le=LONGEST_WAIT_S)
    max_wall_s: Optional[float] = Field(default=None, gt=0)
    """Stop cleanly at the first outer boundary after this many seconds of training (wall clock, from
    the moment every node is ready); None = run every round. Compares modes at equal wall-clock."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return check_safe_name(value, "run name")


class HFModelSource(StrictModel):
    """A Hugging Face transformers causal LM (needs ``pip install 'geodiloco[hf]'``).

    ``config``: a transformers config.json (or a directory holding one): the model is built with
    ``AutoModelForCausalLM.from_config``, freshly initialised from ``run.seed``. ``pretrained``: a
    local ``save_pretrained`` directory to start from. Give exactly one."""

    config: Optional[str] = None
    pretrained: Optional[str] = None

    @model_validator(mode="after")
    def _one_source(self) -> "HFModelSource":
        if (self.config is None) == (self.pretrained is None):
            raise ValueError("model.hf: give exactly one of model.hf.config (a config.json) or "
                             "model.hf.pretrained (a save_pretrained directory)")
        return self


class ModelSection(StrictModel):
    """The model trained: ``preset`` (tiny | small | llama-150m) or ``file`` (JSON/YAML of dims) for
    the built-in LLaMA-style decoder, or ``hf`` for a transformers model; ``seq_len`` tokens per sample."""

    preset: Optional[str] = "tiny"
    file: Optional[str] = None
    hf: Optional[HFModelSource] = None
    seq_len: int = Field(default=128, ge=8)
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"

    @model_validator(mode="after")
    def _one_model(self) -> "ModelSection":
        if "preset" not in self.model_fields_set and (self.file or self.hf):
            self.preset = None
        given = [name for name in ("preset", "file", "hf") if getattr(self, name) is not None]
        if len(given) != 1:
            hint = "; set the others to null (e.g. --set model.preset=null)" if len(given) > 1 else ""
            raise ValueError(f"model: give exactly one of model.preset, model.file or model.hf (got "
                             f"{', '.join(given) or 'none'}){hint}")
        return self

    def dims(self) -> ModelDims:
        """The model's shape for the predictor (for ``hf``: read from its config.json)."""
        if self.hf is not None:
            from geodiloco.runtime.hf_model import read_hf_config
            path = hf_config_json(self.hf.config, self.hf.pretrained)
            field = "model.hf.config" if self.hf.config else "model.hf.pretrained"
            return dims_from_mapping(read_hf_config(path, field), f"{field} ({path})")
        if self.file:
            try:
                dims = resolve_dims(self.file)
            except ConfigError as err:
                raise ConfigError(f"model.file: {err}") from None
            if dims.embedding_parameters is not None:
                raise ConfigError(f"model.file: {self.file} gives embedding_parameters, an adaptive input embedding "
                                  "that the runtime's decoder does not have (it embeds vocab_size x hidden_size); "
                                  "remove it (it is for `geodiloco predict --model` on other training code)")
            return dims
        try:
            return preset_dims(self.preset)
        except ValueError as err:
            raise ConfigError(f"model.preset: {err}") from None


class HFDatasetSection(StrictModel):
    """A Hugging Face ``datasets`` source (needs ``pip install 'geodiloco[hf]'``), read with
    ``load_dataset(path, name, data_files=..., split=..., streaming=...)``.

    ``path``: a builder for local files (json, parquet, text, csv) or a hub dataset name (offline
    only if it is in the local cache). ``data_files``: local files (globs allowed) for the builder.
    ``text_field``: the field holding each document's text. ``streaming``: read the corpus as it
    streams instead of loading it (corpora larger than memory; see runtime/hf_data.py for how the
    eval set and shards are taken then). ``sample_by`` (``path: text`` only): what one document is,
    ``document`` (a whole file, the default here), ``paragraph`` or ``line``."""

    path: str = Field(min_length=1)
    name: Optional[str] = None
    data_files: list[str] = Field(default_factory=list)
    split: str = "train"
    text_field: str = Field(default="text", min_length=1)
    streaming: bool = False
    sample_by: Optional[Literal["document", "paragraph", "line"]] = None

    @field_validator("data_files", mode="before")
    @classmethod
    def _one_file(cls, value):
        """One file or glob may be written as a string, as ``load_dataset`` takes it."""
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _sample_by_for_text(self) -> "HFDatasetSection":
        if self.sample_by is not None and self.path != "text":
            raise ValueError(f"data.hf_dataset.sample_by: read only by the text builder (path: text), not by "
                             f"{self.path!r}; remove it")
        return self

    def builder_options(self) -> dict:
        """Options of ``load_dataset`` beyond the common ones: the text builder reads each file as one document
        (``sample_by: document``) unless told otherwise, where datasets' own default made every line a
        document, with an end of text after each and the newlines gone."""
        if self.path != "text":
            return {}
        return {"sample_by": self.sample_by or "document"}


class DataSection(StrictModel):
    """``source``: 'stdlib' (Python's own sources) or a text file / directory, as byte tokens.
    Or ``hf_dataset`` with ``tokenizer`` (a directory ``AutoTokenizer.from_pretrained`` loads):
    documents tokenized and packed into sequences; ``max_tokens`` caps a non-streaming corpus.
    Or ``token_file``: token ids tokenized beforehand, one flat array, as a ``.npy`` file or raw
    ``token_dtype`` values (nanoGPT's ``train.bin`` is uint16); memory-mapped, never read whole.

    ``shards``: how the corpus is split among nodes. ``iid`` deals windows of the whole
    corpus to every node (DiLoCo's usual assumption: nodes draw from one distribution);
    ``non_iid`` gives each node a contiguous slice, so sites own different data.
    ``eval_batches`` x ``eval_batch_size`` sequences are held out, sampled uniformly from
    the whole corpus and removed from every node's training windows (0 batches = no eval).
    ``eval_every_rounds``: evaluate the global model in the run every N rounds (0 = never:
    the set stays held out, and ``geodiloco evaluate RUN_DIR`` scores the kept checkpoints
    afterwards, so a large eval set costs the run no compute).
    """

    source: str = "stdlib"
    max_bytes: int = Field(default=8_000_000, ge=10_000)
    token_file: Optional[str] = None
    token_dtype: Literal["uint16", "uint32", "int32", "int64"] = "uint16"
    hf_dataset: Optional[HFDatasetSection] = None
    tokenizer: Optional[str] = None
    max_tokens: int = Field(default=20_000_000, ge=1_000)
    shards: Literal["iid", "non_iid"] = "iid"
    eval_batches: int = Field(default=4, ge=0)
    eval_batch_size: int = Field(default=8, ge=1)
    eval_every_rounds: int = Field(default=1, ge=0)

    @model_validator(mode="after")
    def _one_source(self) -> "DataSection":
        if (self.hf_dataset is None) != (self.tokenizer is None):
            raise ValueError("data: data.hf_dataset and data.tokenizer go together (documents are tokenized "
                             "with the tokenizer); give both, or neither for byte-level text")
        if self.hf_dataset is not None and self.source != "stdlib":
            raise ValueError("data: give data.source (byte-level text) or data.hf_dataset, not both")
        if self.token_file is not None and (self.hf_dataset is not None or self.source != "stdlib"):
            other = "data.hf_dataset" if self.hf_dataset is not None else "data.source"
            raise ValueError(f"data: give data.token_file (token ids already tokenized) or {other}, not both")
        if self.token_dtype != "uint16" and self.token_file is None:  # the default is saved in every run's config
            raise ValueError("data.token_dtype: describes data.token_file, which is not set")
        return self


class InnerOptim(StrictModel):
    """AdamW (or plain SGD, for checks against data parallel) with linear warmup then cosine decay to ``min_lr_ratio`` x lr."""

    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(default=3.0e-4, gt=0)
    warmup_steps: int = Field(default=10, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)

    @field_validator("betas", mode="before")
    @classmethod
    def _two_betas(cls, value):
        if isinstance(value, (list, tuple)) and len(value) != 2:
            raise ValueError(f"two numbers [beta1, beta2] are needed, e.g. [0.9, 0.95]; got {len(value)}")
        return value
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)


class OuterOptim(StrictModel):
    """SGD with Nesterov momentum on the averaged pseudo-gradient (DiLoCo defaults)."""

    lr: float = Field(default=0.7, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    nesterov: bool = True


class OptimSection(StrictModel):
    inner: InnerOptim = Field(default_factory=InnerOptim)
    outer: OuterOptim = Field(default_factory=OuterOptim)


class DilocoSection(StrictModel):
    """Baseline local steps H and batch B (the balancer may change them per node and round).

    ``weighting``: how pseudo-gradients are averaged (uniform | tokens | normalized | auto =
    what the balancing policy recommends). ``overlap``: when the outer sync runs (none =
    blocking; delayed = behind the next round's inner steps, applied one round late;
    streaming = ``fragments`` parameter fragments synced at staggered points of the round).
    ``compression``: codec of the pseudo-gradients on the wire (none = fp32; fp16, bf16; int8,
    int4 with per-chunk scales), always summed in fp32, with error feedback for lossy codecs.
    Defaults (``streaming`` + ``int8``) are what experiments/sync/hide_sync.py measured best on
    the paper's cluster; under ``comm.backend: hivemind`` both default to ``none``. See docs/sync.md.
    """

    rounds: int = Field(default=10, ge=1, le=10_000_000)
    local_steps: int = Field(default=100, ge=1, le=10_000_000)
    batch_size: int = Field(default=4, ge=1, le=1_000_000)
    weighting: Literal["uniform", "tokens", "normalized", "auto"] = "tokens"
    overlap: Literal["none", "delayed", "streaming"] = RUN_DEFAULT_OVERLAP
    fragments: int = Field(default=4, ge=1, le=1024)
    compression: Literal["none", "fp16", "bf16", "int8", "int4"] = RUN_DEFAULT_COMPRESSION
    mode: Literal["sync", "async"] = "sync"
    """``sync``: every round ends at a barrier and one outer step (DiLoCo). ``async``: a node that ends
    its local phase pushes its pseudo-gradient, pulls the newest global model and goes on without
    waiting (delayed Nesterov + dynamic local updates; docs/async.md); ``compression`` then codes the
    push and the pull. ``rounds`` then counts each node's own phases."""
    momentum_every: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    """``async`` only: the outer momentum is applied once every this many received pseudo-gradients
    (delayed Nesterov's N; plain outer-lr steps in between). None = the number of nodes."""


RESYNC_TOLERANCE = {"none": 1.0e-6, "fp16": 1.0e-6, "8bit": 1.0e-4}
"""Default ``comm.hivemind.resync_tolerance`` by wire codec. Each peer adds the codec's rounding of its own
delta to the average, so replicas part by that rounding every round: in the demo's 3-site run
(experiments/hivemind/codec_drift.py) the checksums' relative spread stayed below 6.3e-7 under fp16 and
grew by 2-7e-5 a round under 8bit. A tolerance below the codec's spread reloads the full fp32 state
nearly every round (6 reloads in 8 rounds at 1e-6), more than the 8-bit all-reduce saves; 1e-4 leaves room for several
rounds of 8-bit rounding and still catches an all-reduce that lost parts (whole parts off by the
pseudo-gradient)."""


class HivemindSection(StrictModel):
    """Options of ``comm.backend: hivemind`` (decentralized outer sync; see docs/hivemind.md).

    ``initial_peers``: multiaddrs of any running peer (empty on the first node; ``geodiloco run``
    fills them in). ``host_maddrs``: where this node's DHT listens (``tcp/0`` = any free port).
    ``announce_maddrs``: addresses to tell peers when they differ from ``host_maddrs`` (NAT).
    ``start_wait_s``: how long the first nodes wait for each other before round 0 (later ones join mid-run).
    ``round_timeout_s``: longest wait for a live but late peer at the outer sync; past it the
    round completes with the peers present. ``heartbeat_ttl_s``: a node whose heartbeat is
    older than this is dead and no longer awaited. ``matchmaking_time_s`` / ``request_timeout_s``:
    hivemind's ``min_matchmaking_time`` / ``request_timeout`` (keep request < matchmaking).
    ``matchmaking_timeout_s``: longest search for an averaging group after the readiness
    exchange (a node that finds none reloads the state from its peers).
    ``allreduce_timeout_s``: longest all-reduce once a group formed; ``chunk_timeout_s``: a peer
    that sends no data for this long is dropped from the all-reduce (or state download).
    ``target_group_size``: peers per averaging group (None = every config node). Smaller groups
    average separately, so their parameters part until ``resync_tolerance`` pulls a node back,
    and each group logs its own metrics rows for the round: meant for swarms far larger than
    one group.
    ``compression``: codec of the pseudo-gradients on the wire (none | fp16 | 8bit; none =
    follow ``diloco.compression``). ``resync_tolerance``: a node whose parameter checksum at a
    round start differs from the majority's by more than this (relative) reloads the global
    state from a peer after the round; unset, it follows the wire codec (``RESYNC_TOLERANCE``).
    """

    initial_peers: list[str] = Field(default_factory=list)
    host_maddrs: list[str] = Field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    announce_maddrs: list[str] = Field(default_factory=list)
    start_wait_s: float = Field(default=60.0, gt=0, le=LONGEST_WAIT_S)
    round_timeout_s: float = Field(default=300.0, gt=0, le=LONGEST_WAIT_S)
    heartbeat_ttl_s: float = Field(default=6.0, gt=0, le=LONGEST_WAIT_S)
    matchmaking_time_s: float = Field(default=2.0, gt=0, le=LONGEST_WAIT_S)
    request_timeout_s: float = Field(default=1.0, gt=0, le=LONGEST_WAIT_S)
    matchmaking_timeout_s: float = Field(default=30.0, gt=0, le=LONGEST_WAIT_S)
    allreduce_timeout_s: float = Field(default=300.0, gt=0, le=LONGEST_WAIT_S)
    chunk_timeout_s: float = Field(default=10.0, gt=0, le=LONGEST_WAIT_S)
    target_group_size: Optional[int] = Field(default=None, ge=2)
    compression: Literal["none", "fp16", "8bit"] = "none"
    resync_tolerance: Optional[float] = Field(default=None, gt=0)

    def resync_tolerance_for(self, wire_codec: str) -> float:
        """The checksum tolerance in force: the setting, else the codec's ``RESYNC_TOLERANCE``."""
        return self.resync_tolerance if self.resync_tolerance is not None else RESYNC_TOLERANCE[wire_codec]

    @model_validator(mode="after")
    def _timeouts_ordered(self) -> "HivemindSection":
        if self.request_timeout_s >= self.matchmaking_time_s:
            raise ValueError(f"comm.hivemind.request_timeout_s ({self.request_timeout_s:g}) must be smaller than "
                             f"matchmaking_time_s ({self.matchmaking_time_s:g}); hivemind may deadlock otherwise")
        return self


class ElasticSection(StrictModel):
    """How the torch backend survives a site that fails (see docs/elastic.md). Seconds throughout.

    ``enabled``: ``geodiloco run`` and ``scripts/launch_site.sh`` start each site under torchrun's
    elastic agent (``--nnodes comm.min_nodes:N``, c10d rendezvous): when a site fails the others'
    workers restart without it from the last complete round, and a site that comes back joins at the
    next rendezvous. Off: one failed site stops the run (resume with ``--resume``).
    ``failure_timeout_s``: a site whose heartbeat has not moved for this long (frozen, cut off) is
    treated as failed by its peers; a killed site is noticed at once by its closed connections.
    ``heartbeat_interval_s``: how often each node's leader beats. ``max_restarts``: worker restarts
    torchrun allows each site after failures. ``last_call_s``: how long a rendezvous that has
    ``comm.min_nodes`` waits for more sites before it starts. ``keep_alive_s``: torchrun's rendezvous
    keep-alive; a site silent for three of them leaves the rendezvous. ``join_timeout_s``: how long
    a site waits for ``comm.min_nodes`` sites before giving up.
    """

    enabled: bool = True
    failure_timeout_s: float = Field(default=20.0, gt=0, le=LONGEST_WAIT_S)
    heartbeat_interval_s: float = Field(default=1.0, gt=0, le=LONGEST_WAIT_S)
    max_restarts: int = Field(default=10, ge=0)
    last_call_s: int = Field(default=8, ge=1, le=LONGEST_WAIT_S)
    keep_alive_s: int = Field(default=2, ge=1, le=LONGEST_WAIT_S)
    join_timeout_s: int = Field(default=600, ge=1, le=LONGEST_WAIT_S)

    @model_validator(mode="after")
    def _heartbeat_below_timeout(self) -> "ElasticSection":
        if self.heartbeat_interval_s * 3 > self.failure_timeout_s:
            raise ValueError(f"comm.elastic.failure_timeout_s ({self.failure_timeout_s:g}) must be at least three "
                             f"heartbeats (comm.elastic.heartbeat_interval_s {self.heartbeat_interval_s:g}); raise "
                             "the timeout or beat more often")
        return self


class CommSection(StrictModel):
    """Outer-sync transport. Timeouts are seconds and always finite.

    ``outer_device``: where the outer state (global parameters and outer momentum, fp32) lives
    and, on the torch backend, where the pseudo-gradient all-reduce runs: ``cpu`` (gloo, the usual
    choice over a WAN) or ``cuda`` (nccl), the same at every site. hivemind averages on the CPU either way; ``cuda`` keeps
    its outer step on the GPU (8 bytes per parameter there), which spares nodes that share a host
    the CPU contention of docs/runtime.md "Several nodes on one host". Inner data parallel inside
    a node uses nccl on GPUs.
    ``sync_threads``: CPU threads a node's leader uses for the host work of an outer sync while the node's
    other ranks wait for it (torch backend: landing a sync, the outer step and moving the model, and with
    ``diloco.overlap: none`` the whole sync, codec included; hivemind: the pseudo-gradient and outer step). None: its ranks' threads (torchrun gives each
    rank one), at most the node's share of the host's cores, less one per other rank on a GPU node
    (``runtime/host_threads.py``); 1 keeps the leader's own.
    ``hivemind``: options of the hivemind backend (ignored by ``torch``).
    ``elastic``: the torch backend's membership (ignored by ``hivemind``, which is elastic by design).
    ``timeout_s``: the readiness wait, the longest a node waits for a live but late peer at the outer
    sync (and for any other exchange outside the transfer). ``transfer_timeout_factor`` /
    ``transfer_min_timeout_s``: the torch backend's transfer (the pseudo-gradient all-reduce) has its
    own timeout, ``max(transfer_min_timeout_s, factor x the planned sync time)`` from the bytes
    and the ``wan:`` bandwidths. A frozen or cut-off site is found sooner by the heartbeats
    (``comm.elastic.failure_timeout_s``).
    ``min_nodes``: the fewest config nodes that may train: torch (elastic), the rendezvous's minimum;
    hivemind, the fewest that found the run (founders wait up to ``init_timeout_s`` past
    ``hivemind.start_wait_s`` for them, then stop) and that go on (with fewer live, the nodes wait up
    to ``init_timeout_s`` between rounds for a site to rejoin, then stop with their checkpoints kept).
    """

    backend: Literal["torch", "hivemind"] = "torch"
    outer_device: Literal["cpu", "cuda"] = "cpu"
    sync_threads: Optional[int] = Field(default=None, ge=1, le=4096)
    timeout_s: float = Field(default=300.0, gt=0, le=LONGEST_WAIT_S)
    transfer_timeout_factor: float = Field(default=10.0, ge=1.0, le=1000.0)
    transfer_min_timeout_s: float = Field(default=60.0, gt=0, le=LONGEST_WAIT_S)
    init_timeout_s: float = Field(default=120.0, gt=0, le=LONGEST_WAIT_S)
    min_nodes: int = Field(default=1, ge=1)
    elastic: ElasticSection = Field(default_factory=ElasticSection)
    hivemind: HivemindSection = Field(default_factory=HivemindSection)

    @model_validator(mode="after")
    def _hivemind_addresses(self) -> "CommSection":
        """The hivemind backend's peer addresses, each a multiaddr (bootstrap peers with their /p2p/ID), checked
        before any node starts; only on that backend (the check imports hivemind, an extra the torch backend
        does without, and every saved config.yaml carries the section's defaults)."""
        if self.backend != "hivemind" or importlib.util.find_spec("hivemind") is None:
            return self  # without the extra: a run says so in its preflight; plan and simulate need no peers
        from geodiloco.runtime.sync.multiaddrs import checked_multiaddrs
        options = self.hivemind
        try:
            for field_name in ("initial_peers", "host_maddrs", "announce_maddrs"):
                checked_multiaddrs(getattr(options, field_name), f"comm.hivemind.{field_name}",
                                   names_peer=field_name == "initial_peers")
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return self


class CheckpointSection(StrictModel):
    """``every_rounds``: rounds between checkpoints; ``keep``: complete rounds kept on disk;
    ``background``: hash and write the files in a background thread while the next round trains
    (the round's end only copies the state to host memory); false: the round waits for the write.
    ``flush``: fsync each file and folder before ``latest`` moves, so a power loss leaves the last
    complete checkpoint usable; false skips that (files are still replaced atomically)."""

    every_rounds: int = Field(default=1, ge=1)
    keep: int = Field(default=2, ge=1)
    background: bool = True
    flush: bool = True


class WandbSection(StrictModel):
    """``mode``: online (needs a network and ``wandb login``), offline (files under the run
    directory; ``wandb sync`` uploads them later) or disabled. ``WANDB_MODE`` overrides it."""

    project: str = Field(min_length=1)
    entity: Optional[str] = None
    mode: Literal["online", "offline", "disabled"] = "online"


class LoggingSection(StrictModel):
    """Live metrics besides the JSONL logs (which stay the report's source): ``tensorboard``: a log
    directory (events go to ``DIR/<run.name>``); ``wandb``: a Weights & Biases project."""

    tensorboard: Optional[str] = None
    wandb: Optional[WandbSection] = None


class RunConfig(StrictModel):
    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    optim: OptimSection = Field(default_factory=OptimSection)
    diloco: DilocoSection = Field(default_factory=DilocoSection)
    balancing: BalancingConfig = Field(default_factory=BalancingConfig)
    comm: CommSection = Field(default_factory=CommSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)
    gpu_files: list[str] = Field(default_factory=list)
    """Extra GPU datasheet rows (predictor/data/gpus.yaml shape) for GPUs the table lacks; relative
    paths are taken from the working directory, and every site needs the same files."""
    nodes: list[NodeSpec]

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        if not self.nodes:
            raise ValueError("nodes: the config lists no node; add one entry per site, e.g. nodes: [{name: a, gpus: "
                             "[\"4 x A30\"]}]")
        load_gpu_files(self.gpu_files, "gpu_files")
        check_unique_names(self.nodes)
        reference = self.balancing.reference_node
        if reference not in ("slowest", "fastest") and reference not in {node.name for node in self.nodes}:
            known = ", ".join(node.name for node in self.nodes[:10])
            raise ValueError(f"balancing.reference_node: no node named {reference!r}; use slowest, fastest or one "
                             f"of: {known}")
        if self.comm.backend == "hivemind":
            check_hivemind_sync(self.diloco)
        if self.diloco.mode == "async":
            check_async_sync(self.diloco, self.comm.backend)
            if "policy" not in self.balancing.model_fields_set:
                self.balancing.policy = "adaptive"  # dynamic local updates: re-planned from measured speeds
        if self.comm.min_nodes > len(self.nodes):
            raise ValueError(f"comm.min_nodes: {self.comm.min_nodes} is more than the {len(self.nodes)} nodes the "
                             "config lists; lower it or add nodes")
        return self

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(node.name for node in self.nodes)
        raise ConfigError(f"--node-name {name!r} is not in the config's nodes ({known})")

    def node_index(self, name: str) -> int:
        return [node.name for node in self.nodes].index(self.node(name).name)

    def to_yaml(self) -> str:
        """The config as the run directory keeps it: input paths absolute (``with_absolute_paths``)."""
        return yaml.safe_dump(with_absolute_paths(self.model_dump(mode="json", exclude_none=True), Path.cwd()),
                              sort_keys=False)


DATASET_BUILDERS = {"json", "parquet", "text", "csv", "arrow"}
"""``datasets`` builders that read local files (``data.hf_dataset.path``), never paths themselves."""


def with_absolute_paths(mapping: dict, base: Path) -> dict:
    """``mapping`` (a run config as a dict) with its relative input paths (model files, data, tokenizer, GPU
    files) joined to ``base``, the directory the run was started from: the run directory's config.yaml then
    serves ``geodiloco export``, ``evaluate`` and ``--resume`` from any directory. Names that are not paths
    (``stdlib``, a datasets builder) stay as they are."""
    result = copy.deepcopy(mapping)

    def absolute(value):
        """A relative path that names something under ``base`` (a glob that matches), joined to it; anything
        else (a preset or builder name, a path already absolute or missing) as it is."""
        if isinstance(value, list):
            return [absolute(item) for item in value]
        if not isinstance(value, str) or os.path.isabs(value) or not glob.glob(str(base / value)):
            return value
        return os.path.normpath(base / value)

    model, data = result.get("model") or {}, result.get("data") or {}
    hf_model = model.get("hf") or {}
    for section, key in ((model, "file"), (hf_model, "config"), (hf_model, "pretrained"), (data, "tokenizer"),
                         (data, "token_file"), (result, "gpu_files")):
        if section.get(key):
            section[key] = absolute(section[key])
    if data.get("source") and data["source"] != "stdlib":
        data["source"] = absolute(data["source"])
    hf_data = data.get("hf_dataset") or {}
    if hf_data.get("data_files"):
        hf_data["data_files"] = absolute(hf_data["data_files"])
    if hf_data.get("path") and hf_data["path"] not in DATASET_BUILDERS:
        hf_data["path"] = absolute(hf_data["path"])
    return result


HIVEMIND_CODECS = ("none", "fp16", "bf16", "int8")


def check_hivemind_sync(diloco: DilocoSection) -> None:
    """The hivemind backend averages in groups formed on the fly, blocking, through its own codecs:
    unset ``overlap``/``compression`` become ``none``; set ones it cannot do are errors."""
    if "overlap" not in diloco.model_fields_set:
        diloco.overlap = "none"
    if "compression" not in diloco.model_fields_set:
        diloco.compression = "none"
    if diloco.overlap != "none":
        raise ValueError(f"diloco.overlap: {diloco.overlap} needs comm.backend: torch; the hivemind backend "
                         "forms a new averaging group every round and cannot keep a sync in flight across "
                         "rounds. Use diloco.overlap: none with hivemind, or comm.backend: torch")
    if diloco.compression not in HIVEMIND_CODECS:
        raise ValueError(f"diloco.compression: {diloco.compression} has no hivemind codec; use one of "
                         f"{', '.join(HIVEMIND_CODECS)} with comm.backend: hivemind, or comm.backend: torch")


def check_async_sync(diloco: DilocoSection, backend: str) -> None:
    """Asynchronous DiLoCo pushes each node's whole pseudo-gradient and pulls the global model at its
    own phase end through the torch backend: there is no round to overlap (unset ``overlap`` becomes
    ``none``; a set one is an error), and ``compression`` codes both directions (docs/async.md)."""
    if backend != "torch":
        raise ValueError("diloco.mode: async needs comm.backend: torch (the global model lives on the first "
                         "node's leader and nodes push and pull over torch.distributed point-to-point); "
                         "use comm.backend: torch, or diloco.mode: sync with hivemind")
    if "overlap" not in diloco.model_fields_set:
        diloco.overlap = "none"
    if diloco.overlap != "none":
        raise ValueError(f"diloco.overlap: {diloco.overlap} does not apply to diloco.mode: async (there is no "
                         "round barrier to hide: each node's push and pull is its own); use diloco.overlap: none")


def parse_config(data: dict, source: str) -> RunConfig:
    config = validate(RunConfig, data, source)
    try:
        dims = config.model.dims()
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    if config.model.hf is None and dims.num_kv_heads not in (None, dims.num_heads):
        raise ConfigError(f"{source}: model.file: num_kv_heads {dims.num_kv_heads}: the built-in model trains full "
                          f"multi-head attention ({dims.num_heads} key/value heads); leave num_kv_heads out, or train "
                          "a transformers model with grouped-query attention (model.hf)")
    if config.model.seq_len > dims.max_seq_len:
        larger = ("raise max_position_embeddings in its config.json" if config.model.hf is not None
                  else "raise its max_seq_len" if config.model.file else "pick a larger preset")
        raise ConfigError(f"{source}: model.seq_len: {config.model.seq_len} exceeds the model's "
                          f"max_seq_len {dims.max_seq_len}; lower seq_len or {larger}")
    return config


def check_planning_file(path: str | Path) -> None:
    """The run sections of a file ``geodiloco plan`` or ``simulate`` reads, checked as a run checks them: each
    section's keys and types, and a top-level key that misspells a section. Other top-level keys (notes a cluster
    file carries, such as paper4.yaml's paper_table3) are left alone, and so is ``gpu_files``, which the cluster
    loader reads relative to the file; a file without a ``nodes:`` list is left to the cluster loader to refuse."""
    import difflib
    data = load_yaml_mapping(path)
    sections = set(RunConfig.model_fields)
    for key in data:
        if key not in sections:
            close = difflib.get_close_matches(str(key), sorted(sections), n=1, cutoff=0.75)
            if close:
                raise ConfigError(f"{path}: {key}: unknown section; did you mean '{close[0]}'?")
    run_sections = {key: value for key, value in data.items() if key in sections and key not in ("gpu_files", "nodes")}
    if run_sections and isinstance(data.get("nodes"), list):
        parse_config({**run_sections, "nodes": data["nodes"]}, str(path))


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML run config (None = the embedded default) and apply ``key.path=value`` overrides."""
    if path is None:
        source = f"<embedded {DEFAULT_CONFIG_NAME}>"
        data = yaml.safe_load(resources.files("geodiloco.runtime").joinpath(DEFAULT_CONFIG_NAME).read_text())
    else:
        source = str(path)
        data = load_yaml_mapping(path)
    for override in overrides or []:
        apply_override(data, override)
    return parse_config(data, with_options(source, [f"--set {override}" for override in overrides or []]))


def apply_override(data: dict, override: str) -> None:
    """``diloco.rounds=3`` style override; the value is parsed as YAML. A list entry is ``nodes.0.gpus`` or
    ``nodes[0].gpus`` (as error messages name it)."""
    if "=" not in override:
        raise ConfigError(f"--set {override!r}: expected KEY.PATH=VALUE, e.g. diloco.rounds=3")
    key_path, raw_value = override.split("=", 1)
    keys = re.sub(r"\[(-?\d+)\]", r".\1", key_path.strip()).split(".")  # nodes[0].gpus, as errors name it
    if not all(key.strip() for key in keys):
        raise ConfigError(f"--set {override!r}: the key path has an empty part; write KEY.PATH=VALUE, "
                          "e.g. diloco.rounds=3")
    target = data
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        if isinstance(target, list):
            if not key.lstrip("-").isdigit() or not -len(target) <= int(key) < len(target):
                where = ".".join(keys[:depth]) or "the config"
                raise ConfigError(f"--set {key_path}: {where} is a list of {len(target)} entries; use an index "
                                  f"from 0 to {len(target) - 1} (or from -{len(target)} to -1, counted from the end)")
            key = int(key)
        elif not isinstance(target, dict):
            raise ConfigError(f"--set {key_path}: {'.'.join(keys[:depth])} is a value, not a section")
        if last:
            target[key] = parse_set_value(key_path.strip(), raw_value)
        elif isinstance(target, dict):
            if keys[depth + 1].lstrip("-").isdigit() and not isinstance(target.get(key), list):
                where = ".".join(keys[:depth + 1])
                raise ConfigError(f"--set {key_path}: {where} is no list in this config to index into; give the "
                                  f"whole list as YAML, e.g. --set \"{where}=[...]\"")
            target = target.setdefault(key, {})
        else:
            target = target[key]
