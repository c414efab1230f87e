"""The ``geodiloco`` command: parse, dispatch, turn known errors into one-line messages.

Each package registers its own subcommands (``register(subparsers)``) and sets
``func(args) -> exit code``; this module stays thin and imports heavy modules
(torch) only inside the command that needs them.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys

from geodiloco.common.console import prefix_notices
from geodiloco.common.schema import ConfigError
from geodiloco.runtime.fatal import LaunchError

DESCRIPTION = """\
GeoDiLoCo: train one language model across sites with different GPUs.

  geodiloco run        launch every node of a config on this machine (default: embedded demo)
  geodiloco train      one site's entry under torchrun (same as python -m geodiloco.runtime.train)
  geodiloco evaluate   eval loss (+- standard error) of every kept round's global model
  geodiloco export     a round's global model: a transformers directory (model.hf runs) or safetensors
  geodiloco predict    predict a node's step time from its GPUs and the model
  geodiloco plan       per-node local steps and batch sizes for a balancing policy
  geodiloco simulate   simulate rounds of a cluster under a policy (no processes)
  geodiloco report     idle-time report of one or more run directories
  geodiloco rendezvous host the rendezvous store of an elastic run across sites
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="geodiloco", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_line())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from geodiloco.runtime import commands as runtime_commands
    from geodiloco.predictor import cli as predictor_cli
    from geodiloco.balancer import cli as balancer_cli
    from geodiloco.report import cli as report_cli

    runtime_commands.register(subparsers)
    predictor_cli.register(subparsers)
    balancer_cli.register(subparsers, check_file=check_planning_file)
    report_cli.register(subparsers)
    return parser


def version_line() -> str:
    """``geodiloco X.Y.Z (torch T, Python P)``: what a bug report needs first."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import geodiloco
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"geodiloco {geodiloco.__version__} (torch {torch_version}, Python {platform.python_version()})"


def check_planning_file(path: str) -> None:
    """``plan`` and ``simulate`` check a run config's sections with the runtime's schema (imported only then)."""
    from geodiloco.runtime.config import check_planning_file as check
    check(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prefix_notices()
    if argv[:1] == ["train"]:
        from geodiloco.runtime.train import exit_process, main as train_main
        exit_process(train_main(argv[1:], prog="geodiloco train"))
    parser = build_parser()
    args = parse_command_line(parser, argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that went away (`| head`) is handled below
        return code
    except ConfigError as err:
        print(f"geodiloco {args.command}: error: {err}", file=sys.stderr)
        return 2
    except LaunchError as err:
        print(f"geodiloco {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"geodiloco {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, like other command-line tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:
        print(f"geodiloco {args.command}: error: {path_error(err)}", file=sys.stderr)
        return 2


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, except that run directories named after an option (``report run1 --compare run2``)
    join the others, and an unknown argument is refused with the subcommand's usage rather than the top level's."""
    args, extras = parser.parse_known_args(argv)
    if args.command == "report":
        args.run_dirs += [extra for extra in extras if not extra.startswith("-")]
        extras = [extra for extra in extras if extra.startswith("-")]
    if extras:
        subcommands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        subcommands.choices[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def path_error(err: OSError) -> str:
    """A file-system error as one line naming the path: an output path that is a file where a folder
    is wanted, a folder that cannot be created, a file that cannot be written."""
    if err.filename is None:
        return err.strerror or str(err)
    if err.errno in (errno.EACCES, errno.EPERM):  # reading an input or writing an output: say both fixes
        return f"{err.filename}: permission denied; check its permissions, or choose another path"
    return f"{err.filename}: {(err.strerror or str(err)).lower()}; choose another path"


if __name__ == "__main__":
    sys.exit(main())
