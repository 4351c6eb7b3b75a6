"""fl_lbbsp: load-balanced bulk synchronous parallel (LB-BSP) for Flower.

Architecture
------------
Every decision of a round is made in ``fl_lbbsp.core`` (numpy only, no Flower, no torch);
everything else translates.

``core/round/engine.py``, :class:`~fl_lbbsp.core.round.engine.RoundEngine`
    The one place where a batch size is decided (``plan``): it asks the balancer
    (``core/balancer.py``: speed estimators, allocators, rounding, guards) to split
    ``X = n * B_init`` and gives one instruction per silo (batch size, local steps,
    learning rate, sample offset in cluster mode) and the round's deadline
    (``core/round/deadline.py``). ``screen`` checks each reply (``security/screening.py``),
    ``report`` feeds its timing to the balancer, ``close`` ends the round;
    ``state_dict`` / ``load_state_dict`` is the engine's whole checkpoint. The baselines
    are pieces of it: ``TauRewriter`` / ``EtaRewriter`` rewrite instructions,
    ``FastestReplies`` keeps the fastest replies.
``core/aggregation.py``, ``core/optim.py``
    The aggregators, accumulating each accepted update in place: ``WeightedMean`` (FL: by
    dataset size) and, beside the server's ``SGD``, ``GradientStep`` (cluster mode: SGD on
    the batch-size-weighted gradient). The encrypted sum and the encrypted replica log are in
    ``strategies/encrypted.py`` and ``strategies/encrypted_cluster.py``.
``core/settings.py``
    ``BalancingKnobs`` (what users set), ``Tuning`` (the rest), ``BalancingConfig`` (with the
    round): the balancer's settings, each declared once.
``strategies/``
    Thin Flower adapters: ``LBBSPFedAvg`` (Message API) turns the engine's instructions
    into messages and replies into the engine's ``Reply``; ``LBBSPStrategy`` does the same
    for the legacy API. The variants are the same class composed with another piece:
    ``LBBSPCluster`` (offsets, ``GradientUpdate``), ``LBBSPTau`` / ``LBBSPEta``
    (rewriters), ``PartialAggregation`` (``FastestReplies``), ``EncryptedLBBSPFedAvg``
    (``EncryptedSum``), ``EncryptedLBBSPCluster`` (``ReplicaLog``).
``contract.py``
    Every key on the wire between server and silo.
``clients/``
    The silo side (trainer, batch sampler, emulated capacity); it imports the contract,
    the core, crypto, datasets and models, never the strategies.
``runs/``
    The runners behind the ``fl-lbbsp`` command (simulation, cluster, in-process,
    deployment, summary tables).
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

try:
    __version__: str = _distribution_version("fl_lbbsp")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
