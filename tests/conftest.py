import os

import pytest

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
    "test_runtime_elastic": 168, "test_hivemind_run": 154, "test_runtime_run": 145, "test_runtime_reference": 105,
    "test_paper4": 98, "test_hivemind_founding": 92, "test_auth": 65, "test_runtime_torchrun": 54,
    "test_runtime_async": 50, "test_runtime_agent": 65,
}


def pytest_collection_modifyitems(config, items):
    """Longest modules first (see LONG_MODULES_S); the order inside a module is unchanged."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.path.stem, len(first_seen))
    items.sort(key=lambda item: (-LONG_MODULES_S.get(item.path.stem, 0), first_seen[item.path.stem]))


_SHIPPED_ROWS: dict = {}


def _shipped_rows() -> dict:
    """The shipped table's rows by name (read once)."""
    if not _SHIPPED_ROWS:
        from geodiloco.predictor import specs
        _SHIPPED_ROWS.update({spec.name: spec for spec in specs.read_gpu_file(specs.DATA_FILE)})
    return _SHIPPED_ROWS


@pytest.fixture(autouse=True)
def _gpu_table_without_other_tests_rows():
    """A test that adds user GPU rows (load_user_gpus, a config's gpu_files) changes the process-wide table;
    the next test in the same worker starts from the shipped table again (it is rebuilt only then)."""
    from geodiloco.predictor import specs
    table = specs._registry
    rows = dict(table.by_name) if table is not None else _shipped_rows()
    yield
    if specs._registry is not None and specs._registry.by_name != rows:
        specs._registry = None
