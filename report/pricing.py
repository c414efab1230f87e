"""GPU price table in US dollars per GPU-hour, from ``--price NAME=USD``, ``--price node:NODE=USD`` and YAML files.

Names match case-insensitively with runs of spaces collapsed, so ``"rtx 2080ti"``
does not silently match ``"RTX 2080 Ti"`` but ``"rtx  2080 ti"`` does. A price given on the
command line overrides a file's for the same GPU whatever their order (files are price lists,
the command line is this report's choice); a node's price overrides its GPUs' (a run whose
config did not name its GPUs can still be priced).
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from geodiloco.report.errors import ReportError


def gpu_key(name: str) -> str:
    """The form GPU names are compared in."""
    return " ".join(name.split()).casefold()


@dataclass
class PriceTable:
    """USD per GPU-hour by GPU name; ``sources`` says where each entry came from (for messages)."""

    usd_per_gpu_hour: dict[str, float] = field(default_factory=dict)
    display_names: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    catalog: set[str] = field(default_factory=set)
    """Names priced by a file: a price list may hold more GPUs than the runs have."""
    usd_per_node_gpu_hour: dict[str, float] = field(default_factory=dict)
    """``--price node:NODE=USD``: every GPU of that node, by node name (exact)."""
    node_sources: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, usd_per_gpu_hour: float, source: str, from_file: bool = False) -> None:
        _check_price(name, usd_per_gpu_hour, source, "GPU name", "NAME=USD_PER_GPU_HOUR, e.g. A30=0.60")
        key = gpu_key(name)
        self.usd_per_gpu_hour[key] = float(usd_per_gpu_hour)
        self.display_names[key] = " ".join(name.split())
        self.sources[key] = source
        if from_file:
            self.catalog.add(key)
        else:
            self.catalog.discard(key)

    def add_node(self, node: str, usd_per_gpu_hour: float, source: str) -> None:
        _check_price(node, usd_per_gpu_hour, source, "node name", "node:NODE=USD_PER_GPU_HOUR, e.g. node:a=0.60")
        self.usd_per_node_gpu_hour[node] = float(usd_per_gpu_hour)
        self.node_sources[node] = source

    def __bool__(self) -> bool:
        return bool(self.usd_per_gpu_hour) or bool(self.usd_per_node_gpu_hour)

    def price(self, gpu_name: str) -> float | None:
        return self.usd_per_gpu_hour.get(gpu_key(gpu_name))

    def node_price(self, node: str) -> float | None:
        return self.usd_per_node_gpu_hour.get(node)

    def close_names(self, gpu_name: str) -> list[str]:
        """Priced names close to ``gpu_name`` (a price file's "RTX 2080Ti" for a run's "RTX 2080 Ti")."""
        names = list(self.display_names.values())
        key = gpu_key(gpu_name)
        containing = [name for name in names if key in gpu_key(name) or gpu_key(name) in key]  # "NVIDIA A30"
        return list(dict.fromkeys(containing + difflib.get_close_matches(gpu_name, names, n=2, cutoff=0.85)))[:2]

    def applied(self, keys: set[str]) -> list[tuple[str, float, str]]:
        """(name, USD per GPU-hour, where it came from) of the priced names in ``keys`` (``gpu_key`` forms), for
        the report to say which prices it used."""
        return [(self.display_names[key], self.usd_per_gpu_hour[key], self.sources[key])
                for key in sorted(keys) if key in self.usd_per_gpu_hour]

    def check_known(self, run_gpu_names: set[str], run_node_names: set[str] = frozenset()) -> None:
        """Every GPU priced with ``--price NAME=USD`` must be one the runs have, and every ``node:NODE`` one of
        their nodes: a name that matches none is a typo. A price file is a list that may hold other GPUs too."""
        for node in self.usd_per_node_gpu_hour:
            if node not in run_node_names:
                hint = difflib.get_close_matches(node, sorted(run_node_names), n=1, cutoff=0.5)
                raise ReportError(f"{self.node_sources[node]}: unknown node {node!r}: the run(s) have "
                                  f"{', '.join(sorted(run_node_names)) or 'no nodes'}"
                                  + (f"; did you mean {hint[0]!r}?" if hint else ""))
        known = {gpu_key(name): name for name in run_gpu_names}
        for key, display in self.display_names.items():
            if key in known or key in self.catalog:
                continue
            hint = difflib.get_close_matches(display, sorted(known.values()), n=1, cutoff=0.5)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            if not known:
                suggestion = "; price its nodes instead: --price \"node:NODE=USD_PER_GPU_HOUR\""
            listed = ", ".join(sorted(known.values())) or "none named"
            raise ReportError(f"{self.sources[key]}: unknown GPU {display!r}: no node of the run(s) has it "
                              f"(GPUs in the logs: {listed}){suggestion}")


def _parse_usd(text: object, name: str, source: str) -> float:
    if isinstance(text, bool):
        raise ReportError(f"{source}: price for {name!r} must be a number of USD per GPU-hour, got the YAML boolean "
                          f"{str(text).lower()} (yes/no/on/off read as booleans); write a number, e.g. \"A30: 0.60\"")
    try:
        return float(str(text).strip().lstrip("$"))
    except ValueError:
        shown = repr(text) if not isinstance(text, (dict, list)) else f"a {type(text).__name__}"
        raise ReportError(f"{source}: price for {name!r} must be a number of USD per GPU-hour, got {shown[:80]}"
                          " (a price file maps GPU names to numbers: \"A30: 0.60\")") from None


def _check_price(name: str, usd_per_gpu_hour: float, source: str, what: str, form: str) -> None:
    if not name.strip():
        raise ReportError(f"{source}: empty {what}; write {form}")
    if not math.isfinite(usd_per_gpu_hour) or usd_per_gpu_hour < 0:
        raise ReportError(f"{source}: price for {name!r} must be a finite number >= 0 USD per GPU-hour, "
                          f"got {usd_per_gpu_hour}")


class _PriceFileLoader(yaml.SafeLoader):
    """YAML that refuses a GPU priced twice in one mapping: PyYAML keeps the last silently, and a price list
    edited by hand ("A30: 0.60" left above a new "A30: 6.0") would price the run with either."""

    def construct_mapping(self, node, deep=False):
        seen: dict[str, int] = {}
        for key_node, _ in node.value:
            key = gpu_key(str(self.construct_object(key_node, deep=True)))
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ReportError(f"{self.name}: line {line}: {key_node.value!r} is priced twice (first at line "
                                  f"{seen[key]}); keep one price per GPU")
            seen[key] = line
        return super().construct_mapping(node, deep)


def _load_price_file(path: Path, table: PriceTable) -> None:
    try:
        loader = _PriceFileLoader(path.read_text(encoding="utf-8"))
        loader.name = str(path)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
        raise ReportError(f"{path}: price file is not readable YAML ({type(err).__name__})") from None
    if isinstance(data, dict) and set(data) == {"usd_per_gpu_hour"}:
        data = data["usd_per_gpu_hour"]
    if not isinstance(data, dict) or not data:
        raise ReportError(f"{path}: price file must be a YAML mapping of GPU name to USD per GPU-hour, "
                          "e.g. 'A30: 0.60'")
    for name, usd in data.items():
        if str(name).startswith("node:"):
            table.add_node(str(name).removeprefix("node:").strip(), _parse_usd(usd, str(name), str(path)), f"{path}")
            continue
        table.add(str(name), _parse_usd(usd, str(name), str(path)), f"{path}", from_file=True)


def parse_prices(specs: list[str]) -> PriceTable:
    """Build a price table from ``--price`` values: ``NAME=USD`` and ``node:NODE=USD`` pairs, or paths of YAML
    files. Files are read first, in order (a later file's price replaces an earlier one's); then the pairs, which
    override them; a pair given twice for one name is refused."""
    table = PriceTable()
    pairs = [spec for spec in specs if "=" in spec]
    for spec in specs:
        if "=" in spec:
            continue
        if Path(spec).is_file():
            _load_price_file(Path(spec), table)
        elif spec.lower().endswith((".yaml", ".yml")) or Path(spec).exists():
            raise ReportError(f"--price {spec}: no such price file" if not Path(spec).exists()
                              else f"--price {spec}: not a file; give a YAML price file")
        else:
            raise ReportError(f"--price {spec!r}: expected NAME=USD_PER_GPU_HOUR (e.g. --price \"A30=0.60\") "
                              "or the path of a YAML price file")
    given: dict[str, str] = {}
    for spec in pairs:
        name, _, usd = spec.rpartition("=")
        key = gpu_key(name)
        if key in given:
            raise ReportError(f"--price {spec!r}: {name.strip()!r} was priced already by --price {given[key]!r}; "
                              "give one price per name")
        given[key] = spec
        price = _parse_usd(usd, name, f"--price {spec!r}")
        if name.startswith("node:"):
            table.add_node(name.removeprefix("node:").strip(), price, f"--price {spec!r}")
        else:
            table.add(name, price, f"--price {spec!r}")
    return table
