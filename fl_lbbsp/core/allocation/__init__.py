"""The allocation: what batch size does silo i get, and why.

Bounds, then an allocator (the least predicted round time under the noise budget,
:mod:`.budget` and :mod:`.waterfill`; Alg. 1's split proportional to speed, :mod:`.allocators`;
Alg. 2's iterative leader/straggler tuning, :mod:`.iterative`), then the guards and the integer
rounding that keeps the total (:mod:`.rounding`). :mod:`.pipeline` runs these steps and returns
each silo's size with its reason (Chen et al., IEEE TCC 2021, Eq. 3, Alg. 1 and Alg. 2).
"""
