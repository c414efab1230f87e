"""Transformer workload description: LLaMA-style decoder dimensions and presets.

The presets are the single source of model shapes: runtime/models.py builds the
torch module from them, and the predictor's cost model reads them.

Cost functions count what one training step of that decoder does: parameters,
FLOPs (with the attention term that grows with the sequence length), bytes and
memory. Units: FLOPs are floating-point operations (multiply-add = 2), bytes
are bytes, memory functions return bytes (divide by 2**30 for GiB).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

import yaml

from geodiloco.common.schema import ConfigError, yaml_error_text


@dataclass(frozen=True)
class ModelDims:
    """Shape of a LLaMA-style decoder (RMSNorm, rotary, SwiGLU, untied head).

    ``num_kv_heads`` (grouped-query attention) is used by the cost model only;
    None means as many key/value heads as query heads.
    ``embedding_parameters``: the input embedding's parameter count where it is not
    vocab_size x hidden_size: an adaptive input embedding (Baevski & Auli 2019; Transformer-XL's
    div_val > 1) gives rarer-word clusters narrower vectors and projects them up. None: vocab_size x
    hidden_size. Only the optimizer's cost reads it; the LM head keeps vocab_size.
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    max_seq_len: int
    tie_embeddings: bool = False
    num_kv_heads: Optional[int] = None
    embedding_parameters: Optional[int] = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_hidden_size(self) -> int:
        """Width of the key (or value) projection output."""
        return (self.num_kv_heads or self.num_heads) * self.head_dim


PRESETS: dict[str, ModelDims] = {
    # Trains in seconds on one CPU core; byte-level vocabulary.
    "tiny": ModelDims(hidden_size=128, intermediate_size=352, num_layers=2,
                      num_heads=4, vocab_size=256, max_seq_len=256),
    # A few million parameters; still CPU-friendly.
    "small": ModelDims(hidden_size=256, intermediate_size=688, num_layers=4,
                       num_heads=8, vocab_size=256, max_seq_len=512),
    # OpenDiLoCo / source-paper configuration (about 150 M parameters).
    "llama-150m": ModelDims(hidden_size=1024, intermediate_size=4096, num_layers=12,
                            num_heads=16, vocab_size=32000, max_seq_len=1024),
}


