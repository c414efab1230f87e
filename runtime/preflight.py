"""Checks of a run config against this machine, before any node starts.

The config schema (runtime/config.py) checks values; this checks what they point at: optional
extras the config needs are installed, data files and the tokenizer exist, and the tokenizer's
vocabulary fits the model's embedding. Each problem is one ``ConfigError`` line naming the field.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
from pathlib import Path

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import hf_config_json
from geodiloco.runtime.config import DATASET_BUILDERS, RunConfig

EXTRAS = {"hf": ("transformers", "datasets", "tokenizers", "safetensors"),
          "tensorboard": ("tensorboard",), "wandb": ("wandb",), "hivemind": ("hivemind",)}
LOCAL_BUILDERS = DATASET_BUILDERS


def needed_extras(config: RunConfig) -> dict[str, str]:
    """{extra: the config field that needs it}."""
    needed = {}
    if config.model.hf is not None:
        needed["hf"] = "model.hf"
    if config.data.hf_dataset is not None:
        needed["hf"] = "data.hf_dataset"
    if config.logging.tensorboard:
        needed["tensorboard"] = "logging.tensorboard"
    if config.logging.wandb is not None:
        needed["wandb"] = "logging.wandb"
    if config.comm.backend == "hivemind":
        needed["hivemind"] = "comm.backend: hivemind"
    return needed


def check_extras(config: RunConfig) -> None:
    for extra, field in needed_extras(config).items():
        missing = [module for module in EXTRAS[extra] if importlib.util.find_spec(module) is None]
        if missing:
            raise ConfigError(f"{field} needs the {extra} extra ({', '.join(missing)} not installed): "
                              f"pip install -e '.[{extra}]' in the checkout (or 'geodiloco[{extra}]' from an index "
                              "that serves it)")


def check_data_files(config: RunConfig) -> None:
    hf = config.data.hf_dataset
    if hf is None:
        return
    if hf.path in LOCAL_BUILDERS and not hf.data_files:
        raise ConfigError(f"data.hf_dataset.data_files: the {hf.path} builder reads local files; list them")
    check_builder_name(hf.path)
    for pattern in hf.data_files:
        matched = glob.glob(pattern, recursive=True)
        if not matched:
            relative = "" if Path(pattern).is_absolute() else \
                f" (relative paths are read from the current directory, {Path.cwd()})"
            raise ConfigError(f"data.hf_dataset.data_files: {pattern} matches no file{relative}")
        folders = [path for path in matched if Path(path).is_dir()]
        if folders:
            raise ConfigError(f"data.hf_dataset.data_files: {folders[0]} is a directory; list its files, e.g. "
                              f"{folder_glob(Path(folders[0]), hf.path)}")


def folder_glob(folder: Path, builder: str) -> Path:
    """The glob that lists a folder's data files for the hint: ``folder/*.jsonl`` when such files sit in the
    folder itself, ``folder/**/*.jsonl`` when they sit only in subfolders (globs take ``**``)."""
    suffix = {"json": "jsonl", "text": "txt"}.get(builder, builder)
    if not any(folder.glob(f"*.{suffix}")) and any(folder.glob(f"**/*.{suffix}")):
        return folder / "**" / f"*.{suffix}"
    return folder / f"*.{suffix}"


def check_hub_dataset(config: RunConfig) -> None:
    """A dataset named by its Hub id must be readable here before the nodes start: otherwise each node retries the
    Hub for about half a minute and fails with the same error (every restart again). Resolves the dataset's
    builder only (metadata from the cache or the Hub; no data is downloaded), with the Hub client's retry
    warnings kept to the one-line error."""
    hf = config.data.hf_dataset
    if hf is None or hf.path in LOCAL_BUILDERS or Path(hf.path).exists():
        return
    import contextlib
    from datasets import load_dataset_builder
    from geodiloco.runtime.hf_data import reading_error
    print(f"[geodiloco] data.hf_dataset: looking {hf.path!r} up in the datasets cache and on the Hugging Face Hub",
          flush=True)
    quiet = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [log.level for log in quiet]
    with contextlib.ExitStack() as restore:
        for log, level in zip(quiet, levels):
            log.setLevel(logging.ERROR)
            restore.callback(log.setLevel, level)
        try:
            load_dataset_builder(hf.path, hf.name, data_files=hf.data_files or None)
        except Exception as err:  # datasets' and the Hub client's own errors, whatever their types
            raise ConfigError(f"data.hf_dataset.path: {hf.path!r} cannot be read on this machine ({reading_error(err)}): "
                              "it is not in the datasets cache, and the Hugging Face Hub did not give it (check the id "
                              "and data.hf_dataset.name, and the network); load it once where the Hub is reachable "
                              "(datasets caches it), or save it to local files and name them with path: json (or "
                              "text, csv, parquet) and data_files") from None


JSON_HEAD_BYTES = 1 << 20
"""How much of each local JSON Lines file the launcher reads before the nodes start (the rest is checked by
the nodes as they read it, with the same messages)."""
JSON_FILES_CHECKED = 64


BUILDER_SPELLINGS = {"jsonl": "json", "jsonlines": "json", "ndjson": "json", "txt": "text", "tsv": "csv",
                     "pq": "parquet"}


def check_builder_name(path: str) -> None:
    """A misspelt local builder ("jsonl" for "json") is not a local folder, so datasets would look for it on the
    Hub, and retry for minutes offline: name the builder meant instead."""
    import difflib
    if path in LOCAL_BUILDERS or Path(path).exists() or "/" in path:
        return
    meant = BUILDER_SPELLINGS.get(path.lower()) or next(iter(difflib.get_close_matches(path.lower(), LOCAL_BUILDERS,
                                                                                      n=1, cutoff=0.75)), None)
    if meant is not None:
        raise ConfigError(f"data.hf_dataset.path: {path!r} is no local builder nor folder (datasets would look for it "
                          f"on the Hugging Face Hub); for local files write {meant!r}")


def check_text_field(config: RunConfig) -> None:
    """Each local JSON Lines file (up to ``JSON_FILES_CHECKED``) holds text: it is not empty, its head is UTF-8
    and parses line by line as JSON, and its first record has ``text_field``."""
    hf = config.data.hf_dataset
    if hf is None or hf.path != "json" or not hf.data_files:
        return
    files = sorted({path for pattern in hf.data_files for path in glob.glob(pattern, recursive=True)})
    for path in files[:JSON_FILES_CHECKED]:
        check_json_lines_head(Path(path), hf.text_field)


COMPRESSED_SUFFIXES = {".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4"}


def check_json_lines_head(path: Path, text_field: str) -> None:
    """Refuse what datasets' json builder cannot read either; a compressed file, a JSON array or a pretty-printed
    document (not one object per line) is left to it."""
    if path.suffix.lower() in COMPRESSED_SUFFIXES:
        return
    with open(path, "rb") as handle:
        head = handle.read(JSON_HEAD_BYTES)
    if not head.strip():
        raise ConfigError(f"data.hf_dataset.data_files: {path} is empty; remove it from the corpus or fill it")
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # not a character cut by the head's end
            raise ConfigError(f"data.hf_dataset.data_files: {path} is not UTF-8 text (byte {err.start}: "
                              f"{err.reason}); re-encode it as UTF-8 (iconv -t UTF-8)") from None
        text = head[:err.start].decode("utf-8-sig")
    if text.lstrip().startswith("["):
        return  # one JSON array of records
    lines = text.splitlines()
    complete = lines if len(head) < JSON_HEAD_BYTES else lines[:-1]  # the last line may be cut by the head
    first_record = None
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            if first_record is None:
                return  # not one object per line (a pretty-printed document): datasets reads it or says why
            raise ConfigError(f"data.hf_dataset.data_files: {path} line {number} is not JSON ({err}); a JSON "
                              "Lines corpus holds one JSON object per line") from None
        first_record = record if first_record is None else first_record
    if isinstance(first_record, dict) and text_field not in first_record:
        raise ConfigError(f"data.hf_dataset.text_field: records have no {text_field!r} field; their fields are "
                          f"{', '.join(sorted(first_record))} (first record of {path})")


def check_stream_shards(config: RunConfig) -> None:
    """non_iid shards of a streamed corpus deal whole data files to the nodes: there must be enough."""
    hf = config.data.hf_dataset
    if hf is None or not hf.streaming or config.data.shards != "non_iid":
        return
    from geodiloco.runtime.hf_data import non_iid_stream_problem, stream_files
    problem = non_iid_stream_problem(len(stream_files(hf, config.data.shards)), len(config.nodes))
    if problem:
        raise ConfigError(problem)


def tokenizer_vocab_size(tokenizer_dir: Path) -> int | None:
    """Tokens in a fast tokenizer's tokenizer.json (added tokens included); None when the directory
    holds only a slow tokenizer (checked when the node loads it)."""
    tokenizer_file = tokenizer_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        return None
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(tokenizer_file)).get_vocab_size(with_added_tokens=True)
    except Exception as err:  # tokenizers raises its own Exception subclass for malformed files
        raise ConfigError(f"data.tokenizer: {tokenizer_file} cannot be read ({err})") from None


def check_tokenizer(config: RunConfig) -> None:
    tokenizer = config.data.tokenizer
    if tokenizer is None:
        return
    tokenizer_dir = Path(tokenizer)
    if not (tokenizer_dir / "tokenizer_config.json").is_file() and not (tokenizer_dir / "tokenizer.json").is_file():
        raise ConfigError(f"data.tokenizer: {tokenizer} is not a tokenizer directory (no tokenizer.json or "
                          "tokenizer_config.json); save one with tokenizer.save_pretrained(DIR)")
    check_vocab_fits(tokenizer_vocab_size(tokenizer_dir), config)


def tokenizer_notices(tokenizer: str | None) -> list[str]:
    """A tokenizer with no end-of-sequence nor separator token: documents then run into each other."""
    if tokenizer is None:
        return []
    settings: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            settings.update(json.loads((Path(tokenizer) / name).read_text()))
        except (OSError, ValueError):
            continue
    if settings.get("eos_token") or settings.get("sep_token"):
        return []
    return [f"data.tokenizer: {tokenizer} names no eos_token nor sep_token, so documents are packed back to back "
            "with no boundary between them; set eos_token in its tokenizer_config.json to mark one"]


def check_vocab_fits(vocab_size: int | None, config: RunConfig) -> None:
    model_vocab = config.model.dims().vocab_size
    if vocab_size is not None and vocab_size > model_vocab:
        raise ConfigError(f"data.tokenizer: its vocabulary has {vocab_size} tokens but the model's embedding "
                          f"has {model_vocab} (vocab_size); use a tokenizer of at most {model_vocab} tokens "
                          "or a model with a larger vocab_size")


def check_model_files(config: RunConfig) -> None:
    hf = config.model.hf
    if hf is not None and hf.pretrained:
        weights = list(Path(hf.pretrained).glob("*.safetensors")) + list(Path(hf.pretrained).glob("*.bin"))
        if not weights:
            raise ConfigError(f"model.hf.pretrained: {hf.pretrained} holds no weights (*.safetensors); "
                              "give a directory written by save_pretrained or `geodiloco export`")
    if hf is not None:
        check_model_type(hf)


def check_model_type(hf) -> None:
    """The config's model_type is one transformers builds (else every node would fail on it, and restart)."""
    import difflib
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return  # checked where the nodes build the model, with the install hint
    from geodiloco.runtime.hf_model import read_hf_config
    path = hf_config_json(hf.config, hf.pretrained)
    field = "model.hf.config" if hf.config else "model.hf.pretrained"
    model_type = read_hf_config(path, field)["model_type"]
    if model_type not in CONFIG_MAPPING_NAMES:
        close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING_NAMES), n=3)
        hint = f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
        raise ConfigError(f"{field}: {path} has model_type {model_type!r}, which this transformers does not "
                          f"build{hint}")


