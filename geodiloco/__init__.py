"""GeoDiLoCo: DiLoCo across sites with mixed GPUs, balanced by measured step time.

The installed package is one namespace: ``geodiloco.runtime`` (training processes and the
``geodiloco`` command), ``geodiloco.balancer`` (plans), ``geodiloco.predictor`` (step
times), ``geodiloco.report`` (idle reports) and ``geodiloco.lab`` (emulated sites). In the
repository these live in top-level folders of the same names, mapped here by pyproject.toml.
"""
__version__ = "0.1.0"


def _serve_checkout_folders() -> None:
    """From a checkout that is not installed (``PYTHONPATH=REPO``, scripts/idle_report.py), find the
    subpackages in the repository's top-level folders, as pyproject.toml's package-dir maps them when
    installed. An installed copy has no pyproject.toml beside it and is left alone."""
    from pathlib import Path
    repo = Path(__file__).resolve().parent.parent
    if (repo / "pyproject.toml").is_file() and (repo / "report" / "__init__.py").is_file():
        if str(repo) not in __path__:
            __path__.append(str(repo))


_serve_checkout_folders()
