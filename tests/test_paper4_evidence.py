"""Evidence mode of the paper4 reproduction: real-compute configs and the multi-seed tables."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from geodiloco.balancer.cluster import load_cluster
from geodiloco.runtime.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "paper4"))

import configs  # noqa: E402
import evidence  # noqa: E402

PAPER_STEP_S = {"node1": 0.2946, "node2": 0.3045, "node3": 0.1589, "node4": 0.2549}


def test_real_shares_follow_the_papers_speeds_and_leave_cpu_for_the_rest():
    shares = configs.real_shares()
    assert sum(shares.values()) == pytest.approx(1.6, abs=1e-3)
    for name, step_s in PAPER_STEP_S.items():
        assert shares[name] * step_s == pytest.approx(shares["node1"] * PAPER_STEP_S["node1"], rel=1e-3)


def test_a_real_truth_config_is_real_compute_with_a_large_held_out_set():
    scaling = configs.Scaling(rounds=6, truth="real")
    config = RunConfig.model_validate(configs.run_config("time", scaling, configs.SLOWDOWN, seed=2,
                                                         shards="non_iid", offline_eval=True))
    assert config.run.seed == 2 and config.data.shards == "non_iid"
    assert config.model.seq_len == configs.REAL_SEQ_LEN
    assert all(node.emulate.cpu_share and node.emulate.gpu is None and node.emulate.step_time_s is None
               for node in config.nodes)
    assert [event.factor for event in config.node("node1").emulate.slowdown] == [configs.SLOWDOWN.slow_factor]
    assert config.node("node2").emulate.slowdown == []
    assert config.data.eval_every_rounds == 0 and config.data.eval_batches * config.data.eval_batch_size == 512
    assert config.checkpoint.every_rounds == 1 and config.checkpoint.keep == 6
    assert [node.gpus for node in config.nodes] == [node.gpus for node in load_cluster(configs.PAPER_CLUSTER).nodes]


def numbers(wait_share, idle_share, losses, tokens=(100.0, 200.0, 300.0), wall_s=(10.0, 20.0, 30.0)):
    return {"wait_share": wait_share, "idle_share": idle_share, "warm_wait_share": wait_share,
            "warm_idle_share": idle_share, "warm_sync_share": 0.01, "curve_tokens": list(tokens),
            "curve_wall_s": list(wall_s), "curve_loss": list(losses), "curve_se": [0.02, 0.02, 0.02],
            "eval_sequences": 512}


def test_changes_against_uniform_pair_each_seed_and_losses_meet_at_common_points():
    runs = {
        "uniform": {0: numbers(0.20, 0.30, [3.0, 2.8, 2.6]), 1: numbers(0.10, 0.20, [3.0, 2.9, 2.7])},
        "time": {0: numbers(0.02, 0.12, [3.0, 2.7, 2.5], wall_s=(8.0, 16.0, 24.0)),
                 1: numbers(0.01, 0.10, [3.0, 2.8, 2.6], wall_s=(8.0, 16.0, 24.0))},
    }
    rows, equal_tokens, equal_wall_s = evidence.policy_rows(runs)
    assert (equal_tokens, equal_wall_s) == (300.0, 24.0)
    time_row = next(row for row in rows if row["policy"] == "time")
    # seed 0: 0.02 / 0.20 - 1 = -0.90; seed 1: 0.01 / 0.10 - 1 = -0.90
    assert time_row["warm_wait_share_vs_uniform"]["mean"] == pytest.approx(-0.90)
    # idle: 0.12 / 0.30 - 1 = -0.60 and 0.10 / 0.20 - 1 = -0.50
    assert time_row["warm_idle_share_vs_uniform"]["min"] == pytest.approx(-0.60)
    assert time_row["warm_idle_share_vs_uniform"]["max"] == pytest.approx(-0.50)
    uniform_row = next(row for row in rows if row["policy"] == "uniform")
    # uniform at 24 s: seed 0 between 2.8 (20 s) and 2.6 (30 s) -> 2.72; seed 1 -> 2.82
    assert uniform_row["loss_at_equal_wall"]["mean"] == pytest.approx((2.72 + 2.82) / 2)
    assert time_row["loss_at_equal_tokens"]["mean"] == pytest.approx((2.5 + 2.6) / 2)
    # paired with uniform of the same seed at 300 tokens: 2.5 - 2.6 and 2.6 - 2.7
    assert time_row["loss_at_equal_tokens_vs_uniform"]["mean"] == pytest.approx(-0.1)
    assert time_row["loss_at_equal_tokens_vs_uniform"]["std"] == pytest.approx(0.0, abs=1e-12)
