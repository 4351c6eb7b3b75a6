"""The round: one LB-BSP round as data and the engine that decides it, with no Flower.

- :mod:`.engine`: ``plan`` -> one instruction per silo, ``report`` -> the silo models, ``close``;
- :mod:`.state`: what each silo is told, what came back, what was decided;
- :mod:`.timing` and :mod:`.deadline`: a planned round's ideal and predicted time, its deadline;
- :mod:`.reports`: a round's accepted replies reported to the balancer;
- :mod:`.memory_caps`: caps learned from silos that ran out of memory;
- :mod:`.rewriters`: the baselines that rewrite a balanced round (tau or eta instead of B).
"""
