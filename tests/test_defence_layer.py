"""The defences are a layer over the round engine: the core runs without them, the
strategies compose them on (fl_lbbsp.core.round.trust, fl_lbbsp.security.guard)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fl_lbbsp.contract import RecordKeys
from fl_lbbsp.core.round.engine import RoundEngine
from fl_lbbsp.core.round.state import Reply, Verdict
from fl_lbbsp.core.settings import ReplyLimits, balancing_config
from fl_lbbsp.security.claims import ClaimChecker
from fl_lbbsp.security.guard import guard
from fl_lbbsp.security.reply_screen import ReplyScreen
from fl_lbbsp.strategies import LBBSPFedAvg

KEYS = RecordKeys()
SIZES = {"0": 100, "1": 100, "2": 100, "3": 9_900_000}  # silo 3 claims 99,000 times more


def _engine() -> RoundEngine:
    return RoundEngine(
        config=balancing_config(initial_batch_size=32, local_steps=2, lr=0.1),
        keys=KEYS,
        limits=ReplyLimits(),
        weight_key=KEYS.num_examples,
    )


@pytest.mark.parametrize("module", ["fl_lbbsp.core", "fl_lbbsp.core.round.engine"])
def test_the_core_loads_no_module_of_the_defence_layer(module: str) -> None:
    # Prepare: a fresh interpreter, which has loaded nothing of the package yet
    code = (
        f"import sys; import {module}; "
        "print(','.join(sorted(m for m in sys.modules if m.startswith('fl_lbbsp.security'))))"
    )

    # Execute
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )

    # Assert
    assert result.stdout.strip() == ""


@pytest.mark.parametrize(
    ("guarded", "weight"), [(False, 9_900_000.0), (True, 200.0)], ids=["bare", "guarded"]
)
def test_an_inflated_size_weighs_as_claimed_only_on_a_bare_engine(
    guarded: bool, weight: float
) -> None:
    # Prepare: four silos' claims, checked by the engine's claim policy
    engine = _engine()
    if guarded:
        guard(engine)
    for silo, size in SIZES.items():
        assert engine.claims.check_size(silo, size) is None

    # Execute
    weights = engine.weights({silo: float(size) for silo, size in SIZES.items()})

    # Assert: the bare engine believes it; the defence layer caps it at 2x the median
    assert weights["3"][0] == weight
    assert (weights["3"][1] is not None) == guarded


@pytest.mark.parametrize(("guarded", "accepted"), [(False, True), (True, False)])
def test_an_unsigned_reply_passes_only_a_bare_engine_when_signatures_are_required(
    guarded: bool, accepted: bool
) -> None:
    # Prepare: a registry that knows no silo's key (every reply must be signed)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fl_lbbsp.security.identity import SiloRegistry

    engine = _engine()
    if guarded:
        guard(engine, registry=SiloRegistry(keys={"a": Ed25519PrivateKey.generate().public_key()}))
    state = engine.plan(1, [7])
    metrics = {KEYS.num_examples: 100, KEYS.train_time: 0.5, KEYS.batch_size: 32}

    # Execute
    verdict: Verdict[str] = engine.screen(
        state, Reply(node=7, silo="a", metrics=metrics), lambda: "update"
    )

    # Assert
    assert verdict.accepted == accepted
    assert guarded == ("unsigned reply" in (verdict.reason or ""))


def test_the_strategy_guards_its_engine_by_default() -> None:
    # Prepare / Execute
    strategy = LBBSPFedAvg(initial_batch_size=32, local_steps=2, lr=0.1)

    # Assert: the defence layer is the engine's gate and claim policy
    assert isinstance(strategy.engine.gate, ReplyScreen)
    assert isinstance(strategy.engine.claims, ClaimChecker)
    assert strategy.engine.gate is strategy.reply_screen
