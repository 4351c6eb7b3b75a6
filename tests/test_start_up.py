"""A silo's cold first report is taken for start-up only when no cost line of the silo
explains it beside its first warm one (:func:`fl_lbbsp.core.round.reports.held_start_up`),
and the round engine keeps an honest first report of a fixed-cost silo in its history."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fl_lbbsp.core.balancer import SiloReport
from fl_lbbsp.core.round.reports import held_start_up

TAU = 30
THRESHOLD = 0.2


def _report(batch_size: int, seconds: float, steps: int = TAU) -> SiloReport:
    return SiloReport(batch_size=batch_size, train_time=seconds, samples=batch_size * steps)


def _line(a: float, b: float, x: int, steps: int = TAU) -> float:
    return steps * (a * x + b)


@pytest.mark.parametrize(
    ("cold", "warm", "start_up"),
    [
        # the quickstart run on Flower's Simulation Engine: 1.02 s cold at 16, 0.06 s warm
        # at 8 (the first silo on a fresh actor)
        (_report(16, 1.024), _report(8, 0.060), True),
        # a 4x silo whose time is mostly the fixed cost per step: 0.239 s at 16, 0.244 s
        # at 20; its speed rose 22 % with the batch size alone
        (_report(16, 0.239), _report(20, 0.244), False),
        # proportional cost: half the batch, half the time
        (_report(16, 0.32), _report(8, 0.16), False),
        # warm far slower than any line through the cold report allows (a change)
        (_report(16, 0.1), _report(20, 0.3), True),
        # the same batch size, 20x faster when warm
        (_report(16, 2.0), _report(16, 0.1), True),
        # fewer steps reported: compared per step
        (_report(16, 0.3), _report(16, 0.1, steps=10), False),
    ],
    ids=["cold-actor", "fixed-cost", "proportional", "slower-than-any-line", "same-size",
         "per-step"],
)  # fmt: skip
def test_a_cold_report_is_start_up_only_outside_every_cost_line(
    cold: SiloReport, warm: SiloReport, start_up: bool
) -> None:
    # Execute / Assert
    assert held_start_up(cold, warm, threshold=THRESHOLD) is start_up


@given(
    a=st.floats(0.0, 1e-2),
    b=st.floats(0.0, 1e-2),
    x_cold=st.integers(1, 512),
    x_warm=st.integers(1, 512),
    steps=st.integers(1, 100),
    noise=st.floats(1 / 1.15, 1.15),
)
def test_two_reports_of_one_cost_line_are_never_start_up(
    a: float, b: float, x_cold: int, x_warm: int, steps: int, noise: float
) -> None:
    # Prepare: one capacity t = steps (a x + b), a or b possibly 0, the warm report
    # within 15 % of it
    if a + b <= 1e-9:
        a = 1e-3
    cold = _report(x_cold, _line(a, b, x_cold))
    warm = _report(x_warm, _line(a, b, x_warm, steps) * noise, steps=steps)

    # Execute / Assert
    assert not held_start_up(cold, warm, threshold=THRESHOLD)
