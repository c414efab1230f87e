"""GPU price table in US dollars per GPU-hour, from ``--price NAME=USD`` and YAML files.

Names match case-insensitively with runs of spaces collapsed, so ``"rtx 2080ti"``
does not silently match ``"RTX 2080 Ti"`` but ``"rtx  2080 ti"`` does.
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

    def add(self, name: str, usd_per_gpu_hour: float, source: str, from_file: bool = False) -> None:
        if not name.strip():
            raise ReportError(f"{source}: empty GPU name; write NAME=USD_PER_GPU_HOUR, e.g. A30=0.60")
        if not math.isfinite(usd_per_gpu_hour) or usd_per_gpu_hour < 0:
            raise ReportError(f"{source}: price for {name!r} must be a finite number >= 0 USD per GPU-hour, "
                              f"got {usd_per_gpu_hour}")
        key = gpu_key(name)
        self.usd_per_gpu_hour[key] = float(usd_per_gpu_hour)
        self.display_names[key] = " ".join(name.split())
        self.sources[key] = source
        if from_file:
            self.catalog.add(key)
        else:
            self.catalog.discard(key)

    def __bool__(self) -> bool:
        return bool(self.usd_per_gpu_hour)

    def price(self, gpu_name: str) -> float | None:
        return self.usd_per_gpu_hour.get(gpu_key(gpu_name))

    def check_known(self, run_gpu_names: set[str]) -> None:
        """Every GPU priced with ``--price NAME=USD`` must be one the runs have: a name that matches none is
        a typo. A price file is a list that may hold other GPUs too."""
        known = {gpu_key(name): name for name in run_gpu_names}
        for key, display in self.display_names.items():
            if key in known or key in self.catalog:
                continue
            hint = difflib.get_close_matches(display, sorted(known.values()), n=1, cutoff=0.5)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            listed = ", ".join(sorted(known.values())) or "none named"
            raise ReportError(f"{self.sources[key]}: unknown GPU {display!r}: no node of the run(s) has it "
                              f"(GPUs in the logs: {listed}){suggestion}")


def _parse_usd(text: object, name: str, source: str) -> float:
    if isinstance(text, bool):
        text = "bool"
    try:
        return float(str(text).strip().lstrip("$"))
    except ValueError:
        shown = repr(text) if not isinstance(text, (dict, list)) else f"a {type(text).__name__}"
        raise ReportError(f"{source}: price for {name!r} must be a number of USD per GPU-hour, got {shown[:80]}"
                          " (a price file maps GPU names to numbers: \"A30: 0.60\")") from None


def _load_price_file(path: Path, table: PriceTable) -> None:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
        raise ReportError(f"{path}: price file is not readable YAML ({type(err).__name__})") from None
    if isinstance(data, dict) and set(data) == {"usd_per_gpu_hour"}:
        data = data["usd_per_gpu_hour"]
    if not isinstance(data, dict) or not data:
        raise ReportError(f"{path}: price file must be a YAML mapping of GPU name to USD per GPU-hour, "
                          "e.g. 'A30: 0.60'")
    for name, usd in data.items():
        table.add(str(name), _parse_usd(usd, str(name), str(path)), f"{path}", from_file=True)


def parse_prices(specs: list[str]) -> PriceTable:
    """Build a price table from ``--price`` values: ``NAME=USD`` pairs or paths of YAML files."""
    table = PriceTable()
    for spec in specs:
        if "=" in spec:
            name, _, usd = spec.rpartition("=")
            table.add(name, _parse_usd(usd, name, f"--price {spec!r}"), f"--price {spec!r}")
        elif Path(spec).is_file():
            _load_price_file(Path(spec), table)
        elif spec.lower().endswith((".yaml", ".yml")) or Path(spec).exists():
            raise ReportError(f"--price {spec}: no such price file" if not Path(spec).exists()
                              else f"--price {spec}: not a file; give a YAML price file")
        else:
            raise ReportError(f"--price {spec!r}: expected NAME=USD_PER_GPU_HOUR (e.g. --price \"A30=0.60\") "
                              "or the path of a YAML price file")
    return table
