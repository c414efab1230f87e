"""GPU datasheet table: load, validate, look up by any vendor spelling.

The table ships as ``predictor/data/gpus.yaml`` (one vendor source per row);
users add or override GPUs with ``load_user_gpus(path)``. Rates are dense
peaks in TFLOPS (1e12 FLOP/s), bandwidth in GB/s (1e9 B/s), memory in GiB.
"""
from __future__ import annotations

import difflib
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import numpy as np
from pydantic import AliasChoices, ConfigDict, Field, model_validator

from geodiloco.predictor.amd_partitions import partition_count, partition_spec
from geodiloco.predictor.gpu_names import NameIndex, NameMatch, UnknownName, normalize_name, pci_product_names
from geodiloco.predictor.gpu_slices import resolve_mig, resolve_slice
from geodiloco.predictor.mig import split_mig_name
from geodiloco.common.schema import ConfigError, StrictModel, load_yaml_mapping, validate
from geodiloco.common.gpu_counts import GPU_COUNT
from geodiloco.predictor.workload import check_precision

DATA_FILE = Path(__file__).parent / "data" / "gpus.yaml"
log = logging.getLogger("geodiloco.predictor")

# One direction of an x16 link, GB/s, by PCIe generation (PCI-SIG figures).
PCIE_X16_GBPS = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}


@dataclass(frozen=True)
class GpuSpec:
    """One device's datasheet row (a CPU is described in the same shape by detect.py)."""

    name: str
    architecture: str
    sm_count: int
    memory_gb: float
    memory_bandwidth_gbps: float
    fp32_tflops: float
    tf32_tflops: Optional[float]
    fp16_tflops: Optional[float]
    fp16_fp32acc_tflops: Optional[float]
    bf16_tflops: Optional[float]
    consumer: bool
    source: str
    aliases: tuple[str, ...] = ()
    boost_clock_mhz: Optional[float] = None
    pcie_gen: Optional[int] = None
    peer_link_gbps: Optional[float] = None
    peer_link: Optional[str] = None
    fp8_tflops: Optional[float] = None
    vendor: str = "nvidia"
    model: Optional[str] = None
    form_factor: Optional[str] = None
    default_for_model: bool = False
    kind: str = "gpu"
    host_op_us: Optional[float] = None
    host_optimizer_tensor_us: Optional[float] = None
    bandwidth_curve: tuple[tuple[float, float], ...] = ()
    mig_instances: Optional[int] = None
    mig_sms_per_slice: Optional[int] = None
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def matmul_rate(self, precision: str) -> tuple[float, str, str]:
        """(TFLOPS, which column, note) that matmuls reach at ``precision``.

        Mixed precision accumulates in FP32, so fp16 uses the FP32-accumulate
        column (half the headline on GeForce cards). Without BF16 hardware, bf16
        is modelled as fp16 mixed precision; fp32 is plain FP32 (PyTorch leaves
        TF32 off for matmuls unless asked: precision ``tf32``).
        """
        check_precision(precision)
        if self.is_cpu:
            note = "" if precision in ("fp32", "tf32") else "CPU: modelled at the measured fp32 rate"
            return self.fp32_tflops, "fp32_tflops (measured)", note
        if precision == "fp32":
            return self.fp32_tflops, "fp32_tflops", ""
        if precision == "tf32":
            if self.tf32_tflops:
                return self.tf32_tflops, "tf32_tflops", ""
            return self.fp32_tflops, "fp32_tflops", f"{self.name} has no TF32; plain FP32 used"
        if precision == "bf16" and self.bf16_tflops:
            return self.bf16_tflops, "bf16_tflops", ""
        note = "" if precision == "fp16" else f"{self.name} has no BF16 tensor cores; modelled as fp16 mixed precision"
        if self.fp16_fp32acc_tflops:
            return self.fp16_fp32acc_tflops, "fp16_fp32acc_tflops", note
        return self.fp32_tflops, "fp32_tflops", (note + "; " if note else "") + "no FP16 tensor rate; FP32 used"

    def bandwidth_gbps_for(self, working_set_bytes: float) -> float:
        """Memory bandwidth (GB/s) for kernels touching ``working_set_bytes``.

        CPUs carry a measured curve of (bytes, GB/s) points (caches make small
        working sets faster), interpolated log-linearly; GPUs use the datasheet figure.
        """
        if not self.bandwidth_curve:
            return self.memory_bandwidth_gbps
        sizes = [math.log(size) for size, _ in self.bandwidth_curve]
        rates = [rate for _, rate in self.bandwidth_curve]
        return float(np.interp(math.log(max(working_set_bytes, 1.0)), sizes, rates))

    def pcie_gbps(self) -> float:
        """One-direction bandwidth (GB/s) of this GPU's x16 host link (gen 3 if unknown)."""
        return PCIE_X16_GBPS.get(self.pcie_gen or 3, PCIE_X16_GBPS[3])

    def link_gbps(self) -> float:
        """One-direction bandwidth (GB/s) of this GPU's best link to identical peers (NVLink, Infinity Fabric, PCIe)."""
        return self.peer_link_gbps / 2 if self.peer_link_gbps else self.pcie_gbps()


