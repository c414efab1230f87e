"""GPU efficiency constants: the shipped file loads, bad files are refused by field, the fit sees
only the dev third, and each fitted class moves only its own kernels."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import yaml

from geodiloco.predictor import kernels
from geodiloco.predictor.kernels import FITTED_FIELDS, gpu_efficiency, load_gpu_efficiency, micro_batch_time
from geodiloco.predictor.specs import lookup_gpu
from geodiloco.predictor.workload import ModelDims, TrainingCode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "predictor"))

import bench_published  # noqa: E402
import fit_efficiency  # noqa: E402

BERT_LIKE = ModelDims(hidden_size=1024, intermediate_size=2731, num_layers=24, num_heads=16, vocab_size=30522,
                      max_seq_len=384, tie_embeddings=True)
EAGER_GPT = TrainingCode(block="gpt", attention="eager", lm_head_fraction=0.0)


def test_shipped_constants_are_fractions_and_say_how_they_were_fitted():
    document = yaml.safe_load(kernels.EFFICIENCY_FILE.read_text())
    eff = load_gpu_efficiency()
    for name in FITTED_FIELDS:
        assert 0.05 <= getattr(eff, name) <= 1.0
    assert document["fit"]["fields"] == list(FITTED_FIELDS)
    assert "dev third" in document["fit"]["on"]
    assert document["fit"]["rows"] > 50


@pytest.mark.parametrize("field, value, message", [
    ("matmul", 1.4, "efficiency.matmul must be in (0, 1], got 1.4"),
    ("elementwise", 0.0, "efficiency.elementwise must be in (0, 1], got 0.0"),
    ("optimizer", None, "efficiency lacks optimizer"),
])
def test_a_bad_constants_file_names_the_field(tmp_path, field, value, message):
    document = yaml.safe_load(kernels.EFFICIENCY_FILE.read_text())
    if value is None:
        del document["efficiency"][field]
    else:
        document["efficiency"][field] = value
    path = tmp_path / "eff.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_gpu_efficiency(path)


def test_the_fit_sees_no_held_out_row():
    data = yaml.safe_load(bench_published.DATA_FILE.read_text())
    rows = fit_efficiency.dev_rows(data["measurements"], data["workloads"])
    assert rows and not any(bench_published.held_out(row["id"]) for row in rows)
    # about a third of the placeable rows: the split is by a hash of the id, not by hand
    assert 0.25 < len(rows) / len(data["measurements"]) < 0.42
    # the shipped share applies to the architectures the dev rows have half-rate mixed precision on, no others
    assert fit_efficiency.half_rate_architectures(rows) == kernels.GPU_EFFICIENCY.half_rate_fp16_architectures
    assert "turing" not in kernels.GPU_EFFICIENCY.half_rate_fp16_architectures


@pytest.mark.parametrize("field, moved", [
    ("elementwise", "elementwise_s"),
    ("score_matmul", "attention_s"),
])
def test_each_fitted_class_scales_only_its_kernels(field, moved):
    """Halving one efficiency doubles that kernel class's time (it is bandwidth- or rate-bound
    throughout) and leaves the GEMMs alone."""
    a100 = lookup_gpu("A100-SXM4-80GB")
    base = kernels.GPU_EFFICIENCY
    before = micro_batch_time(a100, BERT_LIKE, 384, "fp16", 8, code=EAGER_GPT)
    with gpu_efficiency(dataclasses.replace(base, **{field: getattr(base, field) / 2})):
        after = micro_batch_time(a100, BERT_LIKE, 384, "fp16", 8, code=EAGER_GPT)
    assert after.matmul_compute_s == before.matmul_compute_s
    if field == "elementwise":
        assert after.elementwise_s == pytest.approx(2 * before.elementwise_s)
    else:
        assert before.attention_s < after.attention_s < 2 * before.attention_s  # score traffic is elementwise
    assert kernels.efficiency_for(a100) is base  # the trial constants are gone after the block
