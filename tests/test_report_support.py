"""Synthetic run directories for the report tests (no tests here).

The default cluster: node ``a`` (2x A30, seoul) and node ``b`` (4x RTX 2080 Ti,
busan), rounds of 10 s starting at unix 1000 s; ``a`` computes 6 s, waits 3 s,
syncs 1 s (idle 4 s); ``b`` computes 8 s, syncs 1 s, 0.5 s other (idle 1.5 s).
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

NODE_A = {"node": "a", "site": "seoul", "gpus": ["A30", "A30"], "num_gpus": 2,
          "compute_s": 6.0, "wait_s": 3.0, "comm_s": 1.0, "overhead_s": 0.0, "tokens": 1000,
          "local_steps": 100, "batch_size": 4}
NODE_B = {"node": "b", "site": "busan", "gpus": ["RTX 2080 Ti"] * 4, "num_gpus": 4,
          "compute_s": 8.0, "wait_s": 0.0, "comm_s": 1.0, "overhead_s": 0.5, "tokens": 2000,
          "local_steps": 100, "batch_size": 4}


def idle_record(round_index: int, node: dict, run_id: str = "run-1", policy: str = "uniform",
                round_s: float = 10.0, **overrides) -> dict:
    record = {"run_id": run_id, "round": round_index, "policy": policy, "source": "simulate",
              "round_start": 1000.0 + round_s * round_index, "round_end": 1000.0 + round_s * (round_index + 1)}
    record.update(node)
    record.update(overrides)
    return record


def default_records(rounds: int = 3, **overrides) -> list[dict]:
    return [idle_record(r, node, **overrides) for r in range(rounds) for node in (NODE_A, NODE_B)]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_run(directory: Path, records: list[dict], plans: list[dict] | None = None,
              metrics: list[dict] | None = None, config: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_jsonl(directory / "idle.jsonl", records)
    if plans is not None:
        write_jsonl(directory / "plan.jsonl", plans)
    if metrics is not None:
        write_jsonl(directory / "metrics.jsonl", metrics)
    if config is not None:
        (directory / "config.yaml").write_text(yaml.safe_dump(config))
    return directory


def default_run(directory: Path, **overrides) -> Path:
    config = {"run": {"name": "demo"}, "balancing": {"policy": "uniform"},
              "nodes": [{"name": "a", "site": "seoul", "gpus": ["A30", "A30"]},
                        {"name": "b", "site": "busan", "gpus": ["RTX 2080 Ti"] * 4}]}
    return write_run(directory, default_records(**overrides), config=config)


def test_a_readme_block_is_replaced_between_its_markers_only(tmp_path):
    from geodiloco.report.readme_block import replace_marked_block
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- x:start -->\nold\n<!-- x:end -->\nafter\n")
    assert replace_marked_block(readme, "<!-- x:start -->", "<!-- x:end -->", "new | table\n\n")
    assert readme.read_text() == "intro\n<!-- x:start -->\nnew | table\n<!-- x:end -->\nafter\n"
    assert not replace_marked_block(readme, "<!-- y:start -->", "<!-- y:end -->", "other")
    assert readme.read_text() == "intro\n<!-- x:start -->\nnew | table\n<!-- x:end -->\nafter\n"
