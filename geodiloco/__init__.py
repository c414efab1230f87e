"""GeoDiLoCo: DiLoCo across sites with mixed GPUs, balanced by measured step time.

The installed package is one namespace: ``geodiloco.runtime`` (training processes and the
``geodiloco`` command), ``geodiloco.balancer`` (plans), ``geodiloco.predictor`` (step
times), ``geodiloco.report`` (idle reports) and ``geodiloco.lab`` (emulated sites). In the
repository these live in top-level folders of the same names, mapped here by pyproject.toml.
"""
__version__ = "0.1.0"