GPU_NOTICES_ENV = "GEODILOCO_GPU_NOTICES"
"""``shown`` in the nodes ``geodiloco run`` starts: the launcher's preflight already printed each GPU name's
notice (a default row, a stand-in) and each balancing option the policy does not read, so the nodes do
not print them again (``quiet_gpu_notices``)."""
NOTICE_LOGGERS = ("geodiloco.predictor", "geodiloco.balancer")


def quiet_gpu_notices(environ=None) -> None:
    """In a node whose launcher printed the config's notices, keep the predictor's and the balancer's
    warnings to errors."""
    if (os.environ if environ is None else environ).get(GPU_NOTICES_ENV) == "shown":
        for name in NOTICE_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


def check_gpu_names(config: RunConfig) -> None:
    """Every node's GPUs resolve to a datasheet row, a probe or a stand-in (the latter two with a notice)."""
    from geodiloco.predictor.unknown_gpus import device_spec
    for node in config.nodes:
        for gpu in node.gpus:
            device_spec(gpu)


def check_emulated_gpus(config: RunConfig) -> None:
    """Every GPU a virtual GPU emulates (``emulate.gpu``, or the node's own with ``from_gpus``) is a row of
    the table: its datasheet sets the emulated speed, the run's ground truth, so a misspelt name must not
    quietly become the unknown-GPU stand-in as it may for a node's real GPUs."""
    from geodiloco.predictor.specs import lookup_gpu
    from geodiloco.predictor.unknown_gpus import why_unresolved
    for index, node in enumerate(config.nodes):
        emulate = node.emulate
        if emulate is None or emulate.gpu is None or emulate.cpu_share is not None:
            continue
        source = (f"nodes[{index}].gpus (emulate.gpu: from_gpus)" if emulate.gpu == "from_gpus"
                  else f"nodes[{index}].emulate.gpu")
        for gpu in emulate.gpu_names(node.gpus):
            try:
                lookup_gpu(gpu)
            except ConfigError as err:
                raise ConfigError(f"{source}: unknown GPU {gpu!r} ({why_unresolved(gpu, str(err))}); a virtual GPU "
                                  "runs at its table row's speed, so name a known GPU or add a row in a GPU YAML "
                                  "file listed under the config's gpu_files (docs/predictor.md)") from None


