"""The performance model, below both the ratio policy and the serving twin. Pure: reads its own YAML only.

* :mod:`disagg.perf.latency` - how long one engine step takes per (model, GPU, TP, dtype, KV dtype), from
  measured kernel tables (H100), measured forward passes (H200) or datasheet ratios (A100 attention,
  L40S); the data lies in ``profiles/*.yaml`` (``disagg.twin.calibrate`` regenerates the coefficients).
* :mod:`disagg.perf.startup` - how long a new replica takes to serve (weights cached or downloaded).

The policy's model-based algorithm plans with these; the twin's engines run with them. It imports nothing
else of disagg but :mod:`disagg.api` (the import contracts in pyproject.toml say so).
"""