class GpuRow(StrictModel):
    """One row of a GPU YAML file; units as in ``GpuSpec``.

    ``model`` (the product without form factor or memory, "A100"), ``form_factor``
    and ``memory_gb`` let names like "A100 80GB SXM4" resolve; ``default_for_model``
    marks the row a bare model name means. ``nvlink_gbps`` is read as ``peer_link_gbps``.
    ``mig_instances``: the most MIG instances the part splits into (absent: no MIG; predictor/mig.py);
    ``mig_sms_per_slice``: SMs per MIG compute slice where published.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    vendor: Literal["nvidia", "amd", "other"] = "nvidia"
    model: Optional[str] = None
    form_factor: Optional[str] = None
    default_for_model: bool = False
    aliases: list[str] = Field(default_factory=list)
    architecture: str
    sm_count: int = Field(ge=1)
    memory_gb: float = Field(gt=0)
    memory_bandwidth_gbps: float = Field(gt=0)
    boost_clock_mhz: Optional[float] = Field(default=None, gt=0)
    fp32_tflops: float = Field(gt=0)
    tf32_tflops: Optional[float] = Field(default=None, gt=0)
    fp16_tflops: Optional[float] = Field(default=None, gt=0)
    fp16_fp32acc_tflops: Optional[float] = Field(default=None, gt=0)
    bf16_tflops: Optional[float] = Field(default=None, gt=0)
    fp8_tflops: Optional[float] = Field(default=None, gt=0)
    consumer: bool = False
    pcie_gen: Optional[int] = Field(default=None, ge=1, le=6)
    peer_link: Optional[str] = None
    peer_link_gbps: Optional[float] = Field(default=None, gt=0,
                                            validation_alias=AliasChoices("peer_link_gbps", "nvlink_gbps"))
    kind: Literal["gpu", "cpu"] = "gpu"
    host_op_us: Optional[float] = Field(default=None, gt=0)
    host_optimizer_tensor_us: Optional[float] = Field(default=None, gt=0)
    mig_instances: Optional[int] = Field(default=None, ge=2, le=8)
    mig_sms_per_slice: Optional[int] = Field(default=None, ge=1)
    source: str = Field(min_length=1)

    def to_spec(self) -> GpuSpec:
        data = self.model_dump()
        data["aliases"] = tuple(data["aliases"])
        return GpuSpec(**data)


class GpuFile(StrictModel):
    gpus: list[GpuRow] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_row_per_name(self) -> "GpuFile":
        seen: set[str] = set()
        for index, row in enumerate(self.gpus):
            if row.name in seen:
                raise ValueError(f"gpus[{index}] is a second row named {row.name!r}: one file holds one row per GPU "
                                 "(rename one, or remove it; a row in another file overrides the shipped one)")
            seen.add(row.name)
        return self


class GpuRegistry:
    """Known GPUs by name, alias and model parts; later additions override earlier ones."""

    def __init__(self) -> None:
        self.by_name: dict[str, GpuSpec] = {}
        self.names = NameIndex()
        self._noticed: set = set()

    def add(self, spec: GpuSpec) -> None:
        self.by_name[spec.name] = spec
        self.names.add(spec)

    def resolve(self, name: str) -> tuple[GpuSpec, Optional[str]]:
        """(row, notice): the notice says when an ambiguous name got the model's default row."""
        products = pci_product_names(name)
        if products:
            return self._resolve_products(name, products)
        try:
            match: NameMatch = self.names.resolve(name)
        except UnknownName as err:
            sliced = resolve_slice(self.resolve, self.siblings, name)
            if sliced:
                return sliced
            detail = err.detail or self.suggestion(normalize_name(name))
            raise ConfigError(f"unknown GPU {name!r}; {detail}; "
                              "add it to a GPU YAML file (see docs/predictor.md) and load it with --gpu-file") from None
        return self.by_name[match.row_name], match.notice

    def _product_rows(self, products: list[str]) -> tuple[list[GpuSpec], list[str]]:
        """(the rows the product names resolve to, each once, in order; the product names without a row)."""
        rows: dict[str, GpuSpec] = {}
        unknown = []
        for product in products:
            try:
                spec, _ = self.resolve(product)
            except ConfigError:
                unknown.append(product)
                continue
            rows.setdefault(spec.name, spec)
        return list(rows.values()), unknown

    def _listed_rows(self, name: str, products: list[str]) -> tuple[list[GpuSpec], list[str]]:
        """``_product_rows`` of a name that lists several parts; an error naming them when none has a row."""
        rows, unknown = self._product_rows(products)
        if not rows:
            raise ConfigError(f"unknown GPU {name!r}; none of the parts it names ({', '.join(products)}) has a row; "
                              "add it to a GPU YAML file (see docs/predictor.md) and load it with --gpu-file")
        return rows, unknown

    def _resolve_products(self, name: str, products: list[str]) -> tuple[GpuSpec, Optional[str]]:
        """A PCI ID database name ("Navi 31 [Radeon RX 7900 XT/7900 XTX]", what ``rocm-smi`` prints as a Radeon's
        "Card Series" where its ROCm lacks the marketing name): the one product it names, or the first of several
        that has a row, with a notice that it is a choice (detection settles it by memory: ``resolve_detected``)."""
        if len(products) == 1:
            return self.resolve(products[0])
        rows, unknown = self._listed_rows(name, products)
        return rows[0], _several_products_notice(name, rows[0], rows, unknown)

    def _detected_product(self, name: str, products: list[str], memory_gib: Optional[float],
                          sm_count: Optional[int]) -> GpuSpec:
        """The part of a PCI ID database name listing several ("Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/
        7900M]") whose row the device fits, else the first listed that fits, else the first listed. Silent only when
        one row fits and every listed part has a row: a part without one (the RX 7900M) may be the device whatever
        its memory, so then the part the memory picks is still said to be a choice."""
        rows, unknown = self._listed_rows(name, products)
        measured = memory_gib is not None or sm_count is not None
        fitting = [row for row in rows if _device_fits(row, memory_gib, sm_count)] if measured else []
        if len(fitting) == 1 and not unknown:
            return fitting[0]
        spec = fitting[0] if fitting else rows[0]
        if len(fitting) == 1:
            notice = _several_products_notice(name, spec, rows, unknown,
                                              "the listed part with a row that the device's memory fits")
        else:
            notice = _several_products_notice(name, spec, rows, unknown)
        self._notice_once(name, notice)
        return spec

    def siblings(self, row: GpuSpec) -> list[GpuSpec]:
        """The rows of ``row``'s model (itself included): "A100" has four."""
        same_model = self.names.by_model.get(normalize_name(row.model or ""), {})
        return [self.by_name[other.name] for other in same_model.values()]

    def resolve_detected(self, name: str, memory_gib: Optional[float] = None,
                         sm_count: Optional[int] = None) -> GpuSpec:
        """The row of a device a driver reported as ``name`` with ``memory_gib`` of memory and
        ``sm_count`` SMs / compute units (each None when the driver did not say).

        Drivers print one name for parts that differ: torch and rocm-smi list each die (GCD) of an
        MI250 as a 64 GiB device named like the 128 GB package, and torch names an MI250 die
        "AMD Instinct MI250X / MI250" (104 compute units; an MI250X die has 110). The named row
        stands when it matches the device; otherwise, among the rows of every model the name
        mentions, the one that matches the device's memory (within ``DETECTED_MEMORY_TOLERANCE``)
        and SM count is taken, if there is exactly one. A MIG instance ("NVIDIA A100-SXM4-40GB MIG 1g.5gb")
        gets its parent's row scaled to the instance, by the SM count reported when there is one; an AMD
        compute partition (an MI300X in CPX mode lists 8 devices of 38 CUs named like the whole GPU) gets
        its share of the row (predictor/amd_partitions.py).
        """
        products = pci_product_names(name)
        if len(products) == 1:
            return self.resolve_detected(products[0], memory_gib, sm_count)
        if products:
            return self._detected_product(name, products, memory_gib, sm_count)
        mig = split_mig_name(name) if normalize_name(name) not in self.names.exact else None
        if mig:
            spec, notice = resolve_mig(self.resolve, self.siblings, name, *mig, sm_count=sm_count)
            self._notice_once(name, notice)
            return spec
        spec, notice = self.resolve(name)
        candidates = [self.by_name[row.name] for model in self._models_named(name, spec)
                      for row in self.names.by_model.get(normalize_name(model), {}).values()]
        fitting = list({row.name: row for row in [spec, *candidates] if _device_fits(row, memory_gib, sm_count)}.values())
        if memory_gib is not None or sm_count is not None:
            if _device_fits(spec, memory_gib, sm_count) and (notice is None or fitting == [spec] or _named_apart(name, spec, fitting)):
                return spec
            if len(fitting) == 1:
                return fitting[0]
            partitions = partition_count(spec, sm_count) if not fitting else None
            if partitions:
                return partition_spec(spec, partitions)
        self._notice_once(name, notice)
        return spec

    def _models_named(self, name: str, spec: GpuSpec) -> list[str]:
        """The models a driver string mentions: its row's, and each '/'-separated part's."""
        models = [spec.model] if spec.model else []
        for part in name.split("/")[1:]:
            try:
                part_spec, _ = self.resolve(part.strip())
            except ConfigError:
                continue
            if part_spec.model:
                models.append(part_spec.model)
        return models

    def lookup(self, name: str) -> GpuSpec:
        spec, notice = self.resolve(name)
        self._notice_once(name, notice)
        return spec

    def _notice_once(self, name: str, notice: Optional[str]) -> None:
        if notice and name not in self._noticed:
            self._noticed.add(name)
            log.warning(notice)

    def suggestion(self, key: str) -> str:
        keys = list(self.names.exact)
        close_keys = [candidate for candidate in difflib.get_close_matches(key, keys, n=12, cutoff=0.5)
                      if _same_model_number(key, candidate)]
        close = list(dict.fromkeys(self.names.exact[k] for k in close_keys))[:3]
        if close:
            return "closest known: " + ", ".join(close)
        return f"{len(self.by_name)} GPUs known (list them: geodiloco predict --list-gpus)"


