"""GPU names as drivers print them and people write them resolve to the right table row."""
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from geodiloco.predictor.gpu_names import NameIndex, UnknownName, pci_product_names, split_name
from geodiloco.predictor.specs import known_gpus, resolve_gpu


@dataclass(frozen=True)
class Row:
    name: str
    model: str
    form_factor: str | None
    memory_gb: float
    default_for_model: bool = False
    aliases: tuple = ()


def a100_index() -> NameIndex:
    index = NameIndex()
    for row in (Row("A100-PCIE-40GB", "A100", "PCIe", 40), Row("A100-PCIE-80GB", "A100", "PCIe", 80),
                Row("A100-SXM4-40GB", "A100", "SXM4", 40), Row("A100-SXM4-80GB", "A100", "SXM4", 80, True),
                Row("RTX 6000 Ada", "RTX 6000 Ada", None, 48, aliases=("NVIDIA RTX 6000 Ada Generation",)),
                Row("Quadro RTX 6000", "Quadro RTX 6000", None, 24)):
        index.add(row)
    return index


@pytest.mark.parametrize("name, parts", [
    ("NVIDIA A100-SXM4-80GB", ("a100", 80.0, "sxm4")),
    ("A100 80GB SXM4", ("a100", 80.0, "sxm4")),
    ("H100 SXM5 80GB", ("h100", 80.0, "sxm5")),
    ("NVIDIA A100 80GB PCIe", ("a100", 80.0, "pcie")),
    ("a100-pcie-40gb", ("a100", 40.0, "pcie")),
    ("Tesla V100-PCI-E-32GB", ("v100", 32.0, "pcie")),
    ("NVIDIA H100 NVL", ("h100", None, "nvl")),
    ("NVIDIA H100 80GB HBM3", ("h100", 80.0, None)),
    ("RTX 4060 Ti 16 GB", ("rtx4060ti", 16.0, None)),
    ("AMD Instinct MI300X", ("mi300x", None, None)),
])
def test_memory_and_form_factor_are_taken_out_wherever_they_stand(name, parts):
    split = split_name(name)
    assert (split.model_key, split.memory_gb, split.form_factor) == parts


