import os

# One thread per test process: the machine has two cores and tests spawn several processes.
os.environ.setdefault("OMP_NUM_THREADS", "1")
