"""A drop-in adapter that turns an existing Message-API train function into an LB-BSP silo.

Decorate the ``@app.train()`` function of a ClientApp written the way Flower's
quickstart-pytorch writes one; the decorator

- reads ``batch-size``, ``local-steps`` and ``lr`` (and ``server-round``) from the train
  message's ConfigRecord and hands them to the function as a :class:`LocalTraining`,
- times the compute (the ``with plan.timed():`` block if the function uses one, the whole
  call otherwise), emulating a slower machine when the node or run config asks for it,
- adds the contract's metrics (``train-time``, ``batch-size``, ``samples-processed``,
  ``cpu-percent``, ``memory-percent`` and, if the node config sets it, ``max-batch-size``)
  to the reply's MetricRecord and the silo's identity as a ConfigRecord ``silo``.

.. code-block:: python

    app = ClientApp()

    @app.train()
    @lbbsp_train()
    def train(msg: Message, context: Context, plan: LocalTraining) -> Message:
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        trainset = load_data(context)
        loader = DataLoader(trainset, batch_sampler=plan.batch_sampler(len(trainset)))
        with plan.timed():
            loss = train_fn(model, loader, plan.lr)
        metrics = MetricRecord({"train_loss": loss, "num-examples": len(trainset)})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

The function must still return the arrays and a MetricRecord with ``num-examples``, the
local dataset size (the aggregation weight, which must not depend on the batch size).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord

from ..contract import RecordKeys
from .emulation import CostModel, SlowdownSchedule, emulated_time
from .sampler import ResizableBatchSampler
from .trainer import TrainerConfig, machine_usage

__all__ = [
    "COST_MODEL_KEY",
    "SLOWDOWNS_KEY",
    "SLOWDOWN_KEY",
    "LocalTraining",
    "TrainFunction",
    "lbbsp_train",
]

SLOWDOWN_KEY = "slowdown"
"""node_config entry: this silo's emulated slowdown k (``"4"`` or ``"1:1,10:4"``)."""
SLOWDOWNS_KEY = "slowdowns"
"""run_config entry: emulated slowdowns per partition, ``"1;2;4"``."""
COST_MODEL_KEY = "cost-model"
"""run_config entry: emulated step time ``"m,b"`` of the fastest silo (``""``: measured)."""
_PARTITION_ID = "partition-id"


@dataclass
class LocalTraining:
    """One round's instructions for the silo's own training loop, and its stopwatch.

    Parameters
    ----------
    batch_size : int
        B_i, this silo's batch size for the round.
    local_steps : int
        tau: run exactly this many steps (the same for every silo).
    lr : float
        eta (the same for every silo).
    server_round : int
        The round number.
    seed : int
        A seed derived from the silo id and the round, for reproducible reshuffling.
    """

    batch_size: int
    local_steps: int
    lr: float
    server_round: int
    seed: int
    _compute_time: float | None = field(default=None, repr=False)

    def batch_sampler(self, num_samples: int) -> ResizableBatchSampler:
        """A ``batch_sampler`` for a torch ``DataLoader``: exactly ``local_steps`` batches
        of ``batch_size`` indices over reshuffled ``range(num_samples)`` (seeded)."""
        return ResizableBatchSampler(
            num_samples,
            batch_size=self.batch_size,
            num_batches=self.local_steps,
            generator=torch.Generator().manual_seed(self.seed),
        )

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Time the block as the round's compute (several blocks add up); without it
        the adapter times the whole train function, loading included."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._compute_time = (self._compute_time or 0.0) + time.perf_counter() - start

    @property
    def compute_time(self) -> float | None:
        """Seconds measured by :meth:`timed` so far (``None``: not used)."""
        return self._compute_time


TrainFunction = Callable[[Message, Context, LocalTraining], Message]
"""A Message-API train function that also takes the round's :class:`LocalTraining`."""


def _seed(*parts: object) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def _silo_id(context: Context, keys: RecordKeys) -> str:
    """node_config ``silo-id``, else ``partition-id``, else the node id."""
    value = context.node_config.get(keys.silo_id, context.node_config.get(_PARTITION_ID))
    return str(context.node_id if value is None else value)


def _slowdown(context: Context, server_round: int) -> float:
    """The emulated slowdown k: node_config ``slowdown``, else this partition's entry of
    run_config ``slowdowns``, else 1 (no emulation)."""
    value = context.node_config.get(SLOWDOWN_KEY)
    if value is None:
        listed = [s for s in str(context.run_config.get(SLOWDOWNS_KEY, "")).split(";") if s]
        partition = int(context.node_config.get(_PARTITION_ID, 0))
        value = listed[partition] if partition < len(listed) else 1.0
    return SlowdownSchedule.parse(value).factor(server_round)


