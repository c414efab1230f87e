"""Workload cost model: parameters, FLOPs, memory, dims files."""
import json

import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import (
    PRESETS, activation_memory_bytes, forward_flops_per_token, parameter_count, resolve_dims,
    static_memory_bytes, training_flops, training_memory_bytes,
)


def test_tiny_parameter_count_by_hand():
    h, inter, layers, vocab = 128, 352, 2, 256
    per_layer = h * 3 * h + h * h + 3 * h * inter + 2 * h
    assert parameter_count(PRESETS["tiny"]) == vocab * h + layers * per_layer + h + vocab * h


def test_attention_flops_grow_with_sequence_length():
    dims = PRESETS["small"]
    short, long = forward_flops_per_token(dims, 64), forward_flops_per_token(dims, 256)
    # 4 x layers x hidden per token per extra position of context
    assert long - short == pytest.approx(4 * dims.num_layers * dims.hidden_size * (256 - 64))


def test_training_flops_are_three_forwards_and_four_with_recompute():
    dims = PRESETS["tiny"]
    forward = 2 * 64 * forward_flops_per_token(dims, 64)
    assert training_flops(dims, 2, 64) == pytest.approx(3 * forward)
    assert training_flops(dims, 2, 64, activation_checkpointing=True) == pytest.approx(4 * forward)


def test_static_memory_is_16_bytes_per_param_fp32_and_18_mixed():
    dims = PRESETS["small"]
    params = parameter_count(dims)
    assert static_memory_bytes(dims, "fp32").total == 16 * params
    assert static_memory_bytes(dims, "bf16").total == 18 * params


def test_activation_memory_linear_in_batch_and_smaller_with_checkpointing():
    dims = PRESETS["llama-150m"]
    one = activation_memory_bytes(dims, 1, 1024, "bf16")
    assert activation_memory_bytes(dims, 4, 1024, "bf16") == pytest.approx(4 * one)
    assert activation_memory_bytes(dims, 4, 1024, "bf16", activation_checkpointing=True) < 0.5 * 4 * one
    assert activation_memory_bytes(dims, 1, 1024, "fp32") > one
    total = training_memory_bytes(dims, 4, 1024, "bf16")
    assert total.total == pytest.approx(static_memory_bytes(dims, "bf16").total + 4 * one)


def test_resolve_dims_preset_and_hugging_face_json(tmp_path):
    assert resolve_dims("tiny") is PRESETS["tiny"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 6,
                                "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
                                "max_position_embeddings": 2048, "rope_theta": 10000.0}))
    dims = resolve_dims(str(path))
    assert (dims.num_layers, dims.num_heads, dims.num_kv_heads, dims.max_seq_len) == (6, 8, 2, 2048)
    assert dims.kv_hidden_size == 128


def test_resolve_dims_yaml_with_our_names(tmp_path):
    path = tmp_path / "dims.yaml"
    path.write_text("hidden_size: 64\nintermediate_size: 128\nnum_layers: 1\nnum_heads: 2\nvocab_size: 100\n")
    assert resolve_dims(str(path)).hidden_size == 64


def test_resolve_dims_errors(tmp_path):
    with pytest.raises(ConfigError, match="not a preset"):
        resolve_dims("huge")
    path = tmp_path / "bad.yaml"
    path.write_text("hidden_size: 64\n")
    with pytest.raises(ConfigError, match="missing intermediate_size|missing num_layers"):
        resolve_dims(str(path))
    path.write_text("hidden_size: 65\nintermediate_size: 1\nnum_layers: 1\nnum_heads: 2\nvocab_size: 3\n")
    with pytest.raises(ConfigError, match="divisible"):
        resolve_dims(str(path))


def test_an_eager_gelu_new_adds_its_passes_over_the_mlp_width():
    from geodiloco.predictor.workload import (FUSED_ACTIVATION_PASSES, GELU_NEW_PASSES, ModelDims, TrainingCode,
                                              gpt_elementwise_bytes_per_token)

    dims = ModelDims(hidden_size=1280, intermediate_size=3413, num_layers=36, num_heads=20, vocab_size=50257,
                     max_seq_len=1024)
    mlp_width = 1.5 * 3413
    for precision, element_bytes in (("fp32", 4), ("fp16", 2)):
        fused = gpt_elementwise_bytes_per_token(dims, precision)
        eager = gpt_elementwise_bytes_per_token(dims, precision, "gelu_new")
        assert eager - fused == pytest.approx(36 * (GELU_NEW_PASSES - FUSED_ACTIVATION_PASSES) * element_bytes
                                              * mlp_width)
    with pytest.raises(ConfigError, match="activation must be 'fused' or 'gelu_new'"):
        TrainingCode(block="gpt", activation="swish")