def preset_dims(name: str) -> ModelDims:
    """Dimensions of a named preset; the error lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ValueError(f"unknown model preset {name!r}; known presets: {known}") from None


# Hugging Face config keys -> ModelDims fields (our own names are accepted as well).
_HF_KEYS = {
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "max_position_embeddings": "max_seq_len",
    "tie_word_embeddings": "tie_embeddings",
    "n_layer": "num_layers",
    "n_head": "num_heads",
    "n_embd": "hidden_size",
    "n_positions": "max_seq_len",
    "n_inner": "intermediate_size",
}
_REQUIRED = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size")


def dims_from_mapping(data: dict, source: str = "model dims") -> ModelDims:
    """ModelDims from our field names or Hugging Face config keys; unknown keys are ignored
    (a Hugging Face config.json carries many unrelated ones)."""
    known = {field.name for field in fields(ModelDims)}
    values: dict = {}
    for key, value in data.items():
        name = _HF_KEYS.get(key, key)
        if name in known and value is not None:
            values[name] = value
    if "tie_embeddings" not in values and isinstance(data.get("model_type"), str):
        values["tie_embeddings"] = hf_default_tie(data["model_type"])
    if "intermediate_size" not in values and "hidden_size" in values and data.get("n_inner") is None:
        values["intermediate_size"] = 4 * int(values["hidden_size"])
    missing = [name for name in _REQUIRED if name not in values]
    if missing:
        raise ConfigError(f"{source}: missing {', '.join(missing)}; give them (or the Hugging Face keys "
                          "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size)")
    values.setdefault("max_seq_len", 2048)
    for name in _REQUIRED + ("max_seq_len",):
        if not isinstance(values[name], int) or isinstance(values[name], bool) or values[name] < 1:
            raise ConfigError(f"{source}: {name} must be a positive integer, got {values[name]!r}")
    if values["hidden_size"] % values["num_heads"]:
        raise ConfigError(f"{source}: hidden_size {values['hidden_size']} must be divisible by "
                          f"num_heads {values['num_heads']}")
    kv_heads = values.get("num_kv_heads")
    if kv_heads is not None and (not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1
                                 or values["num_heads"] % kv_heads):
        raise ConfigError(f"{source}: num_kv_heads must be a positive integer that divides num_heads "
                          f"{values['num_heads']} (each key/value head serves a group of query heads), got {kv_heads!r}")
    embedding = values.get("embedding_parameters")
    if embedding is not None and (not isinstance(embedding, int) or isinstance(embedding, bool) or embedding < 1):
        raise ConfigError(f"{source}: embedding_parameters must be a positive integer (the input embedding's "
                          f"parameters, where it is not vocab_size x hidden_size), got {embedding!r}")
    return ModelDims(**values)


# model_type -> tie_word_embeddings where its transformers config class does not tie (PretrainedConfig ties),
# for reading a config.json without transformers installed
_UNTIED_MODEL_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gpt_neox", "phi3",
                                 "olmo", "olmo2"})


def hf_default_tie(model_type: str) -> bool:
    """Whether a transformers model of ``model_type`` ties its output head to its embeddings when its config.json
    leaves ``tie_word_embeddings`` out, as ``save_pretrained`` does when it equals the class's default: that
    default, from transformers when it is installed (GPT-2 and OPT tie; LLaMA, Mistral and Qwen2 do not)."""
    try:
        from transformers import AutoConfig
    except ImportError:
        return model_type not in _UNTIED_MODEL_TYPES
    try:
        return bool(AutoConfig.for_model(model_type).tie_word_embeddings)
    except (ValueError, KeyError):  # a model type this transformers does not know
        return model_type not in _UNTIED_MODEL_TYPES


def hf_config_json(config: Optional[str], pretrained: Optional[str]) -> Path:
    """The transformers config.json of ``model.hf``: ``config`` itself (a file, or a directory holding
    config.json) or ``pretrained``'s config.json."""
    path = Path(config or pretrained)
    return path / "config.json" if path.is_dir() else path