def lbbsp_train(
    *,
    keys: RecordKeys | None = None,
    configrecord_key: str = "config",
    cost_model: str | None = None,
    emulate_wait: bool = True,
) -> Callable[[TrainFunction], Callable[[Message, Context], Message]]:
    """Decorate a Message-API train function so that it runs as an LB-BSP silo.

    Parameters
    ----------
    keys : RecordKeys | None (default: None)
        Record key names, the same as the strategy's; ``None``: the defaults.
    configrecord_key : str (default: "config")
        Key of the train message's ConfigRecord, the strategy's ``configrecord_key``.
    cost_model : str | None (default: None)
        Emulated step time ``"m,b"`` of the fastest silo (see
        :class:`~fl_lbbsp.clients.emulation.CostModel`): the silo reports
        ``tau * k * (m * B + b)`` instead of its measured time times k. ``None``: the run
        config's ``cost-model`` if set, else measured times.
    emulate_wait : bool (default: True)
        An emulated silo (node_config ``slowdown``, run_config ``slowdowns`` or a cost
        model) waits until its reported time has passed; ``False`` reports it at once.

    Returns
    -------
    Callable
        A decorator; the decorated function has Flower's ``(msg, context) -> Message``
        signature and goes under ``@app.train()``.

    Raises
    ------
    pydantic.ValidationError
        (in the silo, as an error reply) when the message's ``batch-size``,
        ``local-steps`` or ``lr`` is missing or not positive.
    ValueError
        (in the silo, as an error reply) when the function's reply has no single
        MetricRecord or that record has no ``num-examples``.
    """
    names = keys or RecordKeys()
    fixed_cost = None if cost_model is None else CostModel.parse(cost_model)

    def decorate(function: TrainFunction) -> Callable[[Message, Context], Message]:
        @functools.wraps(function)
        def train(msg: Message, context: Context) -> Message:
            config = msg.content.config_records.get(configrecord_key, ConfigRecord())
            server_round = int(config.get(names.server_round, 1))  # type: ignore[arg-type]
            instructions = TrainerConfig(
                batch_size=_int(config.get(names.batch_size)),
                local_steps=_int(config.get(names.local_steps)),
                lr=config.get(names.lr),  # type: ignore[arg-type]
                server_round=server_round,
            )
            silo_id = _silo_id(context, names)
            plan = LocalTraining(
                batch_size=instructions.batch_size,
                local_steps=instructions.local_steps,
                lr=instructions.lr,
                server_round=server_round,
                seed=_seed(silo_id, server_round),
            )
            machine_usage()  # start psutil's CPU window
            started = time.perf_counter()
            reply = function(msg, context, plan)
            measured = plan.compute_time
            if measured is None:
                measured = time.perf_counter() - started
            cpu, memory = machine_usage()
            if reply.has_error():
                return reply
            text = str(context.run_config.get(COST_MODEL_KEY, "") or "")
            cost = fixed_cost or (CostModel.parse(text) if text else None)
            reported = emulated_time(
                measured,
                _slowdown(context, server_round),
                cost=cost,
                batch_size=plan.batch_size,
                local_steps=plan.local_steps,
                wait=emulate_wait,
            )
            records = reply.content.metric_records
            if len(records) != 1:
                raise ValueError(
                    f"the train function's reply holds {len(records)} MetricRecords; "
                    f"LB-BSP needs exactly one, with {names.num_examples!r}"
                )
            name, metrics = next(iter(records.items()))
            if names.num_examples not in metrics:
                raise ValueError(
                    f"the train function's MetricRecord has no {names.num_examples!r} "
                    "(the local dataset size, the aggregation weight)"
                )
            added: dict[str, int | float] = {
                names.train_time: reported,
                names.batch_size: plan.batch_size,
                names.samples_processed: plan.batch_size * plan.local_steps,
                names.cpu_percent: cpu,
                names.memory_percent: memory,
            }
            cap = context.node_config.get(names.max_batch_size)
            if cap is not None:
                added[names.max_batch_size] = int(cap)
            reply.content[name] = MetricRecord({**dict(metrics), **added})
            reply.content[names.silo_record] = ConfigRecord({names.silo_id: silo_id})
            return reply

        return train

    return decorate


def _int(value: object) -> int:
    """A config value as an int (whole floats too); anything else is left to pydantic."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value  # type: ignore[return-value]
