"""Subcommands of the `geodiloco` command that belong to balancer/: ``plan`` and ``simulate``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from geodiloco.balancer.config import POLICY_NAMES

COMMON_HELP = {
    "cluster": "cluster file (a nodes: list) or a whole run config",
    "model": ("model preset or a JSON/YAML file of dims (default: the file's model: its preset, dims file or "
              "model.hf config.json; else llama-150m)"),
    "set": "balancing option KEY=VALUE (repeatable), e.g. --set hysteresis=0.05 --set reference_node=fastest",
}


def _add_common(parser) -> None:
    parser.add_argument("--cluster", required=True, help=COMMON_HELP["cluster"])
    parser.add_argument("--policy", choices=POLICY_NAMES, help="balancing policy (default: the file's balancing.policy, else uniform)")
    parser.add_argument("--model", help=COMMON_HELP["model"])
    parser.add_argument("--seq-len", type=int, help="tokens per sample (default: the file's model.seq_len, else 1024, or the model's longest "
                        "if that is shorter)")
    parser.add_argument("--local-steps", type=int, help="baseline local steps H (default: diloco.local_steps, else 100)")
    parser.add_argument("--batch-size", type=int, help="baseline batch size B (default: diloco.batch_size, else 4)")
    parser.add_argument("--precision", choices=["bf16", "fp16", "fp32"],
                        help="training precision (default: the file's model.precision, else bf16)")
    parser.add_argument("--overlap", choices=["none", "delayed", "streaming"],
                        help="outer sync overlap to plan for (default: the file's diloco.overlap, else none)")
    parser.add_argument("--compression", choices=["none", "fp16", "bf16", "int8", "int4"],
                        help="pseudo-gradient codec to plan for (default: the file's diloco.compression, else none)")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                        help=COMMON_HELP["set"])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(subparsers, check_file=None) -> None:
    """Add ``plan`` and ``simulate`` to the `geodiloco` parser. ``check_file(path)``: checks the run sections of a
    cluster file as a run would (the runtime's schema, which this layer does not import), or None."""
    plan = subparsers.add_parser("plan", help="per-node local steps and batch sizes for a balancing policy",
                                 description="Plan one round: per-node local steps H, batch size B, predicted "
                                             "local-phase time and predicted idle (seconds).")
    _add_common(plan)
    plan.add_argument("--round", type=int, default=0, help="round index to plan (default 0)")
    plan.set_defaults(func=run_plan, check_file=check_file)

    simulate = subparsers.add_parser("simulate", help="simulate rounds of a cluster under a policy (no processes)",
                                     description="Discrete-event simulation of outer rounds. Each node's true step "
                                                 "time comes from the cluster file (measured: points or a point, else "
                                                 "emulate:), not from the planner's prior; on top: per-step noise, "
                                                 "stragglers, slow drift, slowdowns and the outer sync.")
    _add_common(simulate)
    simulate.add_argument("--rounds", type=int, help="outer rounds to simulate (default: the file's diloco.rounds, "
                                                     f"else {DEFAULT_SIMULATED_ROUNDS})")
    simulate.add_argument("--slowdown", action="append", default=[], metavar="NODE:ROUND:FACTOR",
                          help="node runs FACTOR x slower from ROUND on (repeatable; NODE:ROUND:FACTOR:UNTIL ends it)")
    simulate.add_argument("--model-error", type=float, help="relative error of the predictor's estimate for nodes "
                                                            "that declare no step time (no measured:, no emulate:) "
                                                            "(default 0.1)")
    simulate.add_argument("--step-noise", type=float, help="relative std of each step's time (default 0.02)")
    simulate.add_argument("--straggler-prob", type=float,
                          help="chance that a step is a straggler, 2-5x slower (default 0.01; 0 = none)")
    simulate.add_argument("--drift-per-round", type=float,
                          help="std of the log of a node's speed change per round, a slow random walk "
                               "(default 0.02; 0 = none)")
    simulate.add_argument("--seed", type=int, help="random seed (default 0)")
    simulate.add_argument("--out", metavar="DIR", help="write idle.jsonl, plan.jsonl and config.yaml here")
    simulate.add_argument("--run-id", help="run_id of the written records (default: sim-POLICY)")
    simulate.set_defaults(func=run_simulate, check_file=check_file)


def _setup(args, simulation=None):
    from geodiloco.balancer.setup import load_setup
    if getattr(args, "check_file", None) is not None:
        args.check_file(args.cluster)
    return load_setup(args.cluster, policy=args.policy, model=args.model, seq_len=args.seq_len,
                      local_steps=args.local_steps, batch_size=args.batch_size, precision=args.precision,
                      assignments=args.assignments, simulation=simulation, overlap=args.overlap,
                      compression=args.compression)


def run_plan(args) -> int:
    from geodiloco.balancer.views import plan_summary, print_plan
    from dataclasses import asdict
    from geodiloco.balancer.mode_advice import advise_mode
    if args.round < 0:
        from geodiloco.common.schema import ConfigError
        raise ConfigError(f"--round must be 0 or more (rounds count from 0, as the logs number them), got {args.round}")
    setup = _setup(args)
    planner = setup.planner()
    plan = planner.plan(args.round)
    # async DiLoCo runs on the torch backend only: a hivemind run gets no mode advice
    advice = None if setup.sync.backend == "hivemind" else advise_mode(
        plan, setup.cluster.nodes, planner.sync.num_params, planner.sync.measured_factor, codec=setup.sync.codec)
    if args.json:
        print(json.dumps({**plan_summary(plan), "mode_advice": asdict(advice) if advice else None}, indent=2))
    else:
        print_plan(plan, setup, advice=advice)
    return 0


MAX_SIMULATED_ROUNDS = 100_000
RUN_FILES = ("config.yaml", "idle.jsonl", "plan.jsonl", "metrics.jsonl", "checkpoints")


def check_simulation_out(out_dir: Path) -> None:
    """``--out`` must not hold a run's logs: a simulation never overwrites a real (or earlier) run."""
    from geodiloco.common.schema import ConfigError
    present = [name for name in RUN_FILES if (out_dir / name).exists()]
    if present:
        raise ConfigError(f"--out {out_dir} already holds {', '.join(present)} (a run's logs); choose a new "
                          "directory")


DEFAULT_SIMULATED_ROUNDS = 10


def simulated_config(config: dict, rounds: int, slowdown_texts: list[str]) -> dict:
    """``config`` (the setup as a run config) with what only the command line said: the rounds and the
    slowdowns, so that simulating the written file again reproduces the run."""
    config["diloco"]["rounds"] = rounds
    config["balancing"].setdefault("simulation", {})["slowdowns"] = list(slowdown_texts)
    return config


def run_simulate(args) -> int:
    from geodiloco.balancer.setup import first_given, parse_slowdown
    from geodiloco.balancer.simulate import simulate
    from geodiloco.balancer.views import print_simulation
    from geodiloco.common.schema import ConfigError
    if args.out:
        check_simulation_out(Path(args.out))
    simulation = {key: value for key, value in (("model_error", args.model_error), ("step_noise", args.step_noise),
                                                ("straggler_prob", args.straggler_prob),
                                                ("drift_per_round", args.drift_per_round),
                                                ("seed", args.seed)) if value is not None}
    setup = _setup(args, simulation)
    source = "--rounds" if args.rounds is not None else f"{args.cluster}: diloco.rounds"
    args.rounds = first_given(args.rounds, setup.rounds, DEFAULT_SIMULATED_ROUNDS)
    if not 1 <= args.rounds <= MAX_SIMULATED_ROUNDS:
        raise ConfigError(f"{source} must be between 1 and {MAX_SIMULATED_ROUNDS:,} to simulate, got {args.rounds}")
    if setup.mode == "async":
        print("note: the file runs diloco.mode: async; simulate models synchronous rounds (each round ends at the "
              "outer sync), so its waiting is a barrier's; geodiloco plan says whether async would idle less",
              file=sys.stderr)
    slowdown_texts = [*setup.balancing.simulation.slowdowns, *args.slowdown]
    slowdowns = [parse_slowdown(text) for text in slowdown_texts]
    late = [text for text, event in zip(slowdown_texts, slowdowns) if event.from_round >= args.rounds]
    if late:
        raise ConfigError(f"--slowdown {late[0]}: it starts after the last simulated round (--rounds {args.rounds} "
                          f"runs rounds 0-{args.rounds - 1}); start it earlier or simulate more rounds")
    result = simulate(setup.planner(), args.rounds, slowdowns=slowdowns, keep_plans=args.out is not None)
    if args.out:
        run_id = args.run_id or f"sim-{setup.balancing.policy}"
        result.write(args.out, run_id, simulated_config(setup.to_config(run_id), args.rounds, slowdown_texts))
    if args.json:
        print(json.dumps(result.summary(), indent=2))
    else:
        print_simulation(result)
        if args.out:
            print(f"wrote {args.out}/idle.jsonl, plan.jsonl, config.yaml", file=sys.stderr)
    return 0