MODEL_NUMBER_SIMILARITY = 0.7
"""How alike two names' model numbers must be for one to be suggested for the other: "3900" and "3090"
(a typo, 0.75) are; "K80" and "H800" (another GPU that shares characters, 0.57) are not."""


def _model_number(key: str) -> str:
    """The first part of a normalized name that holds a digit ("2080" of "rtx 2080 ti", "k80" of "tesla k80")."""
    return next((part for part in re.split(r"[\s\-_]+", key) if any(char.isdigit() for char in part)), "")


def _same_model_number(key: str, candidate: str) -> bool:
    """Whether ``candidate`` may be what a user meant by ``key``: their model numbers are alike, or
    neither has one."""
    mine, theirs = _model_number(key), _model_number(candidate)
    if not mine or not theirs:
        return not mine and not theirs
    return difflib.SequenceMatcher(None, mine, theirs).ratio() >= MODEL_NUMBER_SIMILARITY


DETECTED_MEMORY_TOLERANCE = 0.12
"""Relative gap allowed between a row's memory (GB as sold) and a device's reported GiB (drivers
report 1-4 % less: ECC, reserved memory, GB vs GiB)."""


DRIVER_VENDOR_PREFIXES = ("nvidia ", "amd ")


def _driver_spellings(row: GpuSpec) -> set[str]:
    """The row's spellings that carry the vendor's name, as NVML, torch and rocm-smi print a part
    ("NVIDIA H200 NVL"), lower-cased with single spaces."""
    spellings = {" ".join(spelling.lower().split()) for spelling in (row.name, *row.aliases)}
    return {spelling for spelling in spellings if spelling.startswith(DRIVER_VENDOR_PREFIXES)}


