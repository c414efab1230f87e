"""Which prior the planner uses for a node: emulated GPU workload, listed GPUs, declared time, or this CPU."""
import pytest

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.planner import Planner
from geodiloco.predictor.model import node_step_model
from geodiloco.predictor.workload import preset_dims

TINY = preset_dims("tiny")


def first_plan(nodes, policy="time"):
    planner = Planner(BalancingConfig(policy=policy), [NodeSpec(**node) for node in nodes], TINY, 64,
                      local_steps=10, batch_size=4)
    return planner, planner.plan(0)


def test_nodes_without_gpus_plan_as_this_cpu():
    planner, plan = first_plan([{"name": "a"}, {"name": "b"}], policy="uniform")
    cpu_step_s = node_step_model([], TINY, 64).predict(4)
    assert [node.local_steps for node in plan.nodes] == [10, 10]
    assert plan.nodes[0].predicted_step_s == pytest.approx(cpu_step_s, rel=1e-6)


def test_emulated_gpu_nodes_plan_with_the_emulated_workload_and_time_scale():
    emulate = {"gpu": "from_gpus", "model": "llama-150m", "seq_len": 1024, "time_scale": 0.5}
    planner, plan = first_plan([{"name": "slow", "gpus": ["4 x RTX 2080 Ti"], "emulate": emulate},
                                {"name": "fast", "gpus": ["4 x A30"], "emulate": emulate}])
    llama = preset_dims("llama-150m")
    slow_s = 0.5 * node_step_model(["RTX 2080 Ti"] * 4, llama, 1024).predict(4)
    fast_s = 0.5 * node_step_model(["A30"] * 4, llama, 1024).predict(4)
    assert plan.node("slow").predicted_step_s == pytest.approx(slow_s, rel=1e-6)
    assert plan.node("fast").predicted_step_s == pytest.approx(fast_s, rel=1e-6)
    # time policy: equal local-phase time, so the faster node runs more steps
    assert plan.node("fast").local_steps > plan.node("slow").local_steps
    assert plan.node("fast").predicted_compute_s <= plan.node("slow").predicted_compute_s + fast_s
