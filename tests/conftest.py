import os

# One thread per test process: the machine has two cores and tests spawn several processes.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Workers started directly (torchrun, python -m geodiloco.runtime.train) need the run's shared
# secret; `geodiloco run` would make one. Tests that check its absence remove it themselves.
os.environ.setdefault("GEODILOCO_SECRET", "geodiloco-tests-shared-secret")
