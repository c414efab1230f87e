"""Small offline corpora and tokenizers for the transformers tests (needs the hf extra)."""
from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
         "tau upsilon phi chi psi omega").split()


def documents(count: int, seed: int = 0) -> list[str]:
    """Deterministic pseudo-text documents of varied length, each starting with its index."""
    texts = []
    for index in range(count):
        rng = random.Random(seed * 100_003 + index)
        texts.append(f"doc{index} " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80))))
    return texts


def write_jsonl(directory: Path, texts: list[str], files: int = 1, field: str = "text") -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(texts) // files)
    paths = []
    for index in range(files):
        path = directory / f"part_{index}.jsonl"
        path.write_text("".join(json.dumps({field: text}) + "\n" for text in texts[index * per_file:(index + 1) * per_file]))
        paths.append(str(path))
    return paths


def train_tokenizer(texts: list[str], out_dir: Path, vocab_size: int = 320) -> Path:
    """A byte-level BPE tokenizer saved as a transformers tokenizer directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>").save_pretrained(out_dir)
    return out_dir


def llama_config(path: Path, vocab_size: int = 320, tie: bool = False, hidden: int = 32, layers: int = 2) -> Path:
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": hidden * 2, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": vocab_size, "max_position_embeddings": 128,
        "tie_word_embeddings": tie, "use_cache": False}))
    return path
