"""GPU names as drivers print them and as people write them, resolved to one table row.

NVML, ``nvidia-smi``, ``rocm-smi`` and ``torch.cuda.get_device_name`` each spell
a part their own way ("Tesla V100-SXM2-16GB", "NVIDIA A100 80GB PCIe",
"AMD Instinct MI250X / MI250"), and configs add more ("A100 80GB SXM4",
"H100 SXM5 80GB"). A name is resolved in two passes:

1. exact: the name, with vendor words and punctuation dropped, equals a row's
   name or one of its aliases;
2. by parts: the memory size ("80GB") and form factor ("SXM4", "PCIe", "NVL")
   are taken out wherever they appear, the rest must equal a row's ``model``,
   and the parts narrow the model's rows down (a row without a form factor, a
   part sold in one form, fits any). A model with several rows left
   (plain "A100") resolves to its ``default_for_model`` row, and the match
   carries a notice that says so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Protocol

VENDOR_WORDS = ("nvidia", "geforce", "tesla", "quadro", "amd", "instinct", "radeon", "graphics", "gpu",
                "generation", "accelerator", "edition")
MEMORY_TYPE_WORDS = ("hbm2e", "hbm2", "hbm3e", "hbm3", "gddr6x", "gddr6", "gddr7", "gddr5")
_MEMORY = re.compile(r"\b(\d+(?:\.\d+)?)\s*(?:gb|gib|g)\b")
_FORM_FACTOR = re.compile(r"\b(sxm[2-6]?|pci\s*e(?:\s*gen\s*\d)?|pcie|nvl|oam|gcd|superchip)\b")
# How far a memory size in a name may be from a row's marketed size and still mean that row: rounding and
# GB-versus-GiB spellings ("H100 NVL 94GB" for 94 or 96 GB) move it by a few percent, while parts sold in
# several sizes differ by far more ("RTX 3050 6GB Laptop GPU" is not the 4 GB part).
MEMORY_TOLERANCE_GB = 1.0
MEMORY_TOLERANCE_SHARE = 0.05


class NamedRow(Protocol):
    name: str
    aliases: tuple
    model: Optional[str]
    form_factor: Optional[str]
    memory_gb: float
    default_for_model: bool


def memory_size_fits(row_memory_gb: float, named_memory_gb: float) -> bool:
    """Whether a size written in a name (GB) means a row's marketed size (GB)."""
    return abs(row_memory_gb - named_memory_gb) <= max(MEMORY_TOLERANCE_GB, MEMORY_TOLERANCE_SHARE * row_memory_gb)


def normalize_name(name: str) -> str:
    """Lower case, vendor words and punctuation removed: 'NVIDIA GeForce RTX 2080 Ti' -> 'rtx2080ti'."""
    text = name.lower()
    text = re.sub(r"\b(" + "|".join(VENDOR_WORDS) + r")\b", " ", text)
    return re.sub(r"[^a-z0-9]", "", text)


_PCI_PRODUCT = re.compile(r"^(?P<chip>[^\[\]]*?\S)\s*\[(?P<product>[^\[\]]+)\]\s*$")
_MODEL_NUMBER = re.compile(r"\d")


def pci_product_names(name: str) -> list[str]:
    """The product names in a PCI ID database name ("<chip> [<products>]"), as ``rocm-smi`` prints a Radeon's
    "Card Series" where its ROCm lacks the marketing name: "Navi 31 [Radeon Pro W7900]" -> ["Radeon Pro W7900"];
    "Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]" -> ["Radeon RX 7900 XT", "Radeon RX 7900 XTX",
    "Radeon RX 7900 GRE", "Radeon RX 7900M"] (a later part that starts with its number takes the words the first
    has before its number). [] for any other name."""
    found = _PCI_PRODUCT.match(name.strip())
    if not found:
        return []
    parts = [" ".join(part.split()) for part in found.group("product").split("/") if part.strip()]
    if not parts:
        return []
    words = parts[0].split()
    first_number = next((index for index, word in enumerate(words) if _MODEL_NUMBER.search(word)), 0)
    prefix = " ".join(words[:first_number])
    return [parts[0]] + [f"{prefix} {part}" if prefix and part[0].isdigit() else part for part in parts[1:]]


def form_factor_family(form_factor: Optional[str]) -> Optional[str]:
    """'SXM4' -> 'sxm', 'PCIE' / 'PCI-e' -> 'pcie', 'NVL' -> 'nvl'; None stays None."""
    if not form_factor:
        return None
    key = re.sub(r"[^a-z0-9]", "", form_factor.lower())
    if key.startswith("sxm"):
        return "sxm"
    if key.startswith("pcie") or key.startswith("pci"):
        return "pcie"
    return key


@dataclass(frozen=True)
class NameParts:
    """A name split into model key, memory size (GB) and form factor, each None when absent."""

    model_key: str
    memory_gb: Optional[float]
    form_factor: Optional[str]


def split_name(name: str) -> NameParts:
    """Take the memory size and form factor out of ``name`` wherever they appear."""
    text = re.sub(r"[-_/,()+]", " ", name.lower())
    memory_gb = None
    memory = _MEMORY.search(text)
    if memory:
        memory_gb = float(memory.group(1))
        text = text[:memory.start()] + " " + text[memory.end():]
    form_factor = None
    found = _FORM_FACTOR.search(text)
    if found:
        form_factor = re.sub(r"\s+", "", found.group(1))
        form_factor = re.sub(r"gen\d", "", form_factor)
        text = text[:found.start()] + " " + text[found.end():]
    text = re.sub(r"\b(" + "|".join(MEMORY_TYPE_WORDS) + r")\b", " ", text)
    return NameParts(model_key=normalize_name(text), memory_gb=memory_gb, form_factor=form_factor)