def resolve_dims(name_or_path: str) -> ModelDims:
    """A preset name, or the path of a JSON/YAML file of dims (Hugging Face keys accepted)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        known = ", ".join(sorted(PRESETS))
        raise ConfigError(f"model {name_or_path!r}: not a preset ({known}) and no such file; "
                          "pass a preset name or a JSON/YAML file of dims")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot parse model dims{yaml_error_text(err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: model dims must be a mapping of keys such as hidden_size, num_layers")
    return dims_from_mapping(data, str(path))


# ---------------------------------------------------------------- parameters


def layer_linear_shapes(dims: ModelDims) -> list[tuple[int, int]]:
    """(in_features, out_features) of every linear layer in one decoder block."""
    h, inter = dims.hidden_size, dims.intermediate_size
    return [
        (h, h + 2 * dims.kv_hidden_size),  # fused q, k, v
        (h, h),                            # attention output
        (h, inter), (h, inter),            # gate, up
        (inter, h),                        # down
    ]


def parameter_count(dims: ModelDims) -> int:
    """Trainable parameters: embeddings, blocks (linears + 2 norms), final norm, head."""
    per_layer = sum(n_in * n_out for n_in, n_out in layer_linear_shapes(dims)) + 2 * dims.hidden_size
    embedding = dims.vocab_size * dims.hidden_size if dims.embedding_parameters is None else dims.embedding_parameters
    head = 0 if dims.tie_embeddings else dims.vocab_size * dims.hidden_size
    return embedding + dims.num_layers * per_layer + dims.hidden_size + head


def parameter_tensor_count(dims: ModelDims) -> int:
    """Number of parameter tensors (optimizer kernels run per tensor on CPU)."""
    return 7 * dims.num_layers + 2 + (0 if dims.tie_embeddings else 1)


# ---------------------------------------------------------------- FLOPs


def forward_flops_per_token(dims: ModelDims, seq_len: int, causal_skip: bool = False) -> float:
    """Forward FLOPs per token: 2 x matmul parameters, plus attention scores and
    weighted sum (2 x 2 x seq_len x hidden per layer; halved when ``causal_skip``,
    as flash kernels skip the masked half)."""
    linear = dims.num_layers * sum(n_in * n_out for n_in, n_out in layer_linear_shapes(dims))
    linear += dims.vocab_size * dims.hidden_size
    attention = 4.0 * dims.num_layers * seq_len * dims.hidden_size
    if causal_skip:
        attention /= 2
    return 2.0 * linear + attention


def training_flops(dims: ModelDims, batch_size: int, seq_len: int,
                   activation_checkpointing: bool = False, causal_skip: bool = False) -> float:
    """FLOPs of one training step (forward + backward = 3 x forward; + 1 forward
    of the blocks when activations are recomputed)."""
    tokens = batch_size * seq_len
    passes = 4.0 if activation_checkpointing else 3.0
    return passes * tokens * forward_flops_per_token(dims, seq_len, causal_skip)


# ---------------------------------------------------------------- precision


PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def activation_bytes(precision: str) -> int:
    """Bytes per activation element: 2 under fp16/bf16 autocast, else 4."""
    check_precision(precision)
    return 2 if precision in ("fp16", "bf16") else 4


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r} is not known; use one of {', '.join(PRECISIONS)}")


# ---------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes held on one device during a step at one micro-batch."""

    weights: float
    gradients: float
    optimizer_states: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer_states + self.activations


def static_memory_bytes(dims: ModelDims, precision: str) -> MemoryBreakdown:
    """Weights, gradients and AdamW states (no activations).

    torch autocast keeps fp32 master weights (4 B) and caches a half copy (2 B)
    during the forward pass; gradients are fp32 (4 B); AdamW keeps two fp32
    moments (8 B). So 16 B/param in fp32 and 18 B/param in mixed precision.
    """
    params = parameter_count(dims)
    half_copy = 2 if activation_bytes(precision) == 2 else 0
    return MemoryBreakdown(weights=params * (4 + half_copy), gradients=params * 4.0,
                           optimizer_states=params * 8.0, activations=0.0)


def layer_activation_bytes_per_token(dims: ModelDims, precision: str) -> float:
    """Bytes one block saves for backward per token (flash attention: no score matrix).

    Norms run in fp32 (input and normalized output, 2 x 4 B x hidden each); the
    q/k/v projection output, rotated q and k, attention output and its
    reshaped copy, the three autocast input casts, and SwiGLU's gate, up,
    silu and product tensors are kept at the activation precision.
    """
    e = activation_bytes(precision)
    h, inter, kv = dims.hidden_size, dims.intermediate_size, dims.kv_hidden_size
    norms = 2 * 2 * 4 * h
    attention = e * (h + 2 * kv) + e * (h + kv) + 2 * e * h + e * h
    mlp_inputs = 2 * e * h
    swiglu = 4 * e * inter
    return norms + attention + mlp_inputs + swiglu


def head_activation_bytes_per_token(dims: ModelDims, precision: str) -> float:
    """Final norm, head input, logits and the fp32 log-softmax (and its gradient)."""
    e = activation_bytes(precision)
    return 2 * 4 * dims.hidden_size + e * dims.hidden_size + dims.vocab_size * (2 * e + 8)


