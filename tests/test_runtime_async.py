"""Asynchronous DiLoCo: delayed Nesterov, the global model's host, config checks, and real runs
(3 nodes, gloo point-to-point on CPU, emulated speeds 1 : 2 : 4)."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.diloco import DelayedNesterov, OuterState
from geodiloco.runtime.idle import RoundClock
from geodiloco.runtime.state_file import load_state
from geodiloco.runtime.sync.async_server import GlobalModelHost

from runtime_helpers import geodiloco, read_jsonl, small_config, write_config


def model_of(values: list[float]) -> nn.Module:
    model = nn.Linear(len(values), 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([values]))
    return model


# ----- delayed Nesterov ------------------------------------------------------------------------

@pytest.mark.parametrize("nesterov", [True, False])
def test_delayed_nesterov_equals_synchronous_sgd_over_each_period(nesterov):
    """N updates that are not stale = torch's SGD step on their sum, period after period."""
    start = [1.0, -2.0, 0.5]
    outer = OuterState(model_of(start), lr=0.7, momentum=0.9, nesterov=nesterov)
    delayed = DelayedNesterov(outer, lr=0.7, momentum=0.9, nesterov=nesterov, period=3)
    reference = torch.tensor([start], requires_grad=True)
    sgd = torch.optim.SGD([reference], lr=0.7, momentum=0.9, nesterov=nesterov)
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        updates = [torch.randn(3, generator=generator) / 3 for _ in range(3)]
        for update in updates:
            delayed.apply(update)
        reference.grad = torch.stack(updates).sum(0).view(1, 3)
        sgd.step()
        assert torch.allclose(outer.global_params[0], reference.detach(), atol=1e-6)


def test_delayed_nesterov_moves_by_plain_steps_between_momentum_steps():
    outer = OuterState(model_of([0.0, 0.0]), lr=0.5, momentum=0.9, nesterov=True)
    delayed = DelayedNesterov(outer, lr=0.5, momentum=0.9, nesterov=True, period=2)
    delayed.apply(torch.tensor([1.0, -1.0]))
    assert outer.global_params[0].tolist() == [[-0.5, 0.5]]
    assert "momentum_buffer" not in outer.optimizer.state[outer.global_params[0]]
    delayed.apply(torch.tensor([1.0, 1.0]))
    # second plain step -0.5*[1, 1], then momentum m = [2, 0]: -0.5*0.9*[2, 0]
    assert torch.allclose(outer.global_params[0], torch.tensor([[-0.5 - 0.5 - 0.9, 0.5 - 0.5]]))


def test_delayed_nesterov_state_round_trips():
    outer = OuterState(model_of([0.0, 0.0]), lr=0.5, momentum=0.9, nesterov=True)
    delayed = DelayedNesterov(outer, lr=0.5, momentum=0.9, nesterov=True, period=3)
    delayed.apply(torch.tensor([1.0, 2.0]))
    saved = delayed.state_dict()
    other = DelayedNesterov(OuterState(model_of([0.0, 0.0]), 0.5, 0.9, True), 0.5, 0.9, True, period=3)
    other.load_state_dict(saved)
    assert other.received == 1 and other.pending[0].tolist() == [[1.0, 2.0]]


# ----- the host --------------------------------------------------------------------------------

def stats(node: str, tokens: int = 100, steps: int = 10, finite: bool = True, saved_round=None) -> dict:
    return {"node": node, "tokens": tokens, "steps": steps, "batch_size": 4, "finite": finite,
            "saved_round": saved_round}


def host_of(names: list[str], period: int = 100) -> GlobalModelHost:
    outer = OuterState(model_of([0.0, 0.0]), lr=1.0, momentum=0.0, nesterov=False)
    return GlobalModelHost(outer, DelayedNesterov(outer, 1.0, 0.0, False, period), names)


