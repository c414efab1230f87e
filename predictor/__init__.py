"""How long will one training step take on this hardware?

Pure Python + numpy: GPU datasheets (specs), transformer cost model (workload),
step-time model t(B) (model) and live calibration (online). Imports nothing
from balancer/ or runtime/.
"""