def activation_memory_bytes(dims: ModelDims, micro_batch_size: int, seq_len: int, precision: str,
                            activation_checkpointing: bool = False) -> float:
    """Activation bytes held at the peak of a step for one micro-batch.

    Without checkpointing every block keeps its saved tensors; with
    checkpointing each block keeps only its fp32 input and one block's tensors
    are live again while it is recomputed.
    """
    tokens = micro_batch_size * seq_len
    per_layer = layer_activation_bytes_per_token(dims, precision)
    if activation_checkpointing:
        blocks = dims.num_layers * 4 * dims.hidden_size + per_layer
    else:
        blocks = dims.num_layers * per_layer
    return tokens * (blocks + head_activation_bytes_per_token(dims, precision))


def training_memory_bytes(dims: ModelDims, micro_batch_size: int, seq_len: int, precision: str,
                          activation_checkpointing: bool = False) -> MemoryBreakdown:
    """Weights + gradients + AdamW states + activations for one micro-batch (bytes)."""
    static = static_memory_bytes(dims, precision)
    activations = activation_memory_bytes(dims, micro_batch_size, seq_len, precision, activation_checkpointing)
    return MemoryBreakdown(static.weights, static.gradients, static.optimizer_states, activations)


# ---------------------------------------------------------------- bytes moved


@dataclass(frozen=True)
class TrainingCode:
    """How the training code runs the model, where that changes the cost (defaults: this project's runtime).

    ``block``: "llama" (fp32 RMSNorm, rotary, SwiGLU under autocast: runtime/models.py) or "gpt"
    (BERT/GPT-2 style: LayerNorm, GELU/ReLU MLP of two matrices, absolute positions, dropout; half
    precision as whole-model fp16, apex O2 style). For "gpt", ``ModelDims.intermediate_size`` is the
    SwiGLU-equivalent width (2/3 of the real MLP width: same parameters and FLOPs).
    ``attention``: "flash" (fused kernel, no score matrix, causal half skipped) or "eager" (scores and
    probabilities written to memory, full square computed).
    ``activation``: how a "gpt" block's MLP activation runs: "fused" (one kernel forward, one backward)
    or "gelu_new" (HuggingFace GPT-2's tanh approximation written as eager tensor ops,
    ``transformers.activations.NewGELUActivation``: ``GELU_NEW_PASSES`` passes over the MLP width).
    ``lm_head_fraction``: share of positions projected onto the vocabulary and through the loss (1 for a
    language model, the masked share for BERT MLM that gathers masked positions first, 0 for a
    classification / QA head).
    ``memory_len``: cached key/value positions each query also attends to (Transformer-XL memory). The fused
    q/k/v projection runs over them too, as Transformer-XL projects cat([memory, segment]).
    ``relative_positions``: Transformer-XL relative-position attention (a second score matmul against the
    position embeddings, shifted and added to the content scores); eager attention only.
    ``attention_dropout``: whether eager attention runs a dropout over its probabilities. False where the
    source sets that probability to 0 (Transformer-XL base's dropatt, OPT's attention_dropout): PyTorch's
    dropout returns its input unchanged for p = 0, so no dropout kernel and no mask run.
    ``host_ops_per_layer``, ``host_ops_head``: host work of one micro-batch's forward and backward in
    chain ops (the eager op with its backward that ``host_op_us`` prices, see predictor/detect.py),
    per block and for the embedding, head and loss; ``autocast_host_ops``: the extra chain ops of
    autocast (bf16/fp16 on a GPU). The defaults were counted from reading the code; the runtime's
    own values (``RUNTIME_CODE``) were measured on a GPU (experiments/results/gpu/host_ops.md).
    ``vocab_softmax_per_sm_bound``: whether the softmax cross-entropy over the vocabulary streams at
    most the fitted per-SM rate (``Efficiency.vocab_softmax_gbps_per_sm``). The published steps the
    rate was fitted on need it; the runtime on current PyTorch does not: on an H200 (torch 2.11) the
    loss's kernels streamed rows of 8,192 to 267,735 entries at about 20 GB/s per SM, 3x the fitted
    bound, and about 0.55 of the bus (experiments/results/gpu/h200-a/loss_rate.md).
    ``tensor_core_alignment``: the multiple every dimension of an FP16 GEMM must be for it to run on tensor
    cores. 1 (the default): any shape does, as under cuBLAS 11.0 and later (every CUDA build of torch >= 2.3).
    8 for code run on CUDA 10 (cuBLAS before 11.0, per NVIDIA's "Matrix Multiplication Background User's
    Guide"): another shape, such as a projection onto a 267,735-word vocabulary, runs on the CUDA cores at the
    FP32 rate (FP16 data, FP32 arithmetic).
    ``blocks_only``: the timed code runs the blocks alone on an input tensor that needs no gradient (a layer
    micro-benchmark such as ``layer(X)[0].sum().backward()``): no embedding, final norm, head or loss, and the
    first block's input projections compute no input gradient. False (the default): a whole model.
    """

    block: str = "llama"
    attention: str = "flash"
    activation: str = "fused"
    lm_head_fraction: float = 1.0
    memory_len: int = 0
    relative_positions: bool = False
    attention_dropout: bool = True
    host_ops_per_layer: float = 51.0
    host_ops_head: float = 15.0
    autocast_host_ops: float = 0.0
    vocab_softmax_per_sm_bound: bool = True
    tensor_core_alignment: int = 1
    blocks_only: bool = False

    def __post_init__(self) -> None:
        if self.block not in ("llama", "gpt"):
            raise ConfigError(f"block must be 'llama' or 'gpt', got {self.block!r}")
        if self.attention not in ("flash", "eager"):
            raise ConfigError(f"attention must be 'flash' or 'eager', got {self.attention!r}")
        if self.activation not in ("fused", "gelu_new"):
            raise ConfigError(f"activation must be 'fused' or 'gelu_new', got {self.activation!r}")
        if not 0.0 <= self.lm_head_fraction <= 1.0:
            raise ConfigError(f"lm_head_fraction must be in [0, 1], got {self.lm_head_fraction}")
        if self.memory_len < 0:
            raise ConfigError(f"memory_len must be >= 0, got {self.memory_len}")
        if self.tensor_core_alignment < 1:
            raise ConfigError(f"tensor_core_alignment must be >= 1 (1: any GEMM shape runs on tensor cores), got "
                              f"{self.tensor_core_alignment}")