def test_host_counts_staleness_as_versions_applied_since_the_pull():
    host = host_of(["a", "b", "c"])
    first = host.push("a", stats("a"), torch.tensor([3.0, 0.0]), pulled_version=0, weighting="uniform")
    second = host.push("b", stats("b"), torch.tensor([0.0, 3.0]), pulled_version=0, weighting="uniform")
    third = host.push("a", stats("a"), torch.tensor([3.0, 3.0]), pulled_version=first.version, weighting="uniform")
    assert (first.staleness, second.staleness, third.staleness) == (0, 1, 1)
    assert (first.version, second.version, third.version) == (1, 2, 3)
    # uniform weights 1/3: global = -(1/3) * sum of the pseudo-gradients
    assert torch.allclose(third.global_flat, torch.tensor([-2.0, -2.0]))


def test_host_hands_each_node_the_phases_it_has_not_seen_once():
    host = host_of(["a", "b"])
    host.push("a", stats("a", tokens=1), torch.zeros(2), 0, "uniform")
    host.push("a", stats("a", tokens=2), torch.zeros(2), 1, "uniform")
    reply = host.push("b", stats("b"), torch.zeros(2), 0, "uniform")
    assert [item["tokens"] for item in reply.news] == [1, 2]
    assert host.push("b", stats("b"), torch.zeros(2), 3, "uniform").news == []


def test_host_leaves_out_a_non_finite_node_and_weighs_by_tokens():
    host = host_of(["a", "b"])
    left_out = host.push("a", stats("a", finite=False), torch.full((2,), float("nan")), 0, "tokens")
    assert left_out.version == 0 and torch.equal(left_out.global_flat, torch.zeros(2))
    host.push("b", stats("b", tokens=300), torch.tensor([1.0, 1.0]), 0, "tokens")
    # a's latest phase trained 100 tokens, b's 300: b's share of an average is 3/4
    assert torch.allclose(host.global_flat()[1], torch.tensor([-0.75, -0.75]))


def test_host_commits_only_a_round_every_node_saved():
    host = host_of(["a", "b"])
    host.push("a", stats("a", saved_round=4), torch.zeros(2), 0, "uniform")
    assert host.committable_round() is None
    host.push("b", stats("b", saved_round=2), torch.zeros(2), 0, "uniform")
    assert host.committable_round() == 2


def test_round_clock_counts_queueing_at_the_host_as_waiting():
    clock = RoundClock(marks={"start": 0.0, "local_done": 10.0, "ready": 10.0, "synced": 13.0, "end": 13.5})
    clock.record_sync([(10.0, 13.0)], 0.0, waited_s=1.0)
    assert (clock.compute_s, clock.wait_s, clock.comm_s, clock.overhead_s) == (10.0, 1.0, 2.0, 0.5)


# ----- config ----------------------------------------------------------------------------------

NODES = [{"name": "a", "gpus": ["A100-SXM4-80GB"]}]


def test_async_defaults_to_no_overlap_int8_and_the_adaptive_policy():
    config = parse_config(small_config(NODES, diloco={"mode": "async"}), "test")
    assert (config.diloco.overlap, config.diloco.compression, config.balancing.policy) == ("none", "int8", "adaptive")


