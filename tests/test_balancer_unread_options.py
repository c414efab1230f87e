"""Balancing options a policy never reads: the notice names each, and the claim holds. Every option the
notice calls unread, set to a value far from its default, leaves every plan of three rounds (with
measured rounds in between, a node slowing down) exactly as it was; the same changes under the
policies that read them do change the plans, so the scenario can tell."""
from __future__ import annotations

import logging

import pytest

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.config import POLICY_NAMES, BalancingConfig
from geodiloco.balancer.plan import RoundMeasurement
from geodiloco.balancer.planner import Planner
from geodiloco.predictor.workload import preset_dims
from geodiloco.runtime.cli import main

CHANGED = {
    "reference_node": "fastest", "round_time_s": 30.0, "max_comm_fraction": 0.01, "max_phase_stretch": 5.0,
    "tokens_per_round": 2_000_000, "max_grad_accum": 1, "throughput_tolerance": 0.5, "max_batch_factor": 1.0,
    "flops_field": "fp32_tflops", "batch_search": "exact", "calibration_rounds": 0, "adaptive_base": "hybrid",
    "hysteresis": 0.5, "deadline_step_slack": 2.0,
}
NODES = [NodeSpec(name="a", gpus=["A100-SXM4-80GB"]), NodeSpec(name="b", gpus=["RTX 3090"]),
         NodeSpec(name="c", gpus=["T4"])]


def plans(options: dict) -> list[tuple]:
    """(H, B, micro-batch) per node for rounds 0-2; node b measures 1.5x its predicted step time, node c
    0.8x from round 1 on."""
    planner = Planner(BalancingConfig(**options), NODES, preset_dims("llama-150m"), 1024, 50, 4)
    made = []
    for round_idx in range(3):
        plan = planner.plan(round_idx)
        made.append(tuple((node.local_steps, node.batch_size, node.micro_batch_size) for node in plan.nodes))
        for node in plan.nodes:
            slower = {"b": 1.5, "c": 0.8 if round_idx >= 1 else 1.0}.get(node.name, 1.0)
            planner.observe(RoundMeasurement(node=node.name, round=round_idx, batch_size=node.batch_size,
                                             local_steps=node.local_steps,
                                             step_times_s=[node.predicted_step_s * slower] * 4))
    return made


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_an_option_called_unread_changes_no_plan(policy):
    baseline = plans({"policy": policy})
    for option, value in CHANGED.items():
        config = BalancingConfig(policy=policy, **{option: value})
        unread = any(notice.startswith(f"balancing.{option} ") for notice in config.unread_options())
        if unread:
            assert plans({"policy": policy, option: value}) == baseline, option


@pytest.mark.parametrize("policy, option", [
    ("batch_by_flops", "flops_field"), ("max_batch_by_memory", "batch_search"), ("time", "reference_node"),
    ("time", "calibration_rounds"), ("hybrid", "tokens_per_round"), ("hybrid", "max_batch_factor"),
    ("adaptive", "adaptive_base"), ("adaptive", "hysteresis"), ("deadline", "deadline_step_slack"),
])
def test_the_same_change_under_a_policy_that_reads_it_changes_the_plans(policy, option):
    assert BalancingConfig(policy=policy, **{option: CHANGED[option]}).unread_options() == []
    assert plans({"policy": policy, option: CHANGED[option]}) != plans({"policy": policy})


def test_the_notices_name_the_option_the_policy_and_who_reads_it():
    config = BalancingConfig(policy="adaptive", hysteresis=0.1, calibration_rounds=2, tokens_per_round=10**6,
                             batch_search="exact", min_local_steps=2)
    assert config.unread_options() == [
        "balancing.batch_search has no effect under policy adaptive (its rule: time); it is read by "
        "max_batch_by_memory",
        "balancing.calibration_rounds has no effect under policy adaptive (its rule: time); it is read by time, hybrid",
        "balancing.tokens_per_round has no effect under policy adaptive (its rule: time); it is read by hybrid, "
        "and adaptive/deadline with adaptive_base: hybrid",
    ]
    # defaults the user did not write are not theirs to hear about
    assert BalancingConfig(policy="uniform").unread_options() == []
    # nor are defaults written out, as a run's own config.yaml does (what --resume reads back)
    spelled_out = BalancingConfig(policy="time").model_dump(mode="json")
    assert BalancingConfig.model_validate(spelled_out).unread_options() == []