def _named_apart(name: str, spec: GpuSpec, fitting: list[GpuSpec]) -> bool:
    """Whether a driver's ``name`` is ``spec``'s own full name and every other row the device fits has a
    full name of its own: a driver prints that one, so ``name`` is not a choice between them. "NVIDIA H200"
    is the SXM part because the NVL prints "NVIDIA H200 NVL"; both have 141 GB, so memory cannot tell."""
    printed = " ".join(name.lower().split())
    if printed not in _driver_spellings(spec):
        return False
    others = [row for row in fitting if row.name != spec.name]
    return all(_driver_spellings(row) and printed not in _driver_spellings(row) for row in others)


def _device_fits(row: GpuSpec, memory_gib: Optional[float], sm_count: Optional[int]) -> bool:
    """Whether a device a driver reported with ``memory_gib`` and ``sm_count`` (each None when unknown) is ``row``'s part."""
    return ((memory_gib is None or _memory_matches(row.memory_gb, memory_gib))
            and (sm_count is None or row.sm_count == sm_count))


def _several_products_notice(name: str, chosen: GpuSpec, rows: list[GpuSpec], unknown: list[str],
                             why: str = "the first listed; detection tells them apart by memory") -> str:
    """The notice for a PCI ID database name that lists several parts, planned as ``chosen`` (one of ``rows``)
    for the reason ``why``."""
    listed = ", ".join([row.name for row in rows if row.name != chosen.name] + [f"{part} (no row)" for part in unknown])
    return (f"GPU {name!r} could be several parts ({chosen.name}, {listed}); planned as {chosen.name}, {why}; "
            f"write the part's own name (e.g. \"{chosen.name}\") to choose")


