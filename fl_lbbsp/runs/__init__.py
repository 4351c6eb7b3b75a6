"""Runners: everything that runs a federation or a cluster and reports on it.

- :mod:`.config`: the settings FL and cluster runs share (:class:`~.config.RunSettings`).
- :mod:`.engine`: a run's plan (:func:`~.engine.plan_run`) and the parts its config is
  resolved into once (:class:`~.engine.ResolvedRun`), run in process or on Flower's engine.
- :mod:`.resume`: a run's checkpoint folder, checked writable, and the run it records.
- :mod:`.fl`: FL runs (LB-BSP, FedAvg, baselines) on Flower's Simulation Engine or in process.
- :mod:`.cluster`: cluster (parameter-server) runs, one synchronous iteration per round.
- :mod:`.inprocess`: a Flower Grid that runs a ClientApp in this process.
- :mod:`.deploy`: a local SuperLink and SuperNodes for ``flwr run``.
- :mod:`.summary`: one summary and one table for FL and cluster runs, and the plot.
- :mod:`.progress`: the live progress display fed by the telemetry.
"""