def test_a_gpt2_config_with_n_inner_null_takes_four_times_the_hidden_size():
    from geodiloco.predictor.workload import dims_from_mapping
    # transformers' GPT2Config writes "n_inner": null into config.json (save_pretrained, geodiloco export)
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
            "n_positions": 1024, "n_inner": None}
    dims = dims_from_mapping(gpt2, "config.json")
    assert dims.intermediate_size == 3072 and dims.hidden_size == 768 and dims.max_seq_len == 1024
    assert dims_from_mapping({**gpt2, "n_inner": 1024}, "config.json").intermediate_size == 1024


def test_a_hf_config_without_tie_word_embeddings_ties_as_its_model_class_does(tmp_path):
    import json

    from geodiloco.predictor.workload import dims_from_mapping
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}
    llama = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 1000}
    # save_pretrained leaves the key out when it equals the class default: GPT-2 ties, LLaMA does not
    assert dims_from_mapping(gpt2).tie_embeddings is True
    assert dims_from_mapping(llama).tie_embeddings is False
    assert dims_from_mapping({**gpt2, "tie_word_embeddings": False}).tie_embeddings is False
    own = {"hidden_size": 256, "intermediate_size": 512, "num_layers": 2, "num_heads": 4, "vocab_size": 1000}
    assert dims_from_mapping(own).tie_embeddings is False  # our own names: untied unless said


@pytest.mark.parametrize("kv_heads", [3, 0, 8])
def test_num_kv_heads_must_divide_num_heads(kv_heads):
    from geodiloco.predictor.workload import dims_from_mapping
    own = {"hidden_size": 256, "intermediate_size": 512, "num_layers": 2, "num_heads": 4, "vocab_size": 1000}
    with pytest.raises(ConfigError, match=f"num_kv_heads must be a positive integer that divides num_heads 4.*got {kv_heads}"):
        dims_from_mapping({**own, "num_kv_heads": kv_heads})
    assert dims_from_mapping({**own, "num_kv_heads": 2}).kv_hidden_size == 128


def test_a_model_file_that_is_not_valid_yaml_or_json_is_one_line(tmp_path):
    from geodiloco.predictor.workload import resolve_dims
    (tmp_path / "dims.yaml").write_text("gpus: [a\n  b: c\n")
    (tmp_path / "dims.json").write_text('{"a": 1,,}')
    with pytest.raises(ConfigError) as yaml_err:
        resolve_dims(str(tmp_path / "dims.yaml"))
    assert str(yaml_err.value) == f"{tmp_path / 'dims.yaml'}: cannot parse model dims at line 2, column 4: expected ',' or ']', but got ':'"
    with pytest.raises(ConfigError) as json_err:
        resolve_dims(str(tmp_path / "dims.json"))
    assert "\n" not in str(json_err.value) and "at line 1, column 9" in str(json_err.value)


def test_an_attention_dropout_at_p_0_moves_no_score_bytes_for_the_dropout():
    """Scores counted by hand: 2 heads x 4 queries x (4 + 4 memory) keys x 1 layer = 64 elements; with the dropout
    20 passes of 2 bytes (fp16) and its 1-byte mask written and read; without it 16 passes and no mask; relative
    positions add 12 passes either way."""
    from geodiloco.predictor.workload import ModelDims, eager_attention_bytes_per_sample
    dims = ModelDims(hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2, vocab_size=32, max_seq_len=8)
    assert eager_attention_bytes_per_sample(dims, 4, "fp16", memory_len=4) == 64 * (20 * 2 + 2)
    assert eager_attention_bytes_per_sample(dims, 4, "fp16", memory_len=4, attention_dropout=False) == 64 * 16 * 2
    assert eager_attention_bytes_per_sample(dims, 4, "fp32", memory_len=4, relative_positions=True,
                                            attention_dropout=False) == 64 * 28 * 4