RUNTIME_HOST_OPS_PER_LAYER = 240.0
RUNTIME_AUTOCAST_HOST_OPS = 100.0
"""The runtime's model (runtime/models.py) under its inner step, in chain ops: fitted on host-bound
tiny and small steps profiled on an H100 host (experiments/gpu/fit_host_ops.py: 237 per layer in
fp32, 241 in bf16, about 110 more outside the layers in bf16). Counting by reading the code gave
51 per layer (norms 12, q/k/v views 5, rotary 22, attention 3, output 1, SwiGLU 5, residuals 2),
which missed most of the backward's and autograd's work: host-bound steps came out 3-4x too fast."""

RUNTIME_CODE = TrainingCode(host_ops_per_layer=RUNTIME_HOST_OPS_PER_LAYER,
                            autocast_host_ops=RUNTIME_AUTOCAST_HOST_OPS, vocab_softmax_per_sm_bound=False)

# Eager attention: bytes moved per score element per training step, in activation-sized elements.
# Forward: QK^T write 1, scale 2, mask add 2, softmax 2, dropout 2, PV read 1 (10); backward: dP write 1,
# dropout 2, softmax 3, mask/scale 2, reads by the two score-gradient matmuls 2 (10); plus the 1-byte
# dropout mask written and read. Counted from the eager BERT/GPT-2 attention code, not fitted.
EAGER_SCORE_PASSES = 20
EAGER_SCORE_MASK_BYTES = 2
# Of those, the attention dropout's: 2 passes forward and 2 backward, and the whole mask.
EAGER_SCORE_DROPOUT_PASSES = 4
# Transformer-XL relative positions add per score element: the position scores written (1), the rel_shift
# pad copy (2) and the add to the content scores (3), forward, and as many backward.
RELATIVE_SCORE_PASSES = 12


