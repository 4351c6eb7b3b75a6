"""One silo's model: what the server believes of a silo's speed, and how it learns it.

- :mod:`.estimators`, :mod:`.speed`, :mod:`.narx`: speed predictors (Last, EMA, change-aware EMA,
  NARX), the next round's speed from the reports so far;
- :mod:`.costfit`: the silo's cost curve ``t(x) = a * max(x, k) + b`` (a knee below which a smaller
  batch buys no time, and fixed per-round seconds);
- :mod:`.change`: the one change detector (a run of deviations to one side confirms a new level);
- :mod:`.reports`: what a silo reports after a round, and the checks that make it usable;
- :mod:`.model`: every silo's model as one table, updated by a round's reports.
"""