@pytest.mark.parametrize("sections, field", [
    ({"diloco": {"mode": "async", "overlap": "streaming"}}, "diloco.overlap"),
    ({"diloco": {"mode": "async"}, "comm": {"backend": "hivemind"}}, "diloco.mode: async needs comm.backend: torch"),
    ({"run": {"max_wall_s": 0}}, "max_wall_s"),
])
def test_async_settings_it_cannot_do_name_the_field(sections, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_config(small_config(NODES, **sections), "test")


# ----- real runs -------------------------------------------------------------------------------

THREE_SPEEDS = [{"name": name, "gpus": ["A100-SXM4-80GB"], "emulate": {"step_time_s": step_s}}
                for name, step_s in (("fast", 0.1), ("mid", 0.2), ("slow", 0.4))]


def async_config(rounds: int) -> dict:
    return small_config(THREE_SPEEDS, diloco={"rounds": rounds, "local_steps": 3, "batch_size": 4, "mode": "async",
                                              "compression": "int8"},
                        checkpoint={"every_rounds": 1, "keep": 10})


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("async")
    run_dir = tmp_path / "run"
    done = geodiloco("run", "--no-report", "--config", str(write_config(tmp_path, async_config(5))),
                     "--run-dir", str(run_dir), timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return tmp_path, run_dir, done


def test_async_run_logs_every_phase_with_its_staleness(async_run):
    _, run_dir, _ = async_run
    idle = read_jsonl(run_dir / "idle.jsonl")
    assert sorted((row["node"], row["round"]) for row in idle) == sorted(
        (node["name"], round_idx) for node in THREE_SPEEDS for round_idx in range(5))
    assert all(row["mode"] == "async" and isinstance(row["staleness"], int) for row in idle)
    assert max(row["staleness"] for row in idle) >= 1  # nodes did not move in lockstep
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert sum(row["tokens"] for row in metrics if row["node"] == "global") == sum(row["tokens"] for row in idle)
    assert any(row.get("final") and row["eval_loss"] is not None for row in metrics)


def test_async_int8_run_ends_with_every_rank_on_the_final_global_model(async_run):
    # pulls are int8 differences from each node's shadow; the final model must come whole
    _, _, done = async_run
    output = done.stdout + done.stderr
    assert "final parameter checksum" in output and "on every rank" in output, output[-2000:]
    assert "ended on different parameters" not in output


def test_async_run_gives_the_fast_node_more_steps_per_phase(async_run):
    _, run_dir, _ = async_run
    last = {row["node"]: row for row in read_jsonl(run_dir / "idle.jsonl") if row["round"] == 4}
    assert last["fast"]["local_steps"] >= 2 * last["slow"]["local_steps"]


def test_async_checkpoint_holds_the_final_model_every_node_ended_on(async_run):
    _, run_dir, done = async_run
    latest = int((run_dir / "checkpoints" / "latest").read_text())
    held = run_dir / "checkpoints" / f"round_{latest:05d}"
    assert latest == 4
    assert sorted(path.name for path in held.glob("node_*")) == ["node_fast.safetensors", "node_mid.safetensors",
                                                                  "node_slow.safetensors"]
    state = load_state(held / "global.safetensors")
    # 3 nodes x 5 phases, one update each: the slower nodes' last updates land after the host's last round
    assert state["sync"]["version"] == 15
    assert state["final"] is True  # marked, so `geodiloco evaluate` names it the final model, not round 5's
    earlier = run_dir / "checkpoints" / f"round_{latest - 1:05d}" / "global.safetensors"
    assert "final" not in load_state(earlier)
    scored = geodiloco("evaluate", str(run_dir), timeout=240)
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert "round 5 (logs: 4, the run's final model): eval loss" in scored.stdout
    assert "round 4 (logs: 3): eval loss" in scored.stdout
    final_checksum = float(re.search(r"final parameter checksum ([0-9.]+)", done.stdout).group(1))
    saved_checksum = float(sum(param.double().abs().sum() for param in state["outer"]["global_params"]))
    assert saved_checksum == pytest.approx(final_checksum, rel=1e-12)


def test_async_resume_starts_every_node_from_the_saved_global_model(async_run):
    tmp_path, run_dir, _ = async_run
    saved = load_state(run_dir / "checkpoints" / "round_00004" / "global.safetensors")
    saved_checksum = float(sum(param.double().abs().sum() for param in saved["outer"]["global_params"]))
    more = async_config(6)
    more["run"]["max_wall_s"] = 600.0  # a wall-clock budget may be set or changed on resume
    done = geodiloco("run", "--no-report", "--resume", "--config", str(write_config(tmp_path, more, "more.yaml")),
                     "--run-dir", str(run_dir), timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [row for row in read_jsonl(run_dir / "metrics.jsonl") if row["node"] != "global" and row["round"] == 5]
    assert sorted(row["node"] for row in rows) == ["fast", "mid", "slow"]
    for row in rows:
        assert row["start_checksum"] == pytest.approx(saved_checksum, rel=1e-6)


def test_max_wall_s_stops_a_sync_run_at_an_outer_boundary(tmp_path):
    nodes = [{"name": name, "gpus": ["A100-SXM4-80GB"], "emulate": {"step_time_s": 0.05}} for name in ("a", "b")]
    config = small_config(nodes, run={"name": "wall", "out_dir": "runs", "seed": 0, "max_wall_s": 1.0},
                          diloco={"rounds": 500, "local_steps": 3, "batch_size": 4, "overlap": "none",
                                  "compression": "none"})
    run_dir = tmp_path / "run"
    done = geodiloco("run", "--no-report", "--config", str(write_config(tmp_path, config)), "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-2000:]
    idle = read_jsonl(run_dir / "idle.jsonl")
    rounds = {row["round"] for row in idle}
    last = max(rounds)
    assert 2 <= len(rounds) < 30 and rounds == set(range(last + 1))
    assert sorted(row["node"] for row in idle if row["round"] == last) == ["a", "b"]
    span_s = max(row["round_end"] for row in idle) - min(row["round_start"] for row in idle)
    assert span_s >= 1.0
    assert int((run_dir / "checkpoints" / "latest").read_text()) == last
    # every site says why it stopped early, not only the one that writes the logs (each site has its own console)
    said = f"run.max_wall_s (1 s of training) is spent: the run ends after round {last + 1} of 500 (diloco.rounds)"
    assert (done.stdout + done.stderr).count(said) == 2, (done.stdout + done.stderr)[-3000:]


# ----- compressed pushes and pulls ---------------------------------------------------------------

def test_push_error_feedback_loses_only_the_residual_it_carries():
    from geodiloco.runtime.sync.async_wire import PushFeedback, unpack
    feedback = PushFeedback("int8")
    generator = torch.Generator().manual_seed(1)
    sent, arrived = torch.zeros(5000), torch.zeros(5000)
    for _ in range(6):
        update = torch.randn(5000, generator=generator)
        sent += update
        arrived += unpack("int8", feedback.encode(update), 5000)
    assert torch.allclose(arrived + feedback.residual, sent, atol=1e-5)
    assert feedback.residual.abs().max() < 0.05 * sent.abs().max()


def test_pulled_model_equals_the_hosts_shadow_and_does_not_drift():
    from geodiloco.runtime.sync.async_wire import PullShadows, apply_pull
    generator = torch.Generator().manual_seed(2)
    global_flat = torch.randn(3000, generator=generator)
    shadows = PullShadows("int8", ["b"], global_flat)
    node_copy = global_flat.clone()
    for _ in range(50):
        global_flat = global_flat + 0.1 * torch.randn(3000, generator=generator)
        node_copy = apply_pull("int8", shadows.encode("b", global_flat), node_copy)
        assert torch.equal(node_copy, shadows.shadows["b"])
    # after 50 pulls the error is one rounding of the last difference, not 50 of them
    one_step = 0.1 * 4 / 127
    assert (node_copy - global_flat).abs().max() < one_step


def test_uncompressed_pull_sends_the_whole_model():
    from geodiloco.runtime.sync.async_wire import PullShadows, apply_pull
    model = torch.arange(10.0)
    shadows = PullShadows("none", ["b"], torch.zeros(10))
    assert torch.equal(apply_pull("none", shadows.encode("b", model), torch.zeros(10)), model)


def test_report_of_an_async_run_shows_staleness_and_no_barrier_prediction(async_run):
    _, run_dir, _ = async_run
    shown = geodiloco("report", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    assert "Staleness per node (async)" in shown.stdout
    assert "predicted" not in shown.stdout
    # the resume test may have added a phase to this run: count each node's phases in its log
    idle = read_jsonl(run_dir / "idle.jsonl")
    for node in ("fast", "mid", "slow"):
        staleness = sorted(row["staleness"] for row in idle if row["node"] == node)
        assert len(staleness) >= 5
        stale_table = shown.stdout.split("Staleness per node (async)")[1]
        row = next(line.split() for line in stale_table.splitlines() if line.split()[:1] == [node])
        assert row[1] == str(len(staleness)) and row[4] == str(staleness[-1])


def test_a_final_model_clearly_worse_than_an_earlier_round_is_said_with_the_round_to_export():
    from geodiloco.runtime.evaluation import final_model_regression

    def row(round_idx, loss, se=0.08, **extra):
        return {"node": "global", "round": round_idx, "eval_loss": loss, "eval_loss_se": se, **extra}

    node_row = {"node": "node1", "round": 2, "loss": 2.4}
    rows = [row(0, 3.626), row(1, 3.224), node_row, row(2, 3.099), row(2, 4.870, final=True)]
    assert final_model_regression(rows) == (
        "the final global model scores eval loss 4.870, above the 3.099 of round 3: the run's last updates made the "
        "model worse; `geodiloco evaluate RUN_DIR` scores the rounds still kept (checkpoint.keep) and "
        "`geodiloco export RUN_DIR --round N` writes the one you choose")
    # within 3 standard errors (0.24) of the best: noise of a small eval set, nothing said
    assert final_model_regression([row(1, 2.727), row(2, 2.95, final=True)]) is None
    assert final_model_regression([row(0, 3.3), row(1, 2.7)]) is None  # it got better
    assert final_model_regression([row(0, 3.3)]) is None


def test_auto_weighting_under_async_is_tokens_whatever_the_policy_and_a_set_one_is_kept():
    """The host applies each stale update alone: normalized weights a straggler's few-step update many times
    its tokens (experiments/results/async/weighting.md), so async plans tokens under ``auto``."""
    from pathlib import Path

    from geodiloco.runtime.config import load_config
    from geodiloco.runtime.trainer import planned_sync
    from geodiloco.balancer.planner import Planner
    config_path = str(Path(__file__).resolve().parents[1] / "experiments" / "configs" / "async.yaml")

    def planned_weighting(*sets):
        config = load_config(config_path, list(sets))
        planner = Planner(config.balancing.for_mode(config.diloco.mode), config.nodes, config.model.dims(),
                          config.model.seq_len, config.diloco.local_steps, config.diloco.batch_size,
                          config.model.precision, sync_settings=planned_sync(config))
        return planner.plan(0).weighting

    assert planned_weighting() == "tokens"  # adaptive's own choice would be normalized
    assert planned_weighting("diloco.mode=sync") == "normalized"
    assert planned_weighting("balancing.weighting=normalized") == "normalized"


def test_the_progress_line_says_the_time_elapsed_and_left_within_the_wall_budget():
    from types import SimpleNamespace

    from geodiloco.runtime.progress import duration_text, progress_text

    def trainer(rounds, max_wall_s=None, origin=(1000.0, 2)):
        config = SimpleNamespace(diloco=SimpleNamespace(rounds=rounds), run=SimpleNamespace(max_wall_s=max_wall_s))
        return SimpleNamespace(config=config, progress_origin=origin)

    # resumed after round 2: rounds 3-6 (indices 2-5) took 120 s, 30 s each; 14 rounds left of 20
    assert progress_text(trainer(20), 5, 1120.0) == " | 2m00s elapsed, ~7m00s left"
    assert progress_text(trainer(20, max_wall_s=300), 5, 1120.0) == " | 2m00s elapsed, ~3m00s left"
    assert progress_text(trainer(6), 5, 1120.0) == " | 2m00s elapsed"
    assert progress_text(trainer(20, origin=None), 5, 1120.0) == ""
    assert [duration_text(value) for value in (42.4, 185, 7620)] == ["42s", "3m05s", "2h07m"]


def test_async_resume_applies_each_phase_once_when_nodes_stopped_at_different_phases(tmp_path):
    # equal local steps (uniform policy) at speeds 1 : 2 : 4, stopped by a wall budget: each node ends at its own
    # phase, the fast one (the host) done with all of them. A resume must go on after each node's own last phase the
    # global model holds: every phase's update applied once (version = nodes x rounds) and logged once, and the
    # final model committed even though the host trains no phase of it.
    config = async_config(8)
    config["balancing"] = {"policy": "uniform"}
    config["checkpoint"]["keep"] = 2
    config["run"]["max_wall_s"] = 4.0
    run_dir = tmp_path / "run"
    first = geodiloco("run", "--no-report", "--config", str(write_config(tmp_path, config)), "--run-dir",
                      str(run_dir), timeout=240)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    phases = {}
    for row in read_jsonl(run_dir / "idle.jsonl"):
        phases[row["node"]] = max(phases.get(row["node"], -1), row["round"])
    assert phases["fast"] == 7 and phases["slow"] <= 5, phases  # the stop left the nodes at different phases
    del config["run"]["max_wall_s"]
    more_config = str(write_config(tmp_path, config, "more.yaml"))
    more = geodiloco("run", "--no-report", "--resume", "--config", more_config, "--run-dir", str(run_dir), timeout=240)
    assert more.returncode == 0, more.stdout[-2000:] + more.stderr[-2000:]
    held = ", ".join(f"{name} {phases[name] + 1}" for name in ("fast", "mid", "slow"))
    assert f"which holds each node's phases up to: {held}; each node goes on after its own" in more.stdout, \
        more.stdout[-3000:]
    assert int((run_dir / "checkpoints" / "latest").read_text()) == 7
    state = load_state(run_dir / "checkpoints" / "round_00007" / "global.safetensors")
    assert state["final"] is True
    assert state["sync"]["version"] == 3 * 8
    assert state["sync"]["pushed_rounds"] == {"fast": 7, "mid": 7, "slow": 7}
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("round_*")) == ["round_00006", "round_00007"]
    idle = read_jsonl(run_dir / "idle.jsonl")
    assert sorted((row["node"], row["round"]) for row in idle) == sorted(
        (name, round_idx) for name in ("fast", "mid", "slow") for round_idx in range(8))
    again = geodiloco("run", "--no-report", "--resume", "--config", more_config, "--run-dir", str(run_dir), timeout=240)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "which holds each node's phases up to: fast 8, mid 8, slow 8" in again.stdout
    assert load_state(run_dir / "checkpoints" / "round_00007" / "global.safetensors")["sync"]["version"] == 24
    assert len(read_jsonl(run_dir / "idle.jsonl")) == 24


# ----- where each node resumes ------------------------------------------------------------------

def test_host_records_each_nodes_newest_phase_even_when_left_out_and_keeps_it_in_its_state():
    host = host_of(["a", "b"])
    host.push("a", {**stats("a"), "round": 3}, torch.zeros(2), 0, "uniform")
    host.push("b", {**stats("b", finite=False), "round": 1}, torch.full((2,), float("nan")), 0, "uniform")
    host.push("a", {**stats("a"), "round": 4}, torch.zeros(2), 1, "uniform")
    saved = host.state_dict()
    assert saved["pushed_rounds"] == {"a": 4, "b": 1} and saved["version"] == 2
    again = host_of(["a", "b"])
    again.load_state_dict(saved)
    assert again.state_dict()["pushed_rounds"] == {"a": 4, "b": 1}


def test_resume_takes_the_global_file_with_most_updates_not_the_newest_round(tmp_path):
    from geodiloco.runtime import checkpoint
    from geodiloco.runtime.state_file import save_state
    from geodiloco.runtime.sync.async_resume import choose_global, newest_global_offer
    # the final model (version 15) written over round 3, the host's own later rounds holding older models
    for round_idx, version in ((3, 15), (4, 11), (5, 13)):
        folder = checkpoint.round_dir(tmp_path, round_idx)
        folder.mkdir(parents=True)
        save_state({"outer": {"global_params": [torch.ones(3)]},
                    "sync": {"version": version, "pushed_rounds": {"a": round_idx, "b": 2}}},
                   folder / checkpoint.GLOBAL_FILE)
    offer = newest_global_offer(tmp_path, "a", {3: ["a", "b"], 4: ["a", "b"], 5: ["a", "b"]})
    assert (offer.round, offer.version, offer.pushed_rounds) == (3, 15, {"a": 3, "b": 2})
    other = offer.__class__("b", 7, 15, ["a", "b"], {"a": 1, "b": 1})
    assert choose_global([other, offer], ["a", "b"]).node == "a"  # equal versions: the first present node's
    newer = offer.__class__("b", 2, 16, ["a", "b"], {})
    assert choose_global([offer, newer], ["a", "b"]) is newer


def test_a_node_resumes_after_its_newest_file_the_global_model_holds():
    from geodiloco.runtime.sync.async_resume import resume_round
    assert resume_round([2, 4, 6, 8], 6) == 6
    assert resume_round([2, 4, 6, 8], 7) == 6  # phase 7's file was never written: 7 is trained again
    assert resume_round([2, 4, 6, 8], 1) is None
    assert resume_round([2, 4], None) is None  # never pushed into this global model: joins as a new node


def test_dropping_a_nodes_redone_files_leaves_the_other_nodes_files(tmp_path):
    from geodiloco.runtime import checkpoint
    for round_idx in (4, 5, 6):
        folder = checkpoint.round_dir(tmp_path, round_idx)
        folder.mkdir(parents=True)
        for name in ("node_fast.safetensors", "node_slow.safetensors", "global.safetensors", "members.json"):
            (folder / name).write_text("x")
    checkpoint.drop_node_files_after(tmp_path, "fast", 4)
    left = sorted(str(path.relative_to(tmp_path / "checkpoints")) for path in (tmp_path / "checkpoints").rglob("*.*"))
    assert left == ["round_00004/global.safetensors", "round_00004/members.json", "round_00004/node_fast.safetensors",
                    "round_00004/node_slow.safetensors", "round_00005/global.safetensors",
                    "round_00005/members.json", "round_00005/node_slow.safetensors",
                    "round_00006/global.safetensors", "round_00006/members.json",
                    "round_00006/node_slow.safetensors"]


def test_a_state_files_structure_is_read_from_its_header_without_its_tensors(tmp_path):
    from geodiloco.runtime.state_file import CorruptStateFile, load_structure, save_state
    path = tmp_path / "state.safetensors"
    save_state({"sync": {"version": 7}, "weights": [torch.ones(4)]}, path)
    assert load_structure(path) == {"sync": {"version": 7}, "weights": [None]}
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00hello")
    with pytest.raises(CorruptStateFile, match="not a readable safetensors file"):
        load_structure(tmp_path / "junk.safetensors")


def test_an_async_run_whose_launcher_was_killed_resumes_with_every_phase_applied_and_logged_once(tmp_path):
    # SIGKILL lands anywhere: between a push and the host's next global save, between a save and the host logging
    # what it took in. A resume must leave each phase applied once (version = nodes x rounds) and each phase's rows
    # logged once, wherever it landed.
    import os
    import signal
    import subprocess
    import sys
    import time
    from runtime_helpers import REPO_ROOT
    config = async_config(10)
    config["balancing"] = {"policy": "uniform"}
    config["checkpoint"]["keep"] = 2
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "geodiloco.runtime.cli", "run", "--no-report", "--config",
               str(write_config(tmp_path, config)), "--run-dir", str(run_dir)]
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO_ROOT,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 180
    while time.time() < deadline:
        rows = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").is_file() else []
        if sum(row["node"] == "slow" for row in rows) >= 3:
            break
        time.sleep(0.2)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=30)
    time.sleep(3)  # the sites notice their launcher is gone (runtime/launcher_watch.py) and stop
    more = geodiloco("run", "--no-report", "--resume", "--config", str(write_config(tmp_path, config, "more.yaml")),
                     "--run-dir", str(run_dir), timeout=240)
    assert more.returncode == 0, more.stdout[-2000:] + more.stderr[-2000:]
    assert int((run_dir / "checkpoints" / "latest").read_text()) == 9
    state = load_state(run_dir / "checkpoints" / "round_00009" / "global.safetensors")
    assert state["sync"]["version"] == 3 * 10 and state["final"] is True
    expected = sorted((name, round_idx) for name in ("fast", "mid", "slow") for round_idx in range(10))
    assert sorted((row["node"], row["round"]) for row in read_jsonl(run_dir / "idle.jsonl")) == expected
    assert sorted((row["node"], row["round"]) for row in read_jsonl(run_dir / "metrics.jsonl")
                  if row["node"] != "global") == expected


def test_phases_the_saved_model_holds_but_the_log_lacks_are_logged_once_on_resume():
    from geodiloco.runtime.sync.async_backend import unlogged_reports
    saved = [
        {"node": "b", "round": 4, "previous_record": {"node": "b", "round": 3}},  # logged neither way: both rows
        {"node": "b", "round": 5, "previous_record": {"node": "b", "round": 4}},  # past b's resume phase: redone
        {"node": "c", "round": 2, "previous_record": {"node": "c", "round": 1}},  # its idle row is logged already
        {"node": "c", "round": 1, "previous_record": None},                        # its metrics row is logged
    ]
    reports = unlogged_reports(saved, after={"b": 4, "c": 2}, idle_logged={(1, "c")}, metrics_logged={(1, "c")})
    assert [(item["node"], item["round"], item["previous_record"]) for item in reports] == [
        ("b", 4, {"node": "b", "round": 3}), ("c", 2, None)]
