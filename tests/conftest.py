import os

# One thread per test process: the machine has two cores and tests spawn several processes.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Workers started directly (torchrun, python -m geodiloco.runtime.train) need the run's shared
# secret; `geodiloco run` would make one. Tests that check its absence remove it themselves.
os.environ.setdefault("GEODILOCO_SECRET", "geodiloco-tests-shared-secret")

# The modules that take longest (seconds of one serial run on two cores, from `--durations`).
# pytest-xdist (`-n 2 --dist loadscope --no-loadscope-reorder`, the default in pyproject.toml)
# hands whole modules to its two workers in collection order, so these start first and the short
# modules fill in around them, instead of one worker running a long module alone at the end
# (xdist's own reorder puts the modules with the most tests first, and these have few).
# A stale entry costs only time.
LONG_MODULES_S = {
    "test_hivemind_run": 170, "test_runtime_elastic": 140, "test_paper4": 75, "test_runtime_reference": 67,
    "test_runtime_run": 63, "test_auth": 61, "test_runtime_torchrun": 42, "test_runtime_async": 36,
}


def pytest_collection_modifyitems(config, items):
    """Longest modules first (see LONG_MODULES_S); the order inside a module is unchanged."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.path.stem, len(first_seen))
    items.sort(key=lambda item: (-LONG_MODULES_S.get(item.path.stem, 0), first_seen[item.path.stem]))
