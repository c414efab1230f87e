"""Transformers models: built from config.json, trained through the runtime's contract, known to
the predictor (parameters and FLOPs checked against counts the project did not compute)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import transformers  # noqa: F401  (the dev extra has it: a missing one must fail, not skip)

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import parameter_count, training_flops
from geodiloco.runtime import preflight
from geodiloco.runtime.config import ModelSection, parse_config
from geodiloco.runtime.hf_model import build_hf_model
from tests.hf_helpers import llama_config

ROOT = Path(__file__).resolve().parent.parent
LLAMA_150M = ROOT / "experiments" / "configs" / "hf" / "llama_150m.json"


def meta_model(config_path: Path):
    from transformers import AutoConfig, AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(config_path)))


def test_150m_example_parameters_and_flops_match_transformers_and_torch_counts():
    """Parameters: transformers' own module tree; FLOPs: torch's FlopCounterMode over one real
    forward + backward of that module (meta tensors, so no 1 GB of activations)."""
    from torch.utils.flop_counter import FlopCounterMode

    dims = ModelSection(hf={"config": str(LLAMA_150M)}, seq_len=1024).dims()
    model = meta_model(LLAMA_150M)
    assert parameter_count(dims) == sum(param.numel() for param in model.parameters()) == 214_983_680
    seq_len = 1024
    tokens = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, use_cache=True).logits.float().sum().backward()  # meta: skip the packed-mask probe
    assert training_flops(dims, 1, seq_len) == pytest.approx(counter.get_total_flops(), rel=1e-3)


def test_grouped_query_and_tied_configs_count_like_transformers(tmp_path):
    config_path = llama_config(tmp_path / "config.json", tie=True)
    dims = ModelSection(hf={"config": str(config_path)}).dims()
    assert dims.num_kv_heads == 2 and dims.tie_embeddings
    model = build_hf_model(str(config_path), None, seed=0)
    assert model.hf.get_input_embeddings().weight is model.hf.get_output_embeddings().weight
    # parameters() lists the tied matrix once: that is what the pseudo-gradients cover
    assert sum(param.numel() for param in model.parameters()) == parameter_count(dims)


def test_loss_equals_transformers_own_shifted_loss(tmp_path):
    """The runtime passes inputs and already-shifted targets; transformers, given the whole
    sequence as labels, shifts them itself: both are the same next-token loss."""
    model = build_hf_model(str(llama_config(tmp_path / "config.json")), None, seed=0)
    with torch.no_grad():  # a trained-looking model, so the loss depends on which targets are scored
        for param in model.parameters():
            param.mul_(5)
    sequence = torch.randint(0, 320, (3, 17), generator=torch.Generator().manual_seed(0))
    ours = model(sequence[:, :-1], sequence[:, 1:]).item()
    theirs = model.hf(input_ids=sequence, labels=sequence).loss.item()
    unshifted = model(sequence[:, :-1], sequence[:, :-1]).item()
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert abs(ours - unshifted) > 1e-3 * ours


def test_same_seed_same_weights_and_pretrained_round_trip(tmp_path):
    config_path = str(llama_config(tmp_path / "config.json"))
    first, second = build_hf_model(config_path, None, seed=3), build_hf_model(config_path, None, seed=3)
    other = build_hf_model(config_path, None, seed=4)
    pairs = list(zip(first.parameters(), second.parameters(), other.parameters()))
    assert all(torch.equal(a, b) for a, b, _ in pairs)
    assert not all(torch.equal(a, c) for a, _, c in pairs)
    first.hf.save_pretrained(tmp_path / "saved")
    loaded = build_hf_model(None, str(tmp_path / "saved"), seed=99)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), loaded.parameters()))


@pytest.mark.parametrize("model, message", [
    ({"hf": {"config": "missing.json"}}, "model.hf.config: missing.json does not exist"),
    ({"hf": {"config": "x.json", "pretrained": "y"}}, "give exactly one of model.hf.config"),
    ({"preset": "tiny", "hf": {"config": "x.json"}}, "give exactly one of model.preset, model.file or model.hf"),
])
def test_model_section_errors_name_the_field(model, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config({"model": model, "nodes": [{"name": "a", "gpus": ["A30"]}]}, "run.yaml")


def test_a_config_json_without_model_type_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 64}')
    with pytest.raises(ConfigError, match="has no model_type"):
        parse_config({"model": {"hf": {"config": str(path)}}, "nodes": [{"name": "a", "gpus": ["A30"]}]}, "run.yaml")


def test_a_missing_extra_is_named_before_anything_starts(tmp_path, monkeypatch):
    config = parse_config({"model": {"hf": {"config": str(llama_config(tmp_path / "config.json"))}},
                           "logging": {"tensorboard": str(tmp_path / "tb")},
                           "nodes": [{"name": "a", "gpus": ["A30"]}]}, "run.yaml")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "transformers" else real_find_spec(name, *args))
    with pytest.raises(ConfigError, match=r"model\.hf needs the hf extra \(transformers not installed\): "
                                          r"pip install -e '\.\[hf\]' in the checkout"):
        preflight.preflight(config)


def test_export_and_evaluate_of_a_transformers_run_name_the_missing_extra(tmp_path, monkeypatch, capsys):
    import yaml

    from geodiloco.runtime.cli import main
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "model": {"hf": {"config": str(llama_config(tmp_path / "config.json"))}},
        "nodes": [{"name": "a", "gpus": ["A30"]}]}))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "transformers" else real_find_spec(name, *args))
    for command in (["export", str(run_dir), "--out", str(tmp_path / "out")], ["evaluate", str(run_dir)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "model.hf needs the hf extra (transformers not installed): pip install -e '.[hf]' in the checkout" in err, err
        assert "Traceback" not in err


def test_plan_reads_the_transformers_config_of_a_run_config(tmp_path):
    """`geodiloco plan --cluster run.yaml` plans the run's transformers model, not a default preset."""
    import yaml

    from geodiloco.balancer.setup import load_setup
    config_path = llama_config(tmp_path / "config.json")
    run_config = tmp_path / "run.yaml"
    run_config.write_text(yaml.safe_dump({"model": {"hf": {"config": str(config_path)}, "seq_len": 64},
                                          "nodes": [{"name": "a", "gpus": ["A30"]}]}))
    setup = load_setup(run_config)
    assert setup.dims == ModelSection(hf={"config": str(config_path)}).dims()
    assert setup.dims.vocab_size == 320 and setup.dims.num_kv_heads == 2


def test_a_model_that_attends_to_later_tokens_is_refused_and_its_decoder_mode_accepted(tmp_path):
    import json

    from geodiloco.runtime.hf_model import build_hf_model
    bert = {"model_type": "bert", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "vocab_size": 320, "max_position_embeddings": 64}
    (tmp_path / "bert.json").write_text(json.dumps(bert))
    with pytest.raises(ConfigError, match=r"model\.hf\.config: the 'bert' model attends to later tokens .* set "
                                          r"\"is_decoder\": true"):
        build_hf_model(str(tmp_path / "bert.json"), None, 0)
    (tmp_path / "decoder.json").write_text(json.dumps(dict(bert, is_decoder=True)))
    decoder = build_hf_model(str(tmp_path / "decoder.json"), None, 0)
    tokens = torch.tensor([[5, 6, 7, 8]])
    changed = torch.tensor([[5, 6, 7, 9]])
    decoder.eval()
    assert torch.equal(decoder(tokens)[0, :3], decoder(changed)[0, :3])
    assert decoder.hf.training is False and build_hf_model(str(llama_config(tmp_path / "llama.json")), None, 0).training
