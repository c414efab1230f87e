"""Imports point one way (README, Architecture): runtime -> lab -> balancer -> predictor -> common; report reads
logs only and imports none of them; common imports no other package. Read from every module's own imports,
those inside functions included, so a lazy import that turns the direction round is caught too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
MAY_IMPORT = {
    "runtime": {"runtime", "lab", "balancer", "predictor", "common", "report"},  # the CLI prints the report
    "lab": {"lab", "balancer", "predictor", "common"},
    "balancer": {"balancer", "predictor", "common"},
    "predictor": {"predictor", "common"},
    "common": {"common"},
    "report": {"report", "common"},
}


def imported_packages(path: Path) -> set[str]:
    """The geodiloco packages a module imports (``geodiloco.X...`` -> ``X``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        found |= {name.split(".")[1] for name in names if name.startswith("geodiloco.") and name.count(".") >= 1}
    return found


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_the_layers_below_it(package):
    modules = sorted((REPO_ROOT / package).rglob("*.py"))
    assert modules, f"no modules under {package}/"
    wrong = {str(path.relative_to(REPO_ROOT)): sorted(imported_packages(path) - MAY_IMPORT[package])
             for path in modules}
    assert {path: names for path, names in wrong.items() if names} == {}