def check_balancing_options(config: RunConfig) -> None:
    """A notice for each ``balancing:`` option the chosen policy never reads (not an error: a config
    may keep another policy's settings for later)."""
    for notice in config.balancing.unread_options():
        logging.getLogger("geodiloco.balancer").warning(notice)
    if config.diloco.mode == "sync" and "momentum_every" in config.diloco.model_fields_set:
        logging.getLogger("geodiloco.balancer").warning(
            "diloco.momentum_every has no effect under diloco.mode: sync; it is read by async mode")
    for notice in fragment_notices(config):
        logging.getLogger("geodiloco.balancer").warning(notice)


def fragment_notices(config: RunConfig) -> list[str]:
    """``diloco.fragments`` set where nothing reads it, or above what the model can be split into: streaming
    sends whole parameter tensors, so a model has at most one fragment per tensor (the planner prices as many)."""
    diloco = config.diloco
    # the default counts as unset: every run saves its whole config, and a resume reads it back
    if diloco.fragments == type(diloco).model_fields["fragments"].default:
        return []
    if diloco.mode == "async" or diloco.overlap != "streaming":
        reader = "diloco.mode: async" if diloco.mode == "async" else f"diloco.overlap: {diloco.overlap}"
        return [f"diloco.fragments has no effect under {reader}; it is read by diloco.overlap: streaming"]
    from geodiloco.predictor.workload import parameter_tensor_count
    tensors = parameter_tensor_count(config.model.dims())
    if diloco.fragments > tensors:
        return [f"diloco.fragments {diloco.fragments}: the model has {tensors} parameter tensors and streaming "
                f"sends whole tensors, so a round syncs in at most {tensors} fragments (planned so)"]
    return []