@pytest.mark.parametrize("name, row", [
    ("A100 80GB SXM4", "A100-SXM4-80GB"),
    ("SXM4 A100 40 GB", "A100-SXM4-40GB"),
    ("nvidia a100 pcie 80gb", "A100-PCIE-80GB"),
    ("A100 SXM 40GB", "A100-SXM4-40GB"),
    ("A100-PCIE-40GB", "A100-PCIE-40GB"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ("Quadro RTX 6000", "Quadro RTX 6000"),
    ("RTX 6000 Ada PCIe 48GB", "RTX 6000 Ada"),  # a part sold in one form fits the form a name gives it
])
def test_any_order_of_model_form_factor_and_memory_resolves(name, row):
    match = a100_index().resolve(name)
    assert (match.row_name, match.notice) == (row, None)


def test_an_ambiguous_name_takes_the_default_and_says_so():
    match = a100_index().resolve("A100")
    assert match.row_name == "A100-SXM4-80GB"
    assert "could be several parts" in match.notice and "A100-PCIE-40GB" in match.notice
    pcie = a100_index().resolve("A100 PCIe")  # two PCIe parts left, neither the default: the first, with a notice
    assert pcie.row_name == "A100-PCIE-40GB" and "A100-PCIE-80GB" in pcie.notice
    assert "the first listed" in pcie.notice and "the default" not in pcie.notice
    assert "planned as A100-SXM4-80GB, the default" in match.notice


def test_a_size_the_model_does_not_come_in_names_the_sizes_it_does():
    with pytest.raises(UnknownName) as err:
        a100_index().resolve("A100 48GB")
    assert "A100 comes as A100-PCIE-40GB (40 GB, PCIe)" in err.value.detail and "'48 GB'" in err.value.detail


@pytest.mark.parametrize("written, row", [
    ("7900 XTX 24GB", "RX 7900 XTX"),        # an alias of the row ("7900 XTX") with its memory size
    ("9070 XT 16GB", "RX 9070 XT"),
    ("9060 XT 8GB", "RX 9060 XT 8GB"),
    ("9060 XT 16GB", "RX 9060 XT"),          # the alias names the 16 GB row; the size keeps it there
    ("7800 XT 16 GB", "RX 7800 XT"),
])
def test_a_short_spelling_with_a_memory_size_resolves_to_its_row(written, row):
    spec, notice = resolve_gpu(written)
    assert (spec.name, notice) == (row, None)


def test_a_short_spelling_with_a_size_the_part_lacks_names_the_sizes_it_has():
    with pytest.raises(ValueError) as err:
        resolve_gpu("9070 XT 12GB")
    assert "RX 9070 XT comes as RX 9070 XT (16 GB, one form factor)" in str(err.value)


def test_a_model_not_in_the_index_is_unknown():
    with pytest.raises(UnknownName):
        a100_index().resolve("Z9000")


@pytest.mark.parametrize("name, products", [
    ("Navi 31 [Radeon Pro W7900]", ["Radeon Pro W7900"]),
    ("Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]",
     ["Radeon RX 7900 XT", "Radeon RX 7900 XTX", "Radeon RX 7900 GRE", "Radeon RX 7900M"]),
    ("Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]", ["Radeon RX 6800", "Radeon RX 6800 XT", "Radeon RX 6900 XT"]),
    ("Aldebaran/MI200 [Instinct MI210]", ["Instinct MI210"]),
    ("AMD Instinct MI250X / MI250", []),     # a marketing name, not a PCI ID database one
    ("AMD Radeon RX 7900 XTX", []),
])
def test_pci_id_database_names_list_the_products_they_name(name, products):
    assert pci_product_names(name) == products


@pytest.mark.parametrize("name", ["AMD Radeon PRO W7900 Dual Slot", "AMD Radeon Pro W7800 48GB",
                                  "Navi 31 [Radeon Pro W7800 48GB]", "AMD Radeon RX 7900M"])
def test_radeon_parts_without_a_sourced_row_are_unknown_not_a_neighbour(name):
    """The W7900 Dual Slot and the 48 GB W7800 (ROCm supports both) have no row: no sourced rate was found; a name
    of theirs takes the unknown-GPU path instead of planning the card as its neighbour."""
    with pytest.raises(ValueError):
        resolve_gpu(name)


DRIVER_STRINGS = yaml.safe_load((Path(__file__).parent / "data" / "gpu_driver_strings.yaml").read_text())


@pytest.mark.parametrize("entry", DRIVER_STRINGS, ids=[entry["string"] for entry in DRIVER_STRINGS])
def test_driver_strings_and_config_spellings_resolve_to_their_row(entry):
    spec, notice = resolve_gpu(entry["string"])
    assert spec.name == entry["row"]
    assert (notice is not None) == bool(entry.get("ambiguous")), notice


def test_every_table_row_has_a_source_and_training_rates():
    specs = known_gpus()
    assert len(specs) >= 90
    for spec in specs:
        assert spec.source and spec.memory_gb > 0 and spec.memory_bandwidth_gbps > 0 and spec.fp32_tflops > 0
        if spec.architecture not in ("pascal", "volta", "turing") and not spec.name.startswith("GTX"):
            assert spec.bf16_tflops, spec.name
    # the halved FP32-accumulate rate is GeForce's; Radeon RX cards (consumer too) run WMMA at one rate
    geforce = [spec for spec in specs if spec.consumer and spec.vendor == "nvidia" and spec.fp16_tflops
               and spec.fp16_fp32acc_tflops and "TITAN" not in spec.name.upper()]
    assert geforce and all(spec.fp16_fp32acc_tflops == pytest.approx(spec.fp16_tflops / 2, rel=0.02)
                           for spec in geforce)


def test_each_model_with_several_rows_has_exactly_one_default():
    by_model: dict = {}
    for spec in known_gpus():
        if spec.model:
            by_model.setdefault(spec.model, []).append(spec)
    for model, rows in by_model.items():
        if len(rows) > 1:
            assert sum(row.default_for_model for row in rows) == 1, model


def test_the_spelling_a_notice_suggests_means_that_row_alone():
    """Every row of a model with several rows: the name its notice tells the user to write resolves to it
    with no notice (a row named like its model, "RTX 3080", is suggested as "RTX 3080 10GB")."""
    from geodiloco.predictor.specs import registry
    index = registry().names
    checked = 0
    for rows in index.by_model.values():
        if len(rows) < 2:
            continue
        for row in rows.values():
            spelling = index._unambiguous_spelling(row)
            match = index.resolve(spelling)
            assert (match.row_name, match.notice) == (row.name, None), (row.name, spelling)
            checked += 1
    assert checked >= 40
    notice = resolve_gpu("NVIDIA GeForce RTX 3080")[1]
    assert notice and '(e.g. "RTX 3080 10GB")' in notice


OPEN_DRIVER = yaml.safe_load((Path(__file__).parent / "data" / "nvidia_open_driver_names.yaml").read_text())


def test_every_name_the_open_driver_lists_resolves_unless_listed_as_not_covered():
    """The names NVML prints for every GPU NVIDIA's open driver supports: each resolves to a row, except the
    parts listed as not covered (laptop and embedded parts without sourced figures, mining and display
    boards), which take the unknown-GPU path. A row added for one of those must take it off the list."""
    unknown = []
    for name in OPEN_DRIVER["names"]:
        try:
            resolve_gpu(name)
        except ValueError:
            unknown.append(name)
    assert sorted(unknown) == sorted(OPEN_DRIVER["not_covered"])
    assert all(reason != "not covered" for reason in OPEN_DRIVER["not_covered"].values())  # each says why