def test_plan_prints_the_notice_and_still_plans(tmp_path, capsys, caplog):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - {name: a, gpus: [A100-SXM4-80GB]}\n  - {name: b, gpus: [RTX 3090]}\n")
    with caplog.at_level(logging.WARNING, logger="geodiloco.balancer"):
        code = main(["plan", "--cluster", str(cluster), "--policy", "uniform", "--set", "hysteresis=0.1", "--json"])
    assert code == 0
    assert "balancing.hysteresis has no effect under policy uniform; it is read by adaptive, deadline" in caplog.text
    assert '"local_steps"' in capsys.readouterr().out


def test_a_run_config_gets_the_notice_at_preflight_and_the_demo_gets_none(caplog):
    from geodiloco.runtime.config import load_config
    from geodiloco.runtime.preflight import preflight
    with caplog.at_level(logging.WARNING, logger="geodiloco.balancer"):
        preflight(load_config(None), data=False)
    assert "has no effect" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="geodiloco.balancer"):
        preflight(load_config(None, ["balancing.deadline_step_slack=0.5"]), data=False)
    # the demo's policy is time
    assert "balancing.deadline_step_slack has no effect under policy time; it is read by deadline" in caplog.text


def test_momentum_every_in_a_sync_run_gets_a_notice_and_in_async_none(caplog):
    from pathlib import Path

    from geodiloco.runtime.config import load_config
    from geodiloco.runtime.preflight import check_balancing_options
    async_config = str(Path(__file__).resolve().parents[1] / "experiments" / "configs" / "async.yaml")
    notice = "diloco.momentum_every has no effect under diloco.mode: sync; it is read by async mode"
    with caplog.at_level(logging.WARNING, logger="geodiloco.balancer"):
        check_balancing_options(load_config(async_config))
        assert notice not in caplog.text
        check_balancing_options(load_config(async_config, ["diloco.mode=sync"]))
    assert notice in caplog.text


def test_fragments_past_the_models_tensors_are_planned_as_the_run_sends_them_and_said(caplog):
    """The tiny model has 17 parameter tensors (2 layers x 7 weights, 2 norms, embedding and head counted by
    torch below): streaming sends whole tensors, so 1,024 fragments are 17 syncs, in the plan as in the run."""
    from geodiloco.runtime.config import load_config
    from geodiloco.runtime.models import build_configured_model
    from geodiloco.runtime.preflight import check_balancing_options
    from geodiloco.runtime.sync.overlap import split_fragments
    from geodiloco.runtime.trainer import planned_sync
    config = load_config(None, ["diloco.overlap=streaming", "diloco.fragments=1024"])
    params = list(build_configured_model(config.model, 0).parameters())
    assert len(params) == 17
    assert len(split_fragments([param.numel() for param in params], 1024)) <= 17  # what the run sends
    assert planned_sync(config).sync_count == 17
    with caplog.at_level(logging.WARNING, logger="geodiloco.balancer"):
        check_balancing_options(config)
        check_balancing_options(load_config(None, ["diloco.overlap=none", "diloco.fragments=8"]))
        check_balancing_options(load_config(None, ["diloco.overlap=streaming", "diloco.fragments=8"]))
    assert caplog.messages == [
        "diloco.fragments 1024: the model has 17 parameter tensors and streaming sends whole tensors, so a round "
        "syncs in at most 17 fragments (planned so)",
        "diloco.fragments has no effect under diloco.overlap: none; it is read by diloco.overlap: streaming"]


def test_a_saved_config_that_spells_out_the_default_fragments_gets_no_notice(tmp_path, caplog):
    # every run saves its whole config; an async run's --resume reads it back with fragments: 4 written out
    from geodiloco.runtime.config import load_config
    from geodiloco.runtime.preflight import check_balancing_options
    saved = tmp_path / "config.yaml"
    saved.write_text(load_config(None, ["diloco.mode=async", "diloco.overlap=none"]).to_yaml())
    assert "fragments: 4" in saved.read_text()
    with caplog.at_level(logging.WARNING, logger="geodiloco.balancer"):
        check_balancing_options(load_config(saved, []))
    assert not any("fragments" in message for message in caplog.messages)


def test_the_command_line_prints_notices_with_the_prefix_once(tmp_path):
    import subprocess
    import sys
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - {name: a, gpus: [A100-SXM4-80GB]}\n  - {name: b, gpus: [RTX 3090]}\n")
    done = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "plan", "--cluster", str(cluster),
                           "--policy", "uniform", "--set", "hysteresis=0.1"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    notice = "balancing.hysteresis has no effect under policy uniform; it is read by adaptive, deadline"
    lines = [line for line in done.stderr.splitlines() if notice in line]
    assert lines == [f"[geodiloco] {notice}"], done.stderr