def _memory_matches(row_memory_gb: float, device_memory_gib: float) -> bool:
    return abs(row_memory_gb - device_memory_gib) <= DETECTED_MEMORY_TOLERANCE * row_memory_gb


def read_gpu_file(path: str | Path) -> list[GpuSpec]:
    """Validate a GPU YAML file (``gpus:`` list of rows) and return its specs."""
    data = load_yaml_mapping(path, "a GPU YAML file (a gpus: list, shaped like predictor/data/gpus.yaml)")
    rows = validate(GpuFile, data, str(path))
    return [row.to_spec() for row in rows.gpus]


_registry: Optional[GpuRegistry] = None


GPU_FILES_ENV = "GEODILOCO_GPU_FILES"
"""Extra GPU row files, separated like PATH (os.pathsep), loaded over the shipped table."""


class GpuFilesError(ConfigError):
    """A GPU file named in ``$GEODILOCO_GPU_FILES`` cannot be read: an error of the setup, not an unknown GPU
    (every GPU would otherwise fall back to the stand-in)."""


def registry() -> GpuRegistry:
    global _registry
    if _registry is None:
        table = GpuRegistry()
        for spec in read_gpu_file(DATA_FILE):
            table.add(spec)
        for path in filter(None, os.environ.get(GPU_FILES_ENV, "").split(os.pathsep)):
            try:
                specs = read_gpu_file(path)
            except ConfigError as err:
                raise GpuFilesError(f"{GPU_FILES_ENV}: {err}; fix the path or unset the variable") from None
            for spec in specs:
                table.add(spec)
        _registry = table
    return _registry


def lookup_gpu(name: str) -> GpuSpec:
    """The datasheet row of ``name`` (vendor spellings accepted); ConfigError names the closest GPUs."""
    return registry().lookup(name)


def detected_gpu(name: str, memory_gib: Optional[float] = None, sm_count: Optional[int] = None) -> GpuSpec:
    """The datasheet row of a device a driver reported (name, memory, SM count); see GpuRegistry.resolve_detected."""
    return registry().resolve_detected(name, memory_gib, sm_count)


def resolve_gpu(name: str) -> tuple[GpuSpec, Optional[str]]:
    """(row, notice or None) for ``name``; the notice says which default an ambiguous name got."""
    return registry().resolve(name)


def load_user_gpus(path: str | Path) -> list[GpuSpec]:
    """Add (or override) GPUs from a YAML file shaped like predictor/data/gpus.yaml."""
    specs = read_gpu_file(path)
    for spec in specs:
        registry().add(spec)
    return specs


def known_gpus() -> list[GpuSpec]:
    return sorted(registry().by_name.values(), key=lambda spec: spec.name)


_COUNT_LIKE = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?)\s*[xX×*](?:\s+|$)(.*?)\s*$")
"""A count the user meant but wrote wrongly ("-2 x A30", "2.5 x A30", "4 x"): an error, not a GPU name."""


MAX_GPUS_PER_ENTRY = 65_536
"""Largest count in one ``"N x NAME"`` entry: far above any site's data-parallel group, and low enough that the
per-GPU lists a plan builds stay small (a count of 10^9 took minutes and gigabytes)."""


_COUNT_WITHOUT_X = re.compile(r"^\s*(\d+)\s+(.+?)\s*$")
_COUNT_X_JOINED = re.compile(r"^\s*(\d+)\s+[xX×*](\S.*?)\s*$")
""""4 xA30": a count whose "x" sticks to the name, which ``GPU_COUNT`` leaves whole (so "9070 XT" stays a name)."""
_COUNT_AFTER = re.compile(r"^\s*(\D.*?)\s+[xX×*]\s*(\d+)\s*$")