def check_byte_corpus(config: RunConfig) -> None:
    """A byte-level corpus exists and holds the eval set plus at least one training window per node."""
    from geodiloco.runtime.data import NodeShard, corpus_notices, eval_window_starts, load_corpus
    data = config.data
    if data.hf_dataset is not None:
        return
    if data.token_file is not None:
        check_token_file(config)
        return
    for notice in corpus_notices(data.source, data.max_bytes):
        print(f"[geodiloco] {notice}", flush=True)
    try:
        corpus = load_corpus(data.source, data.max_bytes)
        cap = ("data.source", "data.max_bytes", data.max_bytes)
        held_out = eval_window_starts(len(corpus), config.model.seq_len, data.eval_batches * data.eval_batch_size,
                                      config.run.seed, cap=cap)
        for index in range(len(config.nodes)):
            NodeShard(corpus, index, len(config.nodes), config.model.seq_len, config.run.seed, shards=data.shards,
                      held_out_starts=held_out, cap=cap)
    except ValueError as err:
        message = str(err)
        raise ConfigError(message if message.startswith("data.") else f"data.source: {message}") from None
    check_bytes_fit_vocab(corpus, config)


def check_token_file(config: RunConfig) -> None:
    """A token file exists, is whole, fits the model's vocabulary and holds the eval set plus a training window
    per node (``runtime/data_sources.load_tokens`` reads it as the nodes will)."""
    from geodiloco.runtime.data import NodeShard, eval_window_starts
    from geodiloco.runtime.data_sources import corpus_cap, load_tokens
    data = config.data
    tokens = load_tokens(config)
    cap = corpus_cap(config)
    held_out = eval_window_starts(len(tokens), config.model.seq_len, data.eval_batches * data.eval_batch_size,
                                  config.run.seed, cap=cap)
    for index in range(len(config.nodes)):
        NodeShard(tokens, index, len(config.nodes), config.model.seq_len, config.run.seed, shards=data.shards,
                  held_out_starts=held_out, cap=cap)
    print(f"[geodiloco] data.token_file: {len(tokens):,} tokens ({tokens.dtype}) from {data.token_file}", flush=True)


