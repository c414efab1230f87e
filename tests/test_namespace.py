"""The installed project is one import namespace, geodiloco.*: nothing it ships may import
the repository's top-level folders by their bare names (they are not installed as such)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("runtime", "balancer", "predictor", "report", "lab")


def bare_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                  if name.split(".")[0] in FOLDERS]
    return found


def test_no_source_file_imports_a_bare_top_level_folder():
    sources = [path for folder in (*FOLDERS, "tests", "experiments", "scripts")
               for path in (ROOT / folder).rglob("*.py")]
    assert len(sources) > 100
    offenders = [hit for path in sources for hit in bare_imports(path)]
    assert offenders == []


def test_installed_package_imports_as_geodiloco_only(tmp_path):
    """From a directory outside the repository, geodiloco.* imports and the bare names do not."""
    probe = ("import importlib, geodiloco.runtime.cli, geodiloco.lab.sites\n"
             "from importlib import resources\n"
             "assert resources.files('geodiloco.runtime').joinpath('default.yaml').is_file()\n"
             "assert resources.files('geodiloco.predictor').joinpath('data/gpus.yaml').is_file()\n"
             "for name in ('runtime', 'balancer', 'predictor', 'report', 'lab'):\n"
             "    try:\n"
             "        importlib.import_module(name)\n"
             "    except ModuleNotFoundError:\n"
             "        continue\n"
             "    raise SystemExit(f'bare {name} importable')\n"
             "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