_count_forms_checked: dict[tuple[str, bool, int], Optional[str]] = {}
"""check_count_form's answers (the refusal, or None), by name and the table's size: a 10,000-node cluster repeats a
few names, and a lookup of an unknown one is slow."""


def check_count_form(name: str, counted: bool = False) -> None:
    """Refuse the other ways people write a count, which would otherwise read as one unknown GPU's name (planned
    like a stand-in, with one GPU): "4 A30", "A30 x 4", and two kinds in one entry ("2 x RTX 3090, 2 x A30", or
    "3× RTX 2080 Ti + 1× Titan RTX" as the report prints a node).
    Only where the name as written is no GPU the table knows and the GPU it would mean is one ("2080 Ti" stays)."""
    key = (name, counted, len(registry().by_name))
    if key not in _count_forms_checked:
        if len(_count_forms_checked) > 10_000:
            _count_forms_checked.clear()
        _count_forms_checked[key] = count_form_refusal(name, counted)
    if _count_forms_checked[key] is not None:
        raise ConfigError(_count_forms_checked[key])


def count_form_refusal(name: str, counted: bool) -> Optional[str]:
    """Why ``name`` is refused as a count written another way (see ``check_count_form``), or None."""
    if _resolves(name):
        return None
    if any(mark in name for mark in ",;+"):
        parts = [part.strip() for part in re.split(r"[,;+]", name) if part.strip()]
        if len(parts) > 1 and all(_resolves(GPU_COUNT.sub(r"\2", part)) for part in parts):
            listed = ", ".join(f'"{part}"' for part in parts)
            return f"{name!r}: one entry per kind of GPU; write them as list items: [{listed}]"
    if counted:  # "4 x A30": its count is written as it should be
        return None
    joined = _COUNT_X_JOINED.match(name)
    if joined and _resolves(joined.group(2)):
        return f"{name!r}: write a GPU count as \"{joined.group(1)} x {joined.group(2)}\" (a space on both sides of the x)"
    without_x = _COUNT_WITHOUT_X.match(name)
    if without_x and _resolves(without_x.group(2)):
        return f"{name!r}: write a GPU count as \"{without_x.group(1)} x {without_x.group(2)}\""
    after = _COUNT_AFTER.match(name)
    if after and _resolves(after.group(1)):
        return f"{name!r}: write the GPU count first: \"{after.group(2)} x {after.group(1)}\""
    return None


def _resolves(name: str) -> bool:
    try:
        resolve_gpu(name)
    except ConfigError:
        return False
    return True


def expand_gpu_counts(names: list[str]) -> list[str]:
    """``["4 x A30", "V100"]`` -> four ``"A30"`` entries and one ``"V100"`` (one entry per GPU)."""
    expanded: list[str] = []
    for name in names:
        match = GPU_COUNT.match(name) if isinstance(name, str) else None
        malformed = None if match or not isinstance(name, str) else _COUNT_LIKE.match(name)
        if malformed:
            raise ConfigError(f"{name!r}: a GPU count is a whole number of 1 or more followed by the GPU's name "
                              f"(e.g. \"4 x {malformed.group(2) or 'A30'}\")")
        if isinstance(name, str) and not name.strip():
            raise ConfigError(f"{name!r}: a GPU name is empty; name a GPU (e.g. \"A30\" or \"4 x A30\")")
        if isinstance(name, str):
            check_count_form(name, counted=match is not None)
        if isinstance(name, str) and re.match(r"^\s*[xX×*]\s+\S", name):
            raise ConfigError(f"{name!r}: the GPU count is missing before the 'x' (e.g. \"4 x "
                              f"{name.strip()[1:].strip()}\"), or drop the 'x' for one GPU")
        if match and int(match.group(1)) < 1:
            raise ConfigError(f"{name!r}: a GPU count must be at least 1 (write \"1 x {match.group(2)}\", or "
                             "leave the node's gpus empty for a CPU node)")
        if match and int(match.group(1)) > MAX_GPUS_PER_ENTRY:
            raise ConfigError(f"{name!r}: a GPU count of at most {MAX_GPUS_PER_ENTRY:,} per entry is planned (one "
                              "node is one site's data-parallel group); split the GPUs into several nodes")
        expanded.extend([match.group(2)] * int(match.group(1)) if match else [name])
    return expanded