def check_bytes_fit_vocab(corpus, config: RunConfig) -> None:
    """Byte-level text feeds each byte value as a token id: one past the model's embedding would fail inside every
    node's first forward pass (and again on each restart)."""
    vocab_size = config.model.dims().vocab_size
    largest = int(corpus.max()) if len(corpus) else -1
    if largest >= vocab_size:
        raise ConfigError(f"data.source: byte-level text holds byte value {largest}, but the model's embedding has "
                          f"{vocab_size} rows (vocab_size); byte-level data needs vocab_size >= {largest + 1} (256 "
                          "covers every byte), or tokenize it: data.hf_dataset with data.tokenizer")


def check_model_fits(config: RunConfig) -> None:
    """Every node's GPUs hold the model's weights, gradients and optimizer state and one sample's
    activations (per the predictor's memory model). A larger batch than fits runs in micro-batches,
    which the planner times; a model that does not fit at batch 1 cannot train at all."""
    from geodiloco.predictor.model import node_step_model
    from geodiloco.predictor.workload import parameter_count

    dims, model = config.model.dims(), config.model
    for index, node in enumerate(config.nodes):
        if not node.gpus:
            continue
        step_model = node_step_model(list(node.gpus), dims, model.seq_len, precision=model.precision)
        for device in step_model.devices:
            if step_model.max_micro_batch_size(device) >= 1:
                continue
            need_gib = step_model.memory_bytes(1) / 2**30
            raise ConfigError(
                f"nodes[{index}].gpus: the model ({parameter_count(dims) / 1e6:.0f} M parameters, seq_len "
                f"{model.seq_len}) needs about {need_gib:.1f} GiB per GPU at batch 1 for training, more than "
                f"{device.name} holds ({device.memory_gb:g} GiB); give node {node.name} larger GPUs, or use a "
                "smaller model or model.seq_len")


def available_host_memory_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """MemAvailable of this host (GiB), None where the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_host_memory(config: RunConfig, available_gib: float | None = None) -> None:
    """Every node ``geodiloco run`` starts on this machine trains on its CPU: their steps together must fit
    its memory. A node's largest pass is its batch, or the micro-batch its GPUs' memory caps it at (the
    plan's); without this a too-large batch is OOM-killed by the kernel and restarted by its agent, with
    nothing naming the setting."""
    from geodiloco.predictor.model import node_step_model
    from geodiloco.predictor.workload import training_memory_bytes

    available_gib = available_host_memory_gib() if available_gib is None else available_gib
    if available_gib is None:
        return
    dims, model = config.model.dims(), config.model
    need_gib, largest = 0.0, (0, "")
    for node in config.nodes:
        batch = node.batch_size or config.diloco.batch_size
        samples = batch
        if node.gpus:
            samples = min(batch, node_step_model(list(node.gpus), dims, model.seq_len,
                                                 precision=model.precision).max_batch_size())
        need_gib += training_memory_bytes(dims, samples, model.seq_len, model.precision).total / 2**30
        largest = max(largest, (samples, node.name))
    if need_gib > available_gib:
        raise ConfigError(
            f"diloco.batch_size: the {len(config.nodes)} nodes this machine runs need about {need_gib:.1f} GiB for "
            f"their steps (node {largest[1]}: passes of {largest[0]} samples x seq_len {model.seq_len}), more than "
            f"the {available_gib:.1f} GiB it has available; lower diloco.batch_size (or a node's batch_size), "
            "model.seq_len, or run fewer nodes here")


def preflight(config: RunConfig, data: bool = True) -> None:
    """Every check above; the first problem raises ConfigError. ``data`` False skips reading the byte
    corpus (a training process reads it next anyway, and reports the same errors) and the data notices
    (the launcher's preflight prints them once)."""
    check_extras(config)
    config.model.dims()
    check_gpu_names(config)
    check_emulated_gpus(config)
    check_balancing_options(config)
    check_model_fits(config)
    check_model_files(config)
    check_data_files(config)
    check_text_field(config)
    check_stream_shards(config)
    if data:
        check_byte_corpus(config)
        check_hub_dataset(config)
    check_tokenizer(config)
    if data:
        for notice in tokenizer_notices(config.data.tokenizer):
            print(f"[geodiloco] {notice}", flush=True)