def eager_attention_bytes_per_sample(dims: ModelDims, seq_len: int, precision: str,
                                     memory_len: int = 0, relative_positions: bool = False,
                                     attention_dropout: bool = True) -> float:
    """Bytes per sequence the eager attention's score matrices move in one training step (all layers)."""
    elements = dims.num_heads * seq_len * (seq_len + memory_len) * dims.num_layers
    passes = EAGER_SCORE_PASSES + (RELATIVE_SCORE_PASSES if relative_positions else 0)
    mask_bytes = EAGER_SCORE_MASK_BYTES
    if not attention_dropout:
        passes, mask_bytes = passes - EAGER_SCORE_DROPOUT_PASSES, 0
    return elements * (passes * activation_bytes(precision) + mask_bytes)


# Passes over the MLP width (activation-sized elements, forward + backward) of a "gpt" block's activation:
# fused, one read and one write forward (the backward counted as 2 x forward); HuggingFace GPT-2's gelu_new
# as eager ops, 184 B per fp32 element as its dispatched aten ops move them (mul 104, add 44, pow 16,
# tanh 8, tanh_backward 12; experiments/predictor/count_elementwise_bytes.py, tests/test_count_elementwise_bytes.py).
FUSED_ACTIVATION_PASSES = 6
GELU_NEW_PASSES = 46


def gpt_elementwise_bytes_per_token(dims: ModelDims, precision: str, activation: str = "fused",
                                    final_norm: bool = True) -> float:
    """Bytes per token of the non-matmul kernels of BERT/GPT-2 style blocks, forward + backward (2 x forward).

    Per block forward: two LayerNorms (read + write), bias + activation over the MLP width (read + write),
    two dropouts (read, write, 1-byte mask), two residual adds (two reads, one write) and the attention
    context's permute copy (read + write), all at the activation precision (fp16 models keep fp16 weights
    and activations), and the final LayerNorm (``final_norm``; none for blocks timed alone, see
    ``TrainingCode.blocks_only``). ``activation`` "gelu_new" (``TrainingCode.activation``) adds
    the passes of an activation written as eager ops. The loss over the vocabulary is
    ``vocab_loss_bytes_per_token``.
    """
    e = activation_bytes(precision)
    h, mlp = dims.hidden_size, 1.5 * dims.intermediate_size
    forward_block = 2 * 2 * e * h + 2 * e * mlp + 2 * (2 * e + 1) * h + 2 * 3 * e * h + 2 * e * h
    final_norm_bytes = 2 * 2 * e * h if final_norm else 0.0
    eager_activation = (GELU_NEW_PASSES - FUSED_ACTIVATION_PASSES) * e * mlp if activation == "gelu_new" else 0.0
    return 3.0 * (dims.num_layers * forward_block + final_norm_bytes) + dims.num_layers * eager_activation


def elementwise_bytes_per_token(dims: ModelDims, seq_len: int, precision: str) -> float:
    """Bytes read + written per token by the non-matmul kernels of one step
    (forward + backward, backward counted as 2 x forward), all blocks.

    Counted from the eager PyTorch ops of the LLaMA block: two fp32 RMSNorms
    (about 7 passes over hidden each), autocast casts of the three linear
    inputs, rotary on q and k in fp32 (about 9 passes each), attention reading
    q, k, v and writing its output, a reshape copy, two residual adds and
    SwiGLU (silu + product, 5 passes over intermediate), and the final RMSNorm. The loss over the
    vocabulary is ``vocab_loss_bytes_per_token``.
    """
    e = activation_bytes(precision)
    h, inter, kv = dims.hidden_size, dims.intermediate_size, dims.kv_hidden_size
    casts = 3 * (4 + e) * h if e == 2 else 0
    forward_block = (2 * 7 * 4 * h + casts + 9 * 4 * (h + kv) + e * (2 * h + 2 * kv)
                     + 2 * e * h + 2 * (8 + e) * h + 5 * e * inter)
    final_norm = 7 * 4 * h
    return 3.0 * (dims.num_layers * forward_block + final_norm)


