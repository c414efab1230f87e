"""The run means behind Lambda's truncated figures, read from Lambda's own run logs.

Lambda's compile scripts write each throughput cell of their CSVs as ``int(round(mean, 2))`` of the figures
its runs logged, so a published 62 stands for any mean in [62, 63): up to 5 % of a figure near 10. Lambda's
repository keeps those logs. This script reads, for every Lambda row of the data files, the logs at the
commit the row cites, with the line pattern and field that commit's compile script uses for the row's
column and container version (the script's tables are read as data, with ``ast.literal_eval``), averages the
last figure of each log as that script does, and checks that truncating the mean gives the published figure.
With ``--write`` it records the mean in the row as ``value_from_logs`` and the number of logs as
``log_files``; ``bench_published.published_value`` reads it in place of the middle of the unit.

It also checks that each row's batch size and sequence length are what its logs ran: run_squad.py's
``--train_batch_size`` and ``--max_seq_length``, Transformer-XL's ``batch_size`` and ``tgt_len`` as its
argument namespace prints them. The rows took them from Lambda's batch-size CSVs and configs.

No model is involved: this only reads what the published figure was cut down from.

Needs a clone of lambdal/deeplearning-benchmark (it must hold both commits the data files cite):
    git clone https://github.com/lambdal/deeplearning-benchmark /tmp/lambda-benchmark
    .venv/bin/python experiments/predictor/lambda_log_means.py --lambda-repo /tmp/lambda-benchmark [--write]
Exits 1 where a row's logs do not give its published figure, ran another batch size or sequence length, or
where its source names no known compile script or system; 2 where the clone is missing.
"""
from __future__ import annotations

import argparse
import ast
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from source_warmup import git

DATA_DIR = Path(__file__).resolve().parent / "data"
DATA_FILES = (DATA_DIR / "published_training_steps.yaml", DATA_DIR / "published_pascal_steps.yaml")
COMPILE_SCRIPTS = {
    ("2c0af45b4869fa867e0fe5dfa0416463c58238f2", False): ("pytorch/scripts/compile_results_pytorch_throughput.py",
                                                         "pytorch/results"),
    ("aa5addb6a53675a649a80036dad548f1c27cbcc4", False): ("pytorch/scripts/compile_results_pytorch.py",
                                                         "pytorch/results"),
    ("aa5addb6a53675a649a80036dad548f1c27cbcc4", True): ("pytorch/scripts/compile_results_pytorch_v2.py",
                                                        "pytorch/results_v2"),
}
"""(commit, whether the row is from a v2 CSV) -> the compile script that wrote the row's CSV and the folder of
run logs it reads."""
ROW_SOURCE = re.compile(r"pytorch/pytorch-train-throughput-(?P<v2>v2-)?(?P<precision>fp16|fp32)\.csv column "
                        r"(?P<column>\w+), row '(?P<row>[^']+)'.*?blob/(?P<commit>[0-9a-f]{40})/", re.S)
LOG_MEAN_DECIMALS = 3
LOGGED_BATCH = re.compile(r"(?:--train_batch_size[= ]|[ (]batch_size=)(\d+)")
LOGGED_SEQ_LEN = re.compile(r"(?:--max_seq_length[= ]|[ (]tgt_len=)(\d+)")
"""How a log names the batch and sequence length it ran: run_squad.py's command line, or the argument
namespace Transformer-XL's train.py prints (``eval_batch_size`` and ``eval_tgt_len`` do not match)."""


@dataclass(frozen=True)
class LogRecipe:
    """Where a CSV cell's run logs lie and how its compile script reads a figure out of each."""
    log_dir: str
    line_pattern: str
    field: int
    """Index into the matching line split on single spaces."""


@dataclass(frozen=True)
class LogMean:
    row_id: str
    published: float
    mean: float
    log_files: int
    shape: tuple[int, int] = (0, 0)
    """The row's (batch size, sequence length)."""
    logged_shapes: tuple[tuple[int, int], ...] = ()
    """The (batch size, sequence length) of each log that prints both."""

    @property
    def agrees(self) -> bool:
        """Whether the compile script's own truncation of this mean gives the published figure."""
        return self.log_files > 0 and int(round(self.mean, 2)) == int(self.published)

    @property
    def shape_agrees(self) -> bool:
        """Whether every log that names its batch size and sequence length ran the row's."""
        return all(logged == self.shape for logged in self.logged_shapes)


