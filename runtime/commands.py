"""``geodiloco run``, ``evaluate``, ``export`` and ``train``."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

RUN_HELP = """\
Launch every node of a run config on this machine and print the idle report.

With no --config, runs the embedded demo: four emulated sites with different
virtual GPUs training a tiny LLaMA-style model on Python's own sources.
--sites netns puts each node in its own network namespace, with links shaped
to each node's wan.bandwidth_mbps (needs root); auto picks netns when possible.

On the torch backend each node runs under torchrun's elastic agent (comm.elastic):
a node that fails is left out and the others go on from the last complete round;
--drill kills, freezes or restarts nodes on purpose to see it happen.
"""


def register(subparsers) -> None:
    run = subparsers.add_parser("run", help="launch all nodes of a config on this machine",
                                description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--config", help="run config YAML (default: the embedded demo config)")
    run.add_argument("--sites", choices=["auto", "local", "netns"], default="auto",
                     help="where nodes run: loopback, or one network namespace per site (default: auto)")
    run.add_argument("--run-dir", help="run directory (default: run.out_dir/run.name-TIMESTAMP)")
    run.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its latest checkpoint")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config value, e.g. --set diloco.rounds=3 (repeatable)")
    run.add_argument("--no-report", action="store_true", help="do not print the idle report at the end")
    membership = run.add_mutually_exclusive_group()
    membership.add_argument("--elastic", dest="elastic", action="store_true", default=None,
                            help="start each node under torchrun's elastic agent (default: comm.elastic.enabled)")
    membership.add_argument("--no-elastic", dest="elastic", action="store_false",
                            help="fixed membership: one failed node stops the run")
    run.add_argument("--drill", metavar="ACTION:NODE@ROUND,...",
                     help="inject site failures, e.g. 'kill:c@3,restart:c@5' (actions: kill, freeze, thaw, "
                          "restart; halfway through the round, from round 2 on; elastic runs only)")
    run.set_defaults(func=run_command)

    evaluate = subparsers.add_parser(
        "evaluate", help="score every kept round's global model on the run's held-out set",
        description="Eval loss (nats per token) and its standard error of each round's global model whose "
                    "checkpoint the run kept (checkpoint.every_rounds: 1, checkpoint.keep >= rounds), on the "
                    "run's held-out windows; writes RUN_DIR/eval.jsonl. Runs after the run, so a large eval set "
                    "costs the training nothing (set data.eval_every_rounds: 0 to skip evaluation in the run).")
    evaluate.add_argument("run_dir", help="a run directory of geodiloco run")
    evaluate.add_argument("--json", action="store_true", help="print the rows as JSON (their round counts from 0, as "
                          "eval.jsonl and every log file do; the console's \"round 5\" is round 4 there)")
    evaluate.set_defaults(func=evaluate_command)

    export = subparsers.add_parser(
        "export", help="write a round's global model (a transformers directory for a model.hf run, safetensors "
                       "for the built-in model)",
        description="Write the global model of a kept round: a transformers model (model.hf) as a "
                    "save_pretrained directory with the run's tokenizer (from_pretrained loads it); the built-in "
                    "decoder as model.safetensors + dims.json.")
    export.add_argument("run_dir", help="a run directory of geodiloco run")
    export.add_argument("--out", required=True, help="a new (or empty) directory to write")
    export.add_argument("--round", type=int, help="round to export, 1-based as the console prints it (\"round 5/6\"; "
                        "the JSONL logs and checkpoint folders count from 0: round_00004); default: the latest kept")
    export.set_defaults(func=export_command)

    from geodiloco.runtime.rendezvous import register as register_rendezvous
    register_rendezvous(subparsers)

    train = subparsers.add_parser("train", help="train one node (the torchrun entry at each site)", add_help=False,
                                  description="Same as `python -m geodiloco.runtime.train` (its --help lists the options).")
    train.add_argument("train_args", nargs=argparse.REMAINDER)
    train.set_defaults(func=train_command)


def run_command(args: argparse.Namespace) -> int:
    from geodiloco.runtime.config import load_config
    from geodiloco.runtime.launch import launch_local
    from geodiloco.runtime.run_dir import new_run_dir, saved_config

    if args.resume and not args.run_dir:
        print("geodiloco run: error: --resume needs --run-dir (the run directory to continue)", file=sys.stderr)
        return 2
    # a resumed run starts from its own saved config (--set changes on top of it), not the demo's
    base = args.config or (saved_config(Path(args.run_dir)) if args.resume else None)
    config = load_config(base, args.overrides)
    if args.elastic is not None and config.comm.backend == "torch":
        config.comm.elastic.enabled = args.elastic  # saved in config.yaml: a --resume keeps the membership
    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir(config)  # runtime/run_dir.py
    try:
        code = launch_local(config, run_dir, args.sites, args.resume, args.elastic, args.drill)
    except BaseException:
        if not args.run_dir:
            remove_if_empty(run_dir)  # a run refused before it wrote anything leaves no directory behind
        raise
    if code != 0 and not args.run_dir:
        remove_if_empty(run_dir)
    if code == 0 and not args.no_report:
        code = print_report(run_dir)
    return code


def remove_if_empty(run_dir: Path) -> None:
    try:
        run_dir.rmdir()
    except OSError:  # it holds something (logs, a checkpoint): kept
        pass


def print_report(run_dir: Path) -> int:
    try:
        from geodiloco.report.cli import main as report_main
    except ImportError:
        print(f"[geodiloco] logs in {run_dir} (idle.jsonl, metrics.jsonl, plan.jsonl)")
        return 0
    return report_main([str(run_dir)])


def check_run_extras(run_dir: Path) -> None:
    """The optional extras a run's model and data need (a transformers run needs ``hf``), before they are
    imported: one line naming the pip command instead of a ModuleNotFoundError."""
    from geodiloco.runtime.preflight import check_extras
    from geodiloco.runtime.run_files import load_run_config
    if (run_dir / "config.yaml").is_file():
        check_extras(load_run_config(run_dir))


def evaluate_command(args: argparse.Namespace) -> int:
    import json

    import torch

    from geodiloco.runtime.evaluation import evaluate_checkpoints, merged_rows, read_eval_rows
    torch.set_num_threads(os.cpu_count() or 1)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        what = "a file, not a run directory" if run_dir.exists() else "no such directory"
        print(f"geodiloco evaluate: error: {run_dir}: {what}; pass a run directory of geodiloco run", file=sys.stderr)
        return 2
    if not (run_dir / "config.yaml").is_file():
        print(f"geodiloco evaluate: error: {run_dir} has no config.yaml; pass a run directory of geodiloco run",
              file=sys.stderr)
        return 2
    out_path = run_dir / "eval.jsonl"
    if not os.access(out_path if out_path.exists() else run_dir, os.W_OK):
        print(f"geodiloco evaluate: error: {out_path}: cannot be written (permission denied), and the scores are "
              "kept there; make it writable, or evaluate a copy of the run directory", file=sys.stderr)
        return 2

    def progress(row: dict) -> None:
        if not args.json:
            se = f" +- {row['eval_loss_se']:.4f}" if row["eval_loss_se"] is not None else ""
            final = ", the run's final model" if row.get("final") else ""
            print(f"round {row['round'] + 1} (logs: {row['round']}{final}): eval loss {row['eval_loss']:.4f}{se} "
                  f"({row['sequences']} sequences)", flush=True)

    try:
        check_run_extras(run_dir)
        rows = evaluate_checkpoints(run_dir, progress)
    except ValueError as err:
        print(f"geodiloco evaluate: error: {err}", file=sys.stderr)
        return 2
    rows = merged_rows(read_eval_rows(out_path), rows)
    out_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


def export_command(args: argparse.Namespace) -> int:
    from geodiloco.runtime.export import export_global_model
    check_run_extras(Path(args.run_dir))
    print(f"[geodiloco] exported {export_global_model(Path(args.run_dir), Path(args.out), args.round)}")
    return 0


def train_command(args: argparse.Namespace) -> int:
    """Listed here for --help; runtime.cli hands ``geodiloco train ...`` to runtime.train's own parser."""
    from geodiloco.runtime.train import main as train_main
    return train_main(args.train_args)