@dataclass(frozen=True)
class NameMatch:
    """The row a name resolved to; ``notice`` says when a default was chosen among several rows."""

    row_name: str
    notice: Optional[str] = None


class UnknownName(LookupError):
    """No row matches; ``detail`` says what was close (a model with other sizes, say)."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


class NameIndex:
    """Exact spellings and model keys of a table's rows; later rows override earlier ones."""

    def __init__(self) -> None:
        self.exact: dict[str, str] = {}
        self.by_model: dict[str, dict[str, NamedRow]] = {}
        self.model_of: dict[str, str] = {}

    def add(self, row: NamedRow) -> None:
        for spelling in (row.name, *row.aliases):
            self.exact[normalize_name(spelling)] = row.name
        for models in self.by_model.values():
            models.pop(row.name, None)
        self.model_of.pop(row.name, None)
        if row.model:
            self.by_model.setdefault(normalize_name(row.model), {})[row.name] = row
            self.model_of[row.name] = normalize_name(row.model)

    def keys(self) -> Iterable[str]:
        return list(self.exact) + list(self.by_model)

    def resolve(self, name: str) -> NameMatch:
        """The row ``name`` means; UnknownName when none does."""
        key = normalize_name(name)
        if key in self.exact:
            row_name = self.exact[key]
            same_model = self.by_model.get(key, {})
            if len(same_model) > 1 and row_name in same_model:
                # a bare model name that is also a row's spelling ("NVIDIA GeForce RTX 3080" is printed for
                # the 10 GB and the 12 GB card): that row, but said to be a choice
                return NameMatch(row_name, self._several_parts(name, same_model[row_name], list(same_model.values())))
            return NameMatch(row_name)
        parts = split_name(name)
        rows = list(self.by_model.get(self._model_key(parts.model_key), {}).values())
        if not rows:
            raise UnknownName()
        narrowed = [row for row in rows if self._fits(row, parts)]
        if not narrowed:
            raise UnknownName(self._no_such_part(name, parts, rows))
        if len(narrowed) == 1:
            return NameMatch(narrowed[0].name)
        chosen = next((row for row in narrowed if row.default_for_model), narrowed[0])
        return NameMatch(chosen.name, self._several_parts(name, chosen, narrowed))

    def _model_key(self, key: str) -> str:
        """The model a name's rest (memory size and form factor taken out) means: a model's own key, or the model
        of the row whose spelling it is ("7900 XTX" in "7900 XTX 24GB" is an alias of the RX 7900 XTX)."""
        if key in self.by_model or key not in self.exact:
            return key
        return self.model_of.get(self.exact[key], key)

    def _several_parts(self, name: str, chosen: NamedRow, rows: list) -> str:
        """The notice for a name that several rows fit, ``chosen`` among them."""
        others = ", ".join(row.name for row in rows if row is not chosen)
        why = "the default" if chosen.default_for_model else "the first listed"
        return (f"GPU {name!r} could be several parts ({chosen.name}, {others}); planned as {chosen.name}, "
                f"{why}; write its memory size and form factor (e.g. \"{self._unambiguous_spelling(chosen)}\") "
                "to choose")

    def _unambiguous_spelling(self, row: NamedRow) -> str:
        """A spelling that means ``row`` alone: its model with memory size (and form factor), else its name or
        an alias that no other row shares (a row named like its model, "RTX 3080", needs the size:
        "RTX 3080 10GB"; parts alike but for their edition need the driver's full name)."""
        spellings = [f"{row.model} {row.memory_gb:g}GB"]
        if row.form_factor:
            spellings.append(f"{row.model} {row.memory_gb:g}GB {row.form_factor}")
        siblings = list(self.by_model.get(normalize_name(row.model or ""), {}).values())
        for spelling in spellings:
            key = normalize_name(spelling)
            if key in self.exact:
                if self.exact[key] == row.name and key not in self.by_model:
                    return spelling
                continue
            parts = split_name(spelling)
            if [sibling.name for sibling in siblings if self._fits(sibling, parts)] == [row.name]:
                return spelling
        for spelling in (row.name, *row.aliases):
            key = normalize_name(spelling)
            if self.exact.get(key) == row.name and len(self.by_model.get(key, {})) < 2:
                return spelling
        return row.name

    @staticmethod
    def _fits(row: NamedRow, parts: NameParts) -> bool:
        if parts.memory_gb is not None and not memory_size_fits(row.memory_gb, parts.memory_gb):
            return False
        if parts.form_factor is not None and row.form_factor is not None:
            return form_factor_family(row.form_factor) == form_factor_family(parts.form_factor)
        return True  # a part sold in one form ("L40S PCIe", "MI300X OAM") fits the form its name gives

    @staticmethod
    def _no_such_part(name: str, parts: NameParts, rows: list) -> str:
        asked = " ".join(filter(None, [f"{parts.memory_gb:g} GB" if parts.memory_gb else "",
                                       parts.form_factor or ""]))
        known = ", ".join(f"{row.name} ({row.memory_gb:g} GB, {row.form_factor or 'one form factor'})"
                          for row in rows)
        return f"{rows[0].model} comes as {known}; none matches {asked!r} in {name!r}"
