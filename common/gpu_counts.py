"""The ``"N x NAME"`` shorthand for several GPUs of one kind, as the cluster config, the CLI and the logs write it."""
from __future__ import annotations

import re

GPU_COUNT = re.compile(r"^\s*(\d+)(?:\s*[×*]\s*|[xX]\s*|\s+[xX]\s+)(.+?)\s*$")
"""A count, then its GPU's name: "4 x A30", "4x A30", "8xH100", "2 × V100", "2*A30". An "x" that follows a space
counts only when a space follows it too, so a name that starts with digits and an X ("9070 XT", "7900 XTX 24GB")
stays one GPU's name instead of 9070 GPUs named "T"."""
