"""Shared fixtures: a Flower task identity so Messages can be built outside a run."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest


def pytest_report_header() -> str:
    """Which of numpy's SIMD paths this run uses: ``make test-portable`` holds them down
    (``NPY_DISABLE_CPU_FEATURES``), so that the suite runs as it would on an older CPU."""
    import os

    import numpy as np

    try:  # what np.show_runtime() prints, read from the module it reads it from
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # pragma: no cover - another numpy layout
        return f"numpy {np.__version__}"
    active = [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]
    disabled = os.environ.get("NPY_DISABLE_CPU_FEATURES")
    held = f" (NPY_DISABLE_CPU_FEATURES={disabled!r})" if disabled else ""
    return f"numpy {np.__version__}, SIMD dispatch: {' '.join(active) or 'baseline only'}{held}"


@pytest.fixture(autouse=True)
def _loggers_restored() -> Iterator[None]:
    """Put fl_lbbsp's and Flower's loggers back as each test found them: a benchmark's
    smoke run raises their levels, a ServerApp routes ours to Flower's console, and a
    test's log assertions must not depend on which tests ran before it (nor on a warning
    said once a process having been said by an earlier test)."""
    loggers = [logging.getLogger(name) for name in ("fl_lbbsp", "flwr")]
    saved = [
        (list(lg.handlers), lg.level, lg.propagate, list(lg.filters), lg.disabled) for lg in loggers
    ]
    from fl_lbbsp.security.reply_screen import _say_unverified

    _say_unverified.cache_clear()  # said once a process: once a test here
    yield
    for logger, (handlers, level, propagate, filters, disabled) in zip(loggers, saved, strict=True):
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
        logger.filters[:] = filters
        logger.disabled = disabled


@pytest.fixture
def flower_task() -> Iterator[None]:
    """Set Flower's TaskIdentity (needed to construct Messages) and restore it after."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


@pytest.fixture
def fl_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture the fl_lbbsp logger even when the CLI has stopped it from propagating."""
    logger = logging.getLogger("fl_lbbsp")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="fl_lbbsp")
    yield caplog
    logger.removeHandler(caplog.handler)


def make_reply(content, *, node_id: int):  # type: ignore[no-untyped-def]
    """A train reply from ``node_id`` carrying ``content``."""
    from flwr.app import Message, MessageType, Metadata

    metadata = Metadata(
        run_id=1,
        message_id="",
        src_node_id=node_id,
        dst_node_id=0,
        reply_to_message_id="m",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type=MessageType.TRAIN,
    )
    return Message(content=content, metadata=metadata)


class FakeGrid:
    """The part of flwr's Grid that node sampling uses."""

    def __init__(self, node_ids: list[int]) -> None:
        self.node_ids = node_ids

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)
