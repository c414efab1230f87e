"""The lab: tooling that emulates a WAN cluster of heterogeneous GPUs on one host.

Not training code. ``geodiloco run --sites ...``, the benchmarks in experiments/
and the multi-process tests use it to give each node what a real site has:

- :mod:`lab.sites`: one network namespace per site, tbf-shaped links to a bridge;
- :mod:`lab.delayline`: a userspace delay line for WAN latency (no netem here);
- :mod:`lab.virtual_gpu`: pad each real inner step to a chosen GPU's step time;
- :mod:`lab.cpu_share`: run a node on a real share of this machine's CPU (cgroups);
- :mod:`lab.site_procs`: start one process per site and collect its JSON lines.

Imports point one way: runtime -> lab -> balancer -> predictor.
"""
