"""One silo's state declared once: the record's fields marked ``Column`` are the silo
table's columns, so a random valid record round-trips through the columns exactly, and a
field added to the record is a column without another edit."""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field, ValidationError

from fl_lbbsp.core import EMA, ChangeAwareEMA
from fl_lbbsp.core.settings import Tuning
from fl_lbbsp.core.silo.columns import SiloColumns
from fl_lbbsp.core.silo.estimators import SpeedEstimator
from fl_lbbsp.core.silo.state import Column, Count, FitState, LastReport, SiloModel

NESTED = {"estimator", "history", "last", "pending", "fit"}
"""The record's nested parts, each with its own columns."""


def _columns(estimator: SpeedEstimator, **kwargs: Any) -> SiloColumns:
    return SiloColumns(estimator=estimator, width=Tuning().history, **kwargs)


speeds = st.floats(1e-3, 1e6)
seconds = st.floats(0.0, 1e4)
sizes = st.integers(1, 10**6)
optional_seconds = st.none() | seconds
lasts = st.fixed_dictionaries(
    {}, optional={"batch_size": sizes, "train_time": seconds, "samples": st.floats(0.0, 1e6)}
).map(LastReport.model_validate)
fits = st.builds(
    FitState, slope=st.floats(1e-6, 10.0), intercept=seconds, anchor=st.floats(1.0, 1e5),
    level=st.floats(1e-3, 1e3), noise=optional_seconds, weight=st.floats(0.0, 1.0),
    spread=st.tuples(st.floats(1.0, 1e5), st.floats(1.0, 1e5)).map(lambda p: tuple(sorted(p))),
    knee=seconds,
)  # fmt: skip


@st.composite
def records(draw: st.DrawFn, estimator: SpeedEstimator, width: int) -> SiloModel:
    """A random valid record of a silo whose estimator is ``estimator``."""
    state = estimator.silo_state(estimator.fresh(1), 0)
    state["value"] = draw(st.none() | speeds)
    if "pending" in state and state["value"] is not None:
        state["pending"] = draw(st.lists(speeds, max_size=3))
    entry = st.tuples(sizes, seconds, speeds, st.floats(-5.0, 5.0), st.booleans())
    return SiloModel(
        estimator=state,  # type: ignore[arg-type]
        history=draw(st.lists(st.tuples(sizes, seconds), max_size=width)),
        max_batch_size=draw(st.none() | sizes),
        steps=draw(st.floats(1e-3, 1e4)),
        fixed_time=draw(optional_seconds),
        last=draw(lasts),
        reports=draw(st.integers(0, 10**9)),
        shape=draw(optional_seconds),
        noise=draw(optional_seconds),
        pending=draw(st.lists(entry, max_size=width)),
        boost=draw(st.floats(1e-3, 100.0)),
        fit=draw(st.none() | fits),
        knee=draw(st.floats(0.0, 1e5)),
    )


ESTIMATORS = [EMA(alpha=0.3), ChangeAwareEMA(confirm=4)]


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: e.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_random_valid_record_round_trips_through_the_columns_exactly(
    estimator: SpeedEstimator, data: st.DataObject
) -> None:
    # Prepare
    columns = _columns(estimator)
    model = data.draw(records(estimator, columns.width))
    index = columns.add()

    # Execute
    columns.load(index, model)
    copy = columns.record(index)

    # Assert: the same fields, value for value
    assert copy == model


def test_every_field_of_the_record_is_a_column_or_a_nested_part() -> None:
    # Prepare
    columns = _columns(EMA(alpha=0.2))

    # Execute
    scalars = set(columns.kinds)

    # Assert: a field neither marked nor nested would be lost in the columns
    assert scalars.isdisjoint(NESTED)
    assert scalars | NESTED == set(SiloModel.model_fields)
    assert scalars <= set(columns.scalars)


class Tenanted(SiloModel):
    """A record with two fields more (test only)."""

    co_tenants: Annotated[Count | None, Column(kind=int)] = None
    pressure: Annotated[float, Column(kind=float)] = Field(default=0.5, ge=0, le=1)


@pytest.mark.parametrize(
    ("field", "new", "value"), [("co_tenants", math.nan, 3), ("pressure", 0.5, 0.25)]
)
def test_a_field_added_to_the_record_is_a_column_without_another_edit(
    field: str, new: float, value: Any
) -> None:
    # Prepare
    columns = _columns(EMA(alpha=0.2), model=Tenanted)
    rows = [columns.add() for _ in range(20)]  # grown past the first 8 rows
    model = Tenanted.model_validate({"estimator": {"name": "ema"}, field: value})

    # Execute
    columns.load(rows[-1], model)
    copy = columns.record(rows[-1])

    # Assert: new rows hold the field's default, and the record round-trips it
    np.testing.assert_equal(columns[field][rows[:-1]], new)
    assert isinstance(copy, Tenanted)
    assert getattr(copy, field) == value and type(getattr(copy, field)) is type(value)


@pytest.mark.parametrize(
    ("field", "bad"),
    [("boost", -1.0), ("reports", -1), ("max_batch_size", 0.0), ("steps", math.nan),
     ("fixed_time", math.inf), ("knee", -0.5)],
)  # fmt: skip
def test_a_column_out_of_its_fields_bounds_is_refused_as_a_record(field: str, bad: float) -> None:
    # Prepare
    columns = _columns(EMA(alpha=0.2))
    index = columns.add()
    columns.load(index, SiloModel.model_validate({"estimator": {"name": "ema"}}))
    columns[field][index] = bad

    # Execute / Assert
    with pytest.raises(ValidationError, match=field):
        columns.record(index)
