"""Hugging Face datasets and tokenizers as training data (``data.hf_dataset`` + ``data.tokenizer``).

Documents are tokenized with ``AutoTokenizer.from_pretrained(data.tokenizer)``, each followed by
the tokenizer's end-of-sequence token, and packed back to back into ``seq_len + 1``-token
windows (a window may span documents, as in GPT-style pre-training).

- ``streaming: false`` (the default): the first ``data.max_tokens`` tokens of the dataset become
  one token array, and everything downstream is the byte corpus's machinery (runtime/data.py):
  the eval windows are a seeded uniform sample of the whole array, ``iid`` deals windows to
  nodes, ``non_iid`` gives each node a contiguous slice.
- ``streaming: true`` (corpora larger than memory): documents are read as they stream, never all
  at once. The eval set is the first documents of the stream (enough for
  ``eval_batches x eval_batch_size`` windows), held out from every node. ``iid`` deals the
  other documents round robin to the nodes; ``non_iid`` gives node i the data files i, i + N,
  i + 2N, ... (a site owns its files; needs at least as many files as nodes). The position in
  the stream is saved in checkpoints, so a resumed node continues where it stopped.

``datasets`` and ``transformers`` are optional (``pip install 'geodiloco[hf]'``) and imported
only here.
"""
from __future__ import annotations

import glob
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
import torch

from geodiloco.common.schema import ConfigError

TOKENIZE_BATCH_DOCS = 256
"""Documents per tokenizer call (fast tokenizers batch in Rust)."""


def load_tokenizer(tokenizer_dir: str) -> Any:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def separator_id(tokenizer: Any) -> Optional[int]:
    """The token placed after each document: end-of-sequence, else the separator, else none."""
    for candidate in (tokenizer.eos_token_id, tokenizer.sep_token_id):
        if candidate is not None:
            return int(candidate)
    return None


def open_dataset(hf: Any, data_files: Optional[list[str]] = None, streaming: Optional[bool] = None) -> Any:
    """``datasets.load_dataset`` for ``data.hf_dataset`` (``data_files`` overrides its files)."""
    from datasets import load_dataset
    from datasets.utils import disable_progress_bars

    disable_progress_bars()
    files = data_files if data_files is not None else (hf.data_files or None)
    try:
        return load_dataset(hf.path, hf.name, data_files=files, split=hf.split,
                            streaming=hf.streaming if streaming is None else streaming, **hf.builder_options())
    except ConfigError:
        raise
    except Exception as err:  # datasets' own errors: a corpus that cannot be read fails the same on every restart
        raise ConfigError(f"data.hf_dataset: cannot load {hf.path!r} (files {files}): {reading_error(err)}") from None


def reading_error(err: BaseException) -> str:
    """The cause of a datasets failure in one line: its innermost error (datasets wraps the parser's)."""
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__
    text = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


_told_skipped: set = set()
"""Text fields whose skipped records this process has told of (a stream reads its files again every epoch)."""


def document_texts(dataset: Any, text_field: str) -> Iterator[str]:
    """The non-empty texts of ``indexed_document_texts``."""
    return (text for _, text in indexed_document_texts(dataset, text_field))


def indexed_document_texts(dataset: Any, text_field: str) -> Iterator[tuple[int, str]]:
    """(records read so far, text) of every record with text, in order: the count is where a reader resumes
    with ``dataset.skip`` (documents are fewer than records where records are empty or null).

    The ``text_field`` of every record, in order; a missing field names the columns there are. Records
    whose field is null or not a string (JSON Lines files mixing keys read as null) are skipped and
    counted: when the dataset (or a streamed file) ends and they were most of it, it is refused (the run
    would train on a sliver of it); otherwise the count is told once per process. A record the reader
    cannot parse is a ConfigError naming the cause."""
    read = skipped = 0
    records = iter(dataset)
    while True:
        try:
            record = next(records)
        except StopIteration:
            break
        except ConfigError:
            raise
        except Exception as err:
            raise ConfigError(f"data.hf_dataset: cannot read record {read + 1} of the corpus "
                              f"({reading_error(err)}); fix or remove it") from None
        read += 1
        if text_field not in record:
            columns = ", ".join(sorted(record))
            raise ConfigError(f"data.hf_dataset.text_field: records have no {text_field!r} field; "
                              f"their fields are {columns}")
        text = record[text_field]
        if not isinstance(text, str):
            skipped += 1
            continue
        if text:
            yield read, text
    if skipped and 2 * skipped > read:
        raise ConfigError(f"data.hf_dataset.text_field: {skipped} of {read} records read have no text in "
                          f"{text_field!r} (null or another type); name the field that holds the text, or fix the "
                          "records")
    if skipped and text_field not in _told_skipped:
        _told_skipped.add(text_field)
        print(f"[geodiloco] data.hf_dataset: skipped {skipped} of {read} records whose {text_field!r} is null or "
              "not text", file=sys.stderr, flush=True)


