"""A transformers run keeps its model config and tokenizer; evaluate and export read those copies, and a
model that no longer fits the checkpoints is refused in one line."""
import pytest
import torch
from torch import nn

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.run_files import MODEL_DIR, TOKENIZER_DIR, load_parameters, load_run_config


def test_parameters_of_another_shape_or_count_are_refused_naming_the_model_source():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    fitting = [torch.full_like(param, 0.5) for param in model.parameters()]
    load_parameters(model, fitting, "model.preset (tiny)")
    assert all(torch.equal(param, torch.full_like(param, 0.5)) for param in model.parameters())
    wider = fitting[:2] + [torch.zeros(2, 5), torch.zeros(2)]
    with pytest.raises(ConfigError, match=r"^model.preset \(tiny\): parameter tensor 2 is \(2, 4\) in the model it "
                                          r"builds but \(2, 5\) in the run's checkpoint; the model config changed"):
        load_parameters(model, wider, "model.preset (tiny)")
    with pytest.raises(ConfigError, match="builds a model of 4 parameter tensors, the run's checkpoint holds 3"):
        load_parameters(model, fitting[:3], "model.preset (tiny)")


def test_the_runs_own_copies_replace_the_paths_it_names_even_when_those_are_gone(tmp_path):
    import shutil

    import yaml

    from tests.hf_helpers import llama_config
    pretrained = tmp_path / "pretrained"
    pretrained.mkdir()
    llama_config(pretrained / "config.json")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = {"model": {"hf": {"pretrained": str(pretrained)}},
             "data": {"hf_dataset": {"path": "json"}, "tokenizer": str(tmp_path / "tok")}, "nodes": [{"name": "a"}]}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved))
    plain = load_run_config(run_dir)  # a run from before the copies: its paths as they are
    assert plain.model.hf.pretrained == str(pretrained) and plain.data.tokenizer == str(tmp_path / "tok")
    (run_dir / MODEL_DIR).mkdir()
    shutil.copy(pretrained / "config.json", run_dir / MODEL_DIR / "config.json")
    (run_dir / TOKENIZER_DIR).mkdir()
    shutil.rmtree(pretrained)  # moved away after the run
    kept = load_run_config(run_dir)
    assert kept.model.hf.config == str(run_dir / MODEL_DIR / "config.json") and kept.model.hf.pretrained is None
    assert kept.data.tokenizer == str(run_dir / TOKENIZER_DIR)
