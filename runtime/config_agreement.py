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
import json
from typing import Any, Optional

from geodiloco.common.schema import ConfigError

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


SAME_SETTINGS = ("every site must start with the same run settings (only paths, logging, checkpoint writing, "
                 "timeouts, addresses and the inner optimizer may differ)")


def check_same_config(subject: dict, reference: dict, subject_node: str, reference_node: str,
                      what_now: str = "copy one config file to every site") -> None:
    """ConfigError naming the settings in which ``subject_node``'s config differs from ``reference_node``'s."""
    found = differences(subject, reference)
    if not found:
        return
    raise ConfigError(f"node {subject_node}'s config differs from node {reference_node}'s in "
                      f"{listed_differences(found, subject_node, reference_node)}; {SAME_SETTINGS}: {what_now}")


def listed_differences(found: list[tuple[str, Any, Any]], subject_node: str, reference_node: str) -> str:
    listed = "; ".join(f"{path}: {value!r} at node {subject_node}, {other!r} at node {reference_node}"
                       for path, value, other in found[:MAX_LISTED])
    more = f" (and {len(found) - MAX_LISTED} more)" if len(found) > MAX_LISTED else ""
    return listed + more


def leave_or_go_on(views: list[tuple[str, dict]], me: str, trained: set[str]) -> None:
    """Under an elastic agent that may restart its workers: when some sites' views differ from the run's
    (``settle_differences``), raise ConfigError on those (they leave) and ``OtherSitesLeave`` on the others;
    nothing when all agree or no side can be chosen (``check_all_same`` then stops every site)."""
    settled = settle_differences(views, trained)
    if settled is None:
        return
    reference_node, leaving = settled
    by_node = dict(views)
    if me in leaving:
        check_same_config(by_node[me], by_node[reference_node], me, reference_node,
                          what_now="this site leaves the run and the other sites go on without it; copy the run's "
                                   "config file to this site and start it again")
    first = leaving[0]
    found = differences(by_node[first], by_node[reference_node])
    raise OtherSitesLeave(f"{', '.join(leaving)} joined with a config that differs from the run's "
                          f"({listed_differences(found[:1], first, reference_node)}); "
                          f"{'they leave' if len(leaving) > 1 else 'it leaves'} and the run goes on without "
                          f"{'them' if len(leaving) > 1 else 'it'}")


class OtherSitesLeave(Exception):
    """Raised on the sites whose config is the run's own when other sites joined with a different one: those
    leave (``settle_differences``), and these stop their workers so that their agents form a world without them."""


def settle_differences(views: list[tuple[str, dict]], trained: set[str]) -> Optional[tuple[str, list[str]]]:
    """When the sites' views differ, which side keeps the run: (a node whose view is the run's, the nodes that
    must leave), or None when all agree or no side can be chosen (then every site stops, ``check_all_same``).

    The run's view is the one of the nodes that were already training in this job (``trained``) when they all
    hold one view; otherwise the view a strict majority of the nodes hold. A site that joins a running run with
    an edited config is the one to leave, not the run."""
    groups: dict[str, list[str]] = {}
    view_of: dict[str, dict] = {}
    for node, view in dict(views).items():  # one entry per node, whatever its ranks
        key = json.dumps(view, sort_keys=True)
        groups.setdefault(key, []).append(node)
        view_of[key] = view
    if len(groups) < 2:
        return None
    running = [key for key, nodes in groups.items() if trained & set(nodes)]
    if len(running) == 1:
        keep = running[0]
    else:
        sizes = sorted((len(nodes) for nodes in groups.values()), reverse=True)
        if sizes[0] == sizes[1]:
            return None
        keep = max(groups, key=lambda key: len(groups[key]))
    leaving = [node for key, nodes in groups.items() if key != keep for node in nodes]
    return groups[keep][0], leaving


def check_all_same(views: list[tuple[str, dict]]) -> None:
    """Every (node, view) against the first: the same ConfigError on every site that holds this list."""
    if not views:
        return
    reference_node, reference = views[0]
    for node, view in views[1:]:
        check_same_config(view, reference, node, reference_node)
