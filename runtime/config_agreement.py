"""Every site must train with the same run-defining settings: each site passes its own config file to
torchrun (or to its hivemind node), and one edited at a single site (another ``diloco.rounds``, model,
policy or node list) would otherwise surface as a hang at the end of the run, mismatched tensor sizes
in the first all-reduce, or plans that differ between sites.

``shared_view`` is what must agree: the model's shape and precision, the data's split, the outer
optimizer (every node applies the outer step to its own global copy), DiLoCo's settings, the balancing
policy and its options, the node list, the seed and wall-clock budget, the backend,
``comm.min_nodes`` and, on the torch backend, ``comm.outer_device``. Settings of one site alone may differ: paths (run directory, data source, GPU
files), logging, checkpoint writing, timeouts and addresses, and the inner optimizer (each node's own
local steps; the non-finite guard's tests poison one site that way).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from geodiloco.predictor.schema import ConfigError

MAX_LISTED = 5
"""Differences named in the error; the rest are counted."""


def shared_view(config) -> dict:
    """The settings every site must share, as plain values (``RunConfig``)."""
    dims = config.model.dims()
    data = config.data
    return {
        "run": {"seed": config.run.seed, "max_wall_s": config.run.max_wall_s},
        "model": {"dims": dataclasses.asdict(dims),
                  "seq_len": config.model.seq_len, "precision": config.model.precision},
        "data": {"shards": data.shards, "max_bytes": data.max_bytes, "eval_batches": data.eval_batches,
                 "eval_batch_size": data.eval_batch_size},
        "optim": {"outer": config.optim.outer.model_dump(mode="json")},
        "diloco": config.diloco.model_dump(mode="json"),
        "balancing": config.balancing.model_dump(mode="json"),
        "comm": {"backend": config.comm.backend, "min_nodes": config.comm.min_nodes,
                 **outer_device_view(config.comm)},
        "nodes": [node.model_dump(mode="json") for node in config.nodes],
    }


def outer_device_view(comm) -> dict:
    """On the torch backend the outer all-reduce runs where the outer state lives (gloo for ``cpu``, nccl for
    ``cuda``), and a gloo rank and an nccl rank cannot meet in one collective: every site must choose alike.
    A hivemind node averages on its CPU either way, so there it is the site's own choice."""
    return {"outer_device": comm.outer_device} if comm.backend == "torch" else {}


def differences(mine: dict, theirs: dict) -> list[tuple[str, Any, Any]]:
    """(key path, this site's value, the other's) of every setting that differs."""
    found: list[tuple[str, Any, Any]] = []
    _walk(mine, theirs, "", found)
    return found


def _walk(mine: Any, theirs: Any, path: str, found: list) -> None:
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in list(mine) + [key for key in theirs if key not in mine]:
            _walk(mine.get(key), theirs.get(key), f"{path}.{key}" if path else str(key), found)
    elif isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        for index, (left, right) in enumerate(zip(mine, theirs)):
            _walk(left, right, f"{path}[{index}]", found)
    elif mine != theirs:
        found.append((path, mine, theirs))


def check_same_config(subject: dict, reference: dict, subject_node: str, reference_node: str) -> None:
    """ConfigError naming the settings in which ``subject_node``'s config differs from ``reference_node``'s."""
    found = differences(subject, reference)
    if not found:
        return
    listed = "; ".join(f"{path}: {value!r} at node {subject_node}, {other!r} at node {reference_node}"
                       for path, value, other in found[:MAX_LISTED])
    more = f" (and {len(found) - MAX_LISTED} more)" if len(found) > MAX_LISTED else ""
    raise ConfigError(f"node {subject_node}'s config differs from node {reference_node}'s in {listed}{more}; every "
                      "site must start with the same run settings (only paths, logging, checkpoint writing, "
                      "timeouts, addresses and the inner optimizer may differ): copy one config file to every site")


def check_all_same(views: list[tuple[str, dict]]) -> None:
    """Every (node, view) against the first: the same ConfigError on every site that holds this list."""
    if not views:
        return
    reference_node, reference = views[0]
    for node, view in views[1:]:
        check_same_config(view, reference, node, reference_node)