def tokenize_documents(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each document, the separator appended."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    separator = separator_id(tokenizer)
    return [list(doc) + ([separator] if separator is not None else []) for doc in ids]


def batched(texts: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def load_token_corpus(hf: Any, tokenizer_dir: str, max_tokens: int) -> np.ndarray:
    """The dataset's first ``max_tokens`` tokens, documents packed back to back, as int32."""
    tokenizer = load_tokenizer(tokenizer_dir)
    chunks: list[np.ndarray] = []
    total_tokens = 0
    for texts in batched(document_texts(open_dataset(hf, streaming=False), hf.text_field), TOKENIZE_BATCH_DOCS):
        for doc in tokenize_documents(tokenizer, texts):
            chunks.append(np.asarray(doc, dtype=np.int32))
            total_tokens += len(doc)
        if total_tokens >= max_tokens:
            break
    if not chunks:
        raise ConfigError(f"data.hf_dataset: {hf.path!r} (files {hf.data_files}) holds no non-empty "
                          f"{hf.text_field!r} text")
    return np.concatenate(chunks)[:max_tokens]


# ----- streaming -------------------------------------------------------------------------------


@dataclass
class StreamCursor:
    """Where a node is in its stream: the epoch, the file (index into its own file list) and the
    next document of that file to read, how many non-eval documents of the whole stream it has
    passed (the i.i.d. deal counts them), and the tokens read but not yet trained on.
    ``record_index``: records of the file read so far, empty ones included, where a resume skips to
    (None in checkpoints from before it: the resume then counts ``doc_index`` documents again)."""

    epoch: int = 0
    file_index: int = 0
    doc_index: int = 0
    dealt_docs: int = 0
    pending_tokens: list[int] = field(default_factory=list)
    record_index: Optional[int] = 0


@dataclass(frozen=True)
class StreamLayout:
    """Which files a node reads and which documents of them are held out for eval."""

    files: list[Optional[list[str]]]
    """Data files read in order, one stream each; ``[None]`` = the dataset as one stream."""
    held_out_docs: list[int]
    """Leading documents of each of ``files`` that belong to the eval set."""
    deal_every: int
    """Keep every ``deal_every``-th non-eval document (i.i.d. deal; 1 = keep all)."""
    deal_offset: int


def eval_docs_per_file(hf: Any, tokenizer: Any, files: list[Optional[list[str]]], seq_len: int,
                       num_windows: int) -> tuple[list[int], np.ndarray]:
    """(held-out documents per file, eval tokens): the stream's first documents, in file order,
    packed until ``num_windows`` back-to-back windows of ``seq_len + 1`` tokens are filled."""
    counts = [0] * len(files)
    tokens: list[int] = []
    needed = num_windows * (seq_len + 1)
    for file_index, file_list in enumerate(files):
        if len(tokens) >= needed:
            break
        for text in document_texts(open_dataset(hf, file_list, streaming=True), hf.text_field):
            tokens.extend(tokenize_documents(tokenizer, [text])[0])
            counts[file_index] += 1
            if len(tokens) >= needed:
                break
    if len(tokens) < needed:
        raise ConfigError(f"data.hf_dataset: the stream holds {len(tokens)} tokens, fewer than the "
                          f"{num_windows} eval windows of {seq_len + 1} tokens need; lower data.eval_batches")
    return counts, np.asarray(tokens[:needed], dtype=np.int64)


def non_iid_stream_problem(num_files: int, num_nodes: int) -> Optional[str]:
    """Why whole data files cannot be dealt to every node (non_iid shards of a streamed corpus), or None."""
    if num_files >= num_nodes:
        return None
    return (f"data.shards: non_iid with data.hf_dataset.streaming gives each node whole data files, but "
            f"{num_files} file(s) cannot be split among {num_nodes} nodes; give at least {num_nodes} data files, "
            "or use data.shards: iid")


def stream_files(hf: Any, shards: str) -> list:
    """The file groups a streamed dataset is read in, in order: one per ``data_files`` entry (a glob is read as
    one group), or ``[None]`` for the dataset's own files. Under ``non_iid`` shards, where each node gets whole
    files, a glob that matches local files stands for each of them (sorted), so ``corpus/*.jsonl`` over 6 files
    deals 6 files."""
    if not hf.data_files:
        return [None]
    if shards != "non_iid":
        return [[path] for path in hf.data_files]
    groups, seen = [], set()
    for pattern in hf.data_files:
        matched = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else []
        for path in matched or [pattern]:
            real = os.path.realpath(path) if os.path.exists(path) else path
            if real not in seen:  # a file named twice (two patterns) is dealt once: two nodes would read it
                seen.add(real)
                groups.append([path])
    return groups


def stream_layout(hf: Any, node_index: int, num_nodes: int, shards: str,
                  held_out_by_file: list[int]) -> StreamLayout:
    all_files = stream_files(hf, shards)
    if shards == "iid":
        return StreamLayout(all_files, held_out_by_file, num_nodes, node_index)
    problem = non_iid_stream_problem(len(all_files), num_nodes)
    if problem:
        raise ConfigError(problem)
    mine = list(range(node_index, len(all_files), num_nodes))
    return StreamLayout([all_files[index] for index in mine], [held_out_by_file[index] for index in mine], 1, 0)


class StreamShard:
    """One node's share of a streamed dataset, packed into training windows as it is read.

    Same interface as ``runtime.data.NodeShard`` for training: ``next_batch``, and a position
    (``position_state`` / ``load_position_state``) saved in checkpoints.
    """

    def __init__(self, hf: Any, tokenizer: Any, layout: StreamLayout, seq_len: int) -> None:
        self.hf = hf
        self.tokenizer = tokenizer
        self.layout = layout
        self.seq_len = seq_len
        self.cursor = StreamCursor()
        self._documents: Optional[Iterator[str]] = None

    def position_state(self) -> dict:
        cursor = self.cursor
        return {"stream": {"epoch": cursor.epoch, "file_index": cursor.file_index, "doc_index": cursor.doc_index,
                           "dealt_docs": cursor.dealt_docs, "pending_tokens": list(cursor.pending_tokens),
                           "record_index": cursor.record_index}}

    def load_position_state(self, state: dict) -> None:
        saved = state["stream"]
        self.cursor = StreamCursor(saved["epoch"], saved["file_index"], saved["doc_index"], saved["dealt_docs"],
                                   list(saved["pending_tokens"]), saved.get("record_index"))
        self._documents = None

    def _open_file(self) -> Iterator[tuple[int, str]]:
        """The current file's (records read, text) pairs from the cursor on."""
        dataset = open_dataset(self.hf, self.layout.files[self.cursor.file_index], streaming=True)
        skipped_records = self.cursor.record_index
        if skipped_records is None:  # a checkpoint without the record count: pass its documents again
            documents = indexed_document_texts(dataset, self.hf.text_field)
            self.cursor.record_index = 0
            for _, (read, _text) in zip(range(self.cursor.doc_index), documents):
                self.cursor.record_index = read
            return documents
        if skipped_records:
            dataset = dataset.skip(skipped_records)
        return ((skipped_records + read, text) for read, text in indexed_document_texts(dataset, self.hf.text_field))

    def _next_document(self) -> str:
        """The next document of this node's share, moving through files and epochs."""
        read_nothing_epochs = 0
        while True:
            if self._documents is None:
                self._documents = self._open_file()
            item = next(self._documents, None)
            if item is None:
                self._documents = None
                self.cursor.file_index += 1
                self.cursor.doc_index = self.cursor.record_index = 0
                if self.cursor.file_index == len(self.layout.files):
                    self.cursor.file_index = 0
                    self.cursor.epoch += 1
                    read_nothing_epochs += 1
                    if read_nothing_epochs > 1:
                        raise ConfigError("data.hf_dataset: this node's share of the stream holds no training "
                                          "document after the eval set; add data or lower data.eval_batches")
                continue
            self.cursor.record_index, text = item
            doc_index = self.cursor.doc_index
            self.cursor.doc_index += 1
            if doc_index < self.layout.held_out_docs[self.cursor.file_index]:
                continue
            dealt = self.cursor.dealt_docs
            self.cursor.dealt_docs += 1
            if dealt % self.layout.deal_every == self.layout.deal_offset:
                return text

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch_size, seq_len) int64, from back-to-back windows."""
        needed = batch_size * (self.seq_len + 1)
        while len(self.cursor.pending_tokens) < needed:
            self.cursor.pending_tokens.extend(tokenize_documents(self.tokenizer, [self._next_document()])[0])
        taken = self.cursor.pending_tokens[:needed]
        self.cursor.pending_tokens = self.cursor.pending_tokens[needed:]
        windows = torch.tensor(taken, dtype=torch.int64).view(batch_size, self.seq_len + 1)
        return windows[:, :-1], windows[:, 1:]
