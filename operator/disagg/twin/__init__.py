"""The serving twin: a calibrated simulator of disaggregated and colocated serving, and emulated engines.

* :mod:`disagg.perf` (below the twin and the policy) - the latency model, step times per (model, GPU, TP,
  dtype, KV dtype), and the replica start-up estimate; :mod:`disagg.twin.calibrate` regenerates its
  coefficients from the measurements.
* :mod:`disagg.twin.fidelity` - the published and measured points the twin is checked against.
* :mod:`disagg.twin.engine` - one replica's continuous-batching scheduler (``EngineCore``), shared by the
  offline simulator and the live twin.
* :mod:`disagg.twin.deployment` - what is simulated: pools, engine limits, bounds, from a twin document or a
  DisaggregatedDeployment.
* :mod:`disagg.twin.sim` - the discrete-event simulator (pools, routing, KV transfer, scaling, observations).
* :mod:`disagg.twin.traffic` - Azure / Mooncake / BurstGPT loaders and synthetic generators.
* :mod:`disagg.twin.report` - goodput, SLO attainment, percentiles, GPU-hours, per-window load and
  attainment, why attainment is what it is, the HTML report.
* :mod:`disagg.twin.plots` - its interactive figures (plotly), whose style the demo's report shares.
* :mod:`disagg.twin.decisions` - the policy's decisions in the loop and the spans a bound held.
* :mod:`disagg.twin.html_report` - the HTML page writer of `disagg simulate` and `disagg demo`.
* ``disagg simulate`` (:mod:`disagg.twin.cli_simulate`) and ``disagg twin`` (:mod:`disagg.twin.live.cli`).
"""
