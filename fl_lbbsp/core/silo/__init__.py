"""One silo's model: what the server believes of a silo's speed, and how it learns it.

Every algorithm here is written once, in numpy over all silos (one silo: a table of one row).

- :mod:`.estimators`, :mod:`.narx`: speed predictors, objects of one registry (Last, EMA,
  change-aware EMA, NARX), the next round's speed from the reports so far;
- :mod:`.costfit`: the silos' cost curves ``t(x) = a * max(x, k) + b`` (a knee below which a
  smaller batch buys no time, and fixed per-round seconds);
- :mod:`.detector`: the one change detector (a run of deviations to one side confirms a new
  level);
- :mod:`.reports`: what a silo reports after a round, and the checks that make it usable;
- :mod:`.model`: every silo's model as one table (:mod:`.columns`), updated by a round's
  reports; :mod:`.state`: one silo's record, its saved form and the checkpoint's schema.
"""

from . import narx  # noqa: F401  (registers the NARX estimator)