def vocab_loss_bytes_per_token(dims: ModelDims, precision: str, lm_head_fraction: float = 1.0) -> float:
    """Bytes per token of the softmax cross-entropy over the vocabulary, forward + backward (2 x forward):
    the logits read and written by (log-)softmax at the activation precision, the loss and its gradient in
    fp32, for the share of positions that reach the vocabulary.

    Kept apart from the other elementwise kernels because it streams at its own share of the bus, and
    in the published steps' code at most a fitted rate per SM (predictor.kernels.vocab_softmax_bytes_per_s).
    """
    return 3.0 * lm_head_fraction * dims.vocab_size * (activation_bytes(precision) + 4 + 8)


# AdamW as PyTorch runs it unfused (single-tensor loop on CPU, foreach on GPU):
# decay mul_ 8, lerp_ 12, mul_ + addcmul_ 20, sqrt / div / add_ 24, addcdiv_ 16 = 80 B/param.
ADAMW_BYTES_PER_PARAM = 80.0
# Of those, reading param, grad and both moments once and writing back param and moments.
ADAMW_COMPULSORY_BYTES_PER_PARAM = 28.0


def optimizer_traffic(dims: ModelDims, precision: str, micro_batches: int = 1,
                      grad_clip: bool = True) -> tuple[float, float]:
    """(compulsory bytes, re-touched bytes) moved per step outside forward/backward.

    Compulsory: AdamW's first touch of param, grad and moments (28 B/param) and
    gradient accumulation of each extra micro-batch (12 B). Re-touched (hot in
    cache on a CPU): AdamW's other passes (52 B), clipping's norm + rescale
    (12 B), and autocast's per-micro-batch weight cast (6 B).
    """
    params = parameter_count(dims)
    compulsory = ADAMW_COMPULSORY_BYTES_PER_PARAM + 12.0 * (micro_batches - 1)
    retouched = ADAMW_BYTES_PER_PARAM - ADAMW_COMPULSORY_BYTES_PER_PARAM + (12.0 if grad_clip else 0.0)
    if activation_bytes(precision) == 2:
        retouched += 6.0 * micro_batches
    return params * compulsory, params * retouched


def gradient_bytes(dims: ModelDims) -> float:
    """Bytes of the fp32 gradients an intra-node all-reduce exchanges."""
    return 4.0 * parameter_count(dims)


MAX_BATCH_SIZE = 1_000_000
"""Samples per step beyond any GPU node's memory; larger values would only make the search for
micro-batches run for minutes."""
MAX_SEQ_LEN = 1_048_576


def check_workload_size(batch_size: int, seq_len: int, dims, batch_option: str = "--batch-size",
                        seq_option: str = "--seq-len") -> None:
    """Refuse a batch or sequence length no step-time prediction can mean (ValueError naming the option)."""
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"{batch_option} must be between 1 and {MAX_BATCH_SIZE:,} (got {batch_size:,})")
    if not 1 <= seq_len <= MAX_SEQ_LEN:
        raise ValueError(f"{seq_option} must be between 1 and {MAX_SEQ_LEN:,} (got {seq_len:,})")
    if seq_len > dims.max_seq_len:
        raise ValueError(f"{seq_option} {seq_len} exceeds the model's max_seq_len {dims.max_seq_len}")