def logged_shape(text: str) -> tuple[int, int] | None:
    """(batch size, sequence length) a run log says it ran, None where it does not print both."""
    batch, seq_len = LOGGED_BATCH.search(text), LOGGED_SEQ_LEN.search(text)
    if batch is None or seq_len is None:
        return None
    return int(batch.group(1)), int(seq_len.group(1))


def script_tables(source: str) -> dict[str, object]:
    """The literal tables a compile script assigns at module level (systems and tests), by name."""
    tables = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                tables[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return tables


def recipe(tables: dict[str, object], results_dir: str, row_name: str, precision: str, column: str,
           v2: bool) -> LogRecipe:
    """The logs and reading rule of one CSV cell. A v1 script names systems by display name (its system tables
    map folder -> ([version, gpus], display name, ...)) and keeps one test table per container version; the v2
    script names each system by its folder and has one test table."""
    tests = tables[f"list_test_{precision}"]
    if v2:
        folder = row_name
    else:
        systems = {**tables.get("list_system_single", {}), **tables.get("list_system_multiple", {})}
        matches = [(name, spec) for name, spec in systems.items() if spec[1] == row_name]
        if len(matches) != 1:
            raise LookupError(f"row {row_name!r} names {len(matches)} systems of the compile script")
        folder, spec = matches[0]
        tests = tests[spec[0][0]]
    cells = [(test, rule) for test, rule in tests.items() if rule[0] == column]
    if len(cells) != 1:
        raise LookupError(f"column {column!r} names {len(cells)} tests of the compile script")
    test, (_, pattern, field) = cells[0]
    return LogRecipe(f"{results_dir}/{folder}/{test}", pattern, field)


def last_figure(text: str, how: LogRecipe) -> float:
    """The last figure a log prints on a line matching the recipe's pattern, 0 where none parses."""
    pattern = re.compile(how.line_pattern)
    figure = 0.0
    for line in text.splitlines():
        for match in pattern.finditer(line):
            try:
                figure = float(match.group().split(" ")[how.field])
            except (ValueError, IndexError):
                continue
    return figure


def logged_mean(texts: list[str], how: LogRecipe) -> tuple[float, int]:
    """The mean figure over the logs that print one, and how many do (logs printing none are left out, as
    the compile script leaves them out)."""
    figures = [figure for figure in (last_figure(text, how) for text in texts) if figure > 0]
    return (statistics.fmean(figures), len(figures)) if figures else (0.0, 0)


def row_log_mean(repo: Path, row: dict, scripts: dict[tuple, dict]) -> LogMean:
    source = ROW_SOURCE.search(row["source"])
    if source is None:
        raise LookupError(f"{row['id']}: its source names no Lambda CSV cell and commit")
    key = (source["commit"], bool(source["v2"]))
    if key not in COMPILE_SCRIPTS:
        raise LookupError(f"{row['id']}: no compile script is known for commit {source['commit'][:8]}"
                          f"{' (v2 CSV)' if key[1] else ''}; add it to COMPILE_SCRIPTS")
    script_path, results_dir = COMPILE_SCRIPTS[key]
    if key not in scripts:
        scripts[key] = script_tables(git(repo, "show", f"{source['commit']}:{script_path}"))
    try:
        how = recipe(scripts[key], results_dir, source["row"], source["precision"], source["column"], key[1])
    except LookupError as error:
        raise LookupError(f"{row['id']}: {error}") from None
    listing = git(repo, "ls-tree", "--name-only", f"{source['commit']}:{how.log_dir}").split()
    texts = [git(repo, "show", f"{source['commit']}:{how.log_dir}/{name}") for name in listing if name.endswith(".txt")]
    mean, files = logged_mean(texts, how)
    shapes = tuple(shape for shape in map(logged_shape, texts) if shape is not None)
    return LogMean(row["id"], float(row["value"]), mean, files, (row["batch_size"], row["seq_len"]), shapes)


def lambda_rows(path: Path) -> list[dict]:
    return [row for row in yaml.safe_load(path.read_text(encoding="utf-8"))["measurements"]
            if row["id"].startswith("lambda")]


def with_log_means(text: str, means: dict[str, LogMean]) -> str:
    """The data file's text with each row's ``value_from_logs`` and ``log_files`` set after its
    ``value_truncated_to`` line (replacing earlier ones); comments and layout are kept."""
    out, row_id = [], None
    for line in text.split("\n"):
        if line.startswith("- id: "):
            row_id = line[len("- id: "):].strip()
        if row_id in means and line.startswith(("  value_from_logs:", "  log_files:")):
            continue
        out.append(line)
        if row_id in means and line.startswith("  value_truncated_to:"):
            mean = means[row_id]
            out += [f"  value_from_logs: {round(mean.mean, LOG_MEAN_DECIMALS)}", f"  log_files: {mean.log_files}"]
    return "\n".join(out)


def shapes_agree(every: list[LogMean]) -> bool:
    """Print how many rows' logs name the batch size and sequence length they ran, and any row whose logs ran
    other ones; True where none did."""
    named = [mean for mean in every if mean.logged_shapes]
    other = [mean for mean in named if not mean.shape_agrees]
    print(f"{len(named)} rows have logs that name their batch size and sequence length; "
          f"{len(named) - len(other)} ran the row's")
    for mean in other:
        ran = ", ".join(f"batch {batch} at {seq_len}" for batch, seq_len in sorted(set(mean.logged_shapes)))
        print(f"  {mean.row_id}: the row says batch {mean.shape[0]} at {mean.shape[1]}; its logs ran {ran}")
    if other:
        print("error: fix those rows' batch_size or seq_len to what their logs ran; nothing written", file=sys.stderr)
    return not other


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lambda-repo", type=Path, required=True,
                        help="a clone of https://github.com/lambdal/deeplearning-benchmark holding the commits "
                             "the data files cite")
    parser.add_argument("--write", action="store_true",
                        help="record value_from_logs and log_files in the data files (only if every row agrees)")
    args = parser.parse_args(argv)
    try:
        for commit, _ in COMPILE_SCRIPTS:
            git(args.lambda_repo, "cat-file", "-e", f"{commit}^{{commit}}")
    except (subprocess.CalledProcessError, FileNotFoundError):
        print(f"error: {args.lambda_repo} is not a clone of lambdal/deeplearning-benchmark holding commits "
              f"{', '.join(sorted({commit[:8] for commit, _ in COMPILE_SCRIPTS}))}; clone it with: "
              "git clone https://github.com/lambdal/deeplearning-benchmark", file=sys.stderr)
        return 2
    scripts: dict[tuple, dict] = {}
    by_file = {}
    for path in DATA_FILES:
        rows = lambda_rows(path)
        try:
            by_file[path] = {row["id"]: row_log_mean(args.lambda_repo, row, scripts) for row in rows}
        except LookupError as error:
            print(f"error: {path.name}: {error}", file=sys.stderr)
            return 1
        print(f"{path.name}: logs of {len(rows)} Lambda rows read", file=sys.stderr)
    every = [mean for means in by_file.values() for mean in means.values()]
    disagreeing = [mean for mean in every if not mean.agrees]
    shifts = [mean.mean - mean.published for mean in every if mean.agrees]
    print(f"{len(every)} Lambda rows; {len(every) - len(disagreeing)} have logs whose mean truncates to the published "
          f"figure; mean - published: median {statistics.median(shifts):.3f}, least {min(shifts):.3f}, "
          f"most {max(shifts):.3f} (the middle of the unit reads 0.5)")
    for mean in disagreeing:
        print(f"  {mean.row_id}: published {mean.published:g}, {mean.log_files} logs with mean {mean.mean:.3f}")
    if disagreeing:
        print("error: some rows' logs do not give their published figure; nothing written", file=sys.stderr)
        return 1
    if not shapes_agree(every):
        return 1
    if args.write:
        for path, means in by_file.items():
            path.write_text(with_log_means(path.read_text(encoding="utf-8"), means), encoding="utf-8")
            print(f"wrote value_from_logs to {len(means)} rows of {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
