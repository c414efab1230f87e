"""Build the offline example corpus and tokenizer of the transformers example.

Writes, under ``--out`` (default ``runs/hf_example``):

- ``corpus/part_XX.jsonl``: one JSON record ``{"text": ...}`` per Python standard-library
  source file (every machine with Python has them), split into ``--files`` files so that
  ``data.shards: non_iid`` with ``streaming: true`` can give each site files of its own;
- ``tokenizer/``: a byte-level BPE tokenizer with ``--vocab-size`` entries (``<|endoftext|>``
  included) trained on that corpus with Hugging Face ``tokenizers``, saved as a transformers
  tokenizer directory (``AutoTokenizer.from_pretrained`` loads it);
- ``tokens.bin``: every document tokenized with it, each followed by ``<|endoftext|>``, as raw
  uint16 ids back to back (nanoGPT's ``train.bin`` layout): the pre-tokenized corpus that
  ``data.token_file`` reads (experiments/configs/token_file.yaml).

Needs the ``hf`` extra: ``pip install -e '.[hf]'``. Run from the repository root:
``python experiments/hf/prepare_data.py`` then ``geodiloco run --config experiments/configs/hf_llama.yaml``.
"""
from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

END_OF_TEXT = "<|endoftext|>"


def stdlib_documents(max_bytes: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    documents, total_bytes = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            continue
        documents.append(text)
        total_bytes += len(text)
        if total_bytes >= max_bytes:
            break
    return documents


def write_corpus(documents: list[str], corpus_dir: Path, num_files: int) -> list[Path]:
    """Contiguous runs of documents per file (so files differ in content, as sites' data would)."""
    corpus_dir.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(documents) // num_files)
    paths = []
    for index in range(num_files):
        path = corpus_dir / f"part_{index:02d}.jsonl"
        with path.open("w", encoding="utf-8") as handle:
            for text in documents[index * per_file:(index + 1) * per_file]:
                handle.write(json.dumps({"text": text}) + "\n")
        paths.append(path)
    return paths


def train_tokenizer(documents: list[str], vocab_size: int, out_dir: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(documents, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TEXT, bos_token=END_OF_TEXT,
                                      unk_token=END_OF_TEXT, model_max_length=1_000_000)
    wrapped.save_pretrained(out_dir)
    return len(wrapped)


def write_token_file(documents: list[str], tokenizer_dir: Path, path: Path) -> int:
    """Each document's ids and the end-of-text id, back to back, as uint16 (the vocabulary is under 65,536)."""
    import numpy as np
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if len(tokenizer) > 65_536:
        raise SystemExit(f"a vocabulary of {len(tokenizer)} does not fit uint16; write uint32 and set data.token_dtype")
    ids: list[int] = []
    for encoded in tokenizer(documents, add_special_tokens=False)["input_ids"]:
        ids += encoded + [tokenizer.eos_token_id]
    np.asarray(ids, dtype=np.uint16).tofile(path)
    return len(ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/hf_example"), help="output directory")
    parser.add_argument("--max-bytes", type=int, default=6_000_000, help="corpus size (bytes of source text)")
    parser.add_argument("--files", type=int, default=6, help="JSONL files to split the corpus into")
    parser.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary (the model's vocab_size)")
    args = parser.parse_args(argv)
    if args.files < 1 or args.vocab_size < 300 or args.max_bytes < 10_000:
        parser.error("--files >= 1, --vocab-size >= 300 and --max-bytes >= 10000 are needed")
    documents = stdlib_documents(args.max_bytes)
    paths = write_corpus(documents, args.out / "corpus", args.files)
    vocab = train_tokenizer(documents, args.vocab_size, args.out / "tokenizer")
    tokens = write_token_file(documents, args.out / "tokenizer", args.out / "tokens.bin")
    print(f"{len(documents)} documents in {len(paths)} files under {args.out / 'corpus'}; "
          f"tokenizer of {vocab} tokens in {args.out / 'tokenizer'}; {tokens:,} token ids in {args.out / 'tokens.bin'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
