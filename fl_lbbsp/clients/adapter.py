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

What the function really draws through ``plan.batch_sampler`` is counted: when it is not
``local_steps`` batches of ``batch_size`` (its own loader, extra epochs, another batch
size) the reply's ``silo`` record says so in ``misuse``, ``samples-drawn`` reports what
was drawn, and the server does not take the silo's time as a measure of its speed.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Mapping

from flwr.app import ConfigRecord, Context, Message, MetricRecord
from pydantic import ValidationError

from ..contract import DECORATOR_USAGE, RecordKeys
from ..instruction import RoundInstruction, silo_id_of
from .emulated import (
    SLOWDOWN_KEY,
    SLOWDOWNS_KEY,
    Emulation,
    run_emulated_round,
    slowdown_schedule,
)
from .emulation import CostModel, SlowdownSchedule
from .round import LocalTraining, WorkDone, run_round

__all__ = [
    "COST_MODEL_KEY",
    "SEED_KEY",
    "SLOWDOWNS_KEY",
    "SLOWDOWN_KEY",
    "LocalTraining",
    "TrainFunction",
    "lbbsp_train",
]

COST_MODEL_KEY = "cost-model"
"""node_config or run_config entry: emulated step time ``"m,b"`` of the fastest silo
(``""``: measured)."""
SEED_KEY = "seed"
"""run_config entry: the run's seed; with the silo id and the round it seeds the plan
(``0`` when the run sets none)."""

TrainFunction = Callable[[Message, Context, LocalTraining], Message]
"""A Message-API train function that also takes the round's :class:`LocalTraining`."""

USAGE = DECORATOR_USAGE
"""How the decorator is used, named by every TypeError it raises."""
_MARK = "__lbbsp_train__"


class _ErrorReplyError(Exception):
    """The user's function replied with an error: the reply goes back as it is."""

    def __init__(self, reply: Message) -> None:
        super().__init__("the train function replied with an error")
        self.reply = reply


def lbbsp_train(
    function: object = None,
    /,
    *,
    keys: RecordKeys | Mapping[str, str] | None = None,
    configrecord_key: str = "config",
    cost_model: str | None = None,
    slowdowns: str | None = None,
    emulate_wait: bool = True,
) -> Callable[[TrainFunction], Callable[[Message, Context], Message]]:
    """Decorate a Message-API train function so that it runs as an LB-BSP silo.

    Parameters
    ----------
    function : None
        Must not be given: ``@lbbsp_train`` without parentheses is a TypeError.
    keys : RecordKeys | Mapping[str, str] | None (default: None)
        Record key names, the same as the strategy's (a mapping of RecordKeys fields is
        converted); ``None``: the defaults.
    configrecord_key : str (default: "config")
        Key of the train message's ConfigRecord, the strategy's ``configrecord_key``.
    cost_model : str | None (default: None)
        Emulated step time ``"m,b"`` of the fastest silo (see
        :class:`~fl_lbbsp.clients.emulation.CostModel`): the silo reports
        ``tau * k * (m * B + b)`` instead of its measured time times k. ``None``: the node
        config's ``cost-model``, else the run config's, if set, else measured times.
    slowdowns : str | None (default: None)
        Emulated slowdowns per partition, ``"1;2;4"`` (the silo of ``partition-id`` p
        takes entry p): the same as run_config ``slowdowns``, without declaring it in the
        app's pyproject.toml (Flower refuses a ``--run-config`` key the app does not
        declare). A node_config ``slowdown`` wins; ``None``: the run config's, if set.
    emulate_wait : bool (default: True)
        An emulated silo (node_config ``slowdown``, run_config ``slowdowns`` or a cost
        model) waits until its reported time has passed; ``False`` reports it at once,
        sooner than any real silo could: give the strategy ``check_times=False`` then, or
        on Flower's grids it replaces each such time by the shorter one it observed.

    Returns
    -------
    Callable
        A decorator; the decorated function has Flower's ``(msg, context) -> Message``
        signature and goes under ``@app.train()``.

    Raises
    ------
    TypeError
        (when decorating) ``@lbbsp_train`` used without parentheses, ``keys`` neither a
        RecordKeys nor a mapping of its fields, a function that takes no ``plan`` (two
        parameters), one already decorated, or ``@lbbsp_train()`` written above
        ``@app.train()`` (Flower would then call the undecorated function).
    fl_lbbsp.instruction.InstructionError
        (in the silo, as an error reply) when the message's ``batch-size``,
        ``local-steps`` or ``lr`` is missing, not a number or not positive.
    ValueError
        (when decorating) a ``slowdowns`` entry that does not parse.
    ValueError
        (in the silo, as an error reply) when the function's reply has no single
        MetricRecord or that record has no ``num-examples``.
    TypeError
        (in the silo, as an error reply) when the function returns no Message.
    """
    if function is not None:
        raise TypeError(
            "@lbbsp_train needs parentheses: write '@lbbsp_train()' (options go inside); " + USAGE
        )
    names = _record_keys(keys)
    fixed_cost = None if cost_model is None else CostModel.parse(cost_model)
    listed = () if slowdowns is None else tuple(s for s in slowdowns.split(";") if s)
    for entry in listed:
        SlowdownSchedule.parse(entry)  # a bad entry fails here, not in every silo

    def decorate(function: TrainFunction) -> Callable[[Message, Context], Message]:
        _check_function(function)

        @functools.wraps(function)
        def train(msg: Message, context: Context) -> Message:
            config = msg.content.config_records.get(configrecord_key, ConfigRecord())
            instruction = RoundInstruction.from_config(config, names)
            silo_id = silo_id_of(context.node_config, names, node_id=context.node_id)
            emulation = _emulation(
                context, instruction.server_round, listed, fixed_cost, wait=emulate_wait
            )

            def work(plan: LocalTraining) -> WorkDone[tuple[Message, str, MetricRecord]]:
                reply = function(msg, context, plan)
                if not isinstance(reply, Message):
                    raise TypeError(
                        f"the train function returned {type(reply).__name__}, not a Message: "
                        "return Message(content=RecordDict(...), reply_to=msg)"
                    )
                if reply.has_error():
                    raise _ErrorReplyError(reply)
                return WorkDone(output=(reply, *_user_metrics(reply, names)))

            cap = context.node_config.get(names.max_batch_size)
            seed = context.run_config.get(SEED_KEY, 0)
            most = None if cap is None else int(cap)
            try:
                if emulation is None:
                    report = run_round(
                        instruction, work, silo_id=silo_id, run_seed=seed, keys=names,
                        max_batch_size=most,
                    )  # fmt: skip
                else:
                    report = run_emulated_round(
                        instruction, work, emulation=emulation, silo_id=silo_id,
                        run_seed=seed, keys=names, max_batch_size=most,
                    )  # fmt: skip
            except _ErrorReplyError as err:
                return err.reply
            reply, name, metrics = report.output
            reply.content[name] = MetricRecord({**dict(metrics), **report.metrics})
            reply.content[names.silo_record] = ConfigRecord(
                {names.silo_id: silo_id, **report.notes}
            )
            return reply

        setattr(train, _MARK, True)
        return train

    return decorate


def _emulation(
    context: Context,
    server_round: int,
    listed: tuple[str, ...],
    cost: CostModel | None,
    *,
    wait: bool,
) -> Emulation | None:
    """The round's emulation from the decorator's options, the node config and the run
    config (in that order of precedence for the cost model; for the slowdown the node's
    own ``slowdown``, then ``listed``, then run_config ``slowdowns``); ``None``: none
    asked for (the plain round)."""
    if cost is None:
        text = str(
            context.node_config.get(COST_MODEL_KEY)
            or context.run_config.get(COST_MODEL_KEY, "")
            or ""
        )
        cost = CostModel.parse(text) if text else None
    schedule = slowdown_schedule(context.node_config, listed=listed, run_config=context.run_config)
    factor = schedule.factor(server_round)
    # a silo of k = 1 in a run that emulates slowdowns is emulated too (k = 1: no wait),
    # so that it measures its compute as the others do (one intra-op thread)
    asked = bool(
        listed
        or context.node_config.get(SLOWDOWN_KEY) is not None
        or str(context.run_config.get(SLOWDOWNS_KEY, "") or "").strip()
    )
    if cost is None and not asked and list(schedule.steps.values()) == [1.0]:
        return None
    return Emulation(factor=factor, cost=cost, wait=wait)


def _record_keys(keys: object) -> RecordKeys:
    """``keys`` as RecordKeys (:meth:`RecordKeys.of`); every mistake a TypeError."""
    try:
        return RecordKeys.of(keys, owner="lbbsp_train(keys=...)")
    except ValidationError as err:  # an unknown field, a name that is not a string
        reasons = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise TypeError(
            "lbbsp_train(keys=...) takes a fl_lbbsp.contract.RecordKeys, e.g. "
            "keys=RecordKeys(batch_size='bs'), or a mapping of its field names "
            f"(batch_size, local_steps, lr, ...) to record keys: {reasons}"
        ) from None


def _check_function(function: object) -> None:
    """Raise TypeError, naming the fix, unless ``function`` can be decorated."""
    if not callable(function):
        raise TypeError(f"@lbbsp_train() decorates a function, not {type(function).__name__}")
    name = getattr(function, "__name__", "the train function")
    if getattr(function, _MARK, False):
        raise TypeError(f"{name} is already decorated with @lbbsp_train(); {USAGE}")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: let it run
        return
    try:
        signature.bind(None, None, None)
    except TypeError:
        params = ", ".join(signature.parameters)
        raise TypeError(
            f"{name}({params}) takes no 'plan': add a third parameter, 'plan: LocalTraining', "
            "and draw the batches with plan.batch_sampler(n); " + USAGE
        ) from None
    if _decorated_above_flower(function):
        raise TypeError(
            f"@lbbsp_train() is written above @app.train() on {name}: Flower would call the "
            f"undecorated function without 'plan'; swap the two lines: {USAGE}"
        )


def _decorated_above_flower(function: object) -> bool:
    """Whether the function's source lists ``@lbbsp_train(...)`` above ``@<app>.train(...)``
    (decorators apply bottom-up, so Flower registered the undecorated function). False
    when the source is not available."""
    try:
        source = textwrap.dedent(inspect.getsource(function))  # type: ignore[arg-type]
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return False
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    order = [_decorator_name(d) for d in node.decorator_list]
    if "lbbsp_train" not in order or "train" not in order:
        return False
    return order.index("lbbsp_train") < order.index("train")


def _decorator_name(decorator: ast.expr) -> str | None:
    """``lbbsp_train`` for ``@lbbsp_train(...)`` (or ``@x.lbbsp_train(...)``), ``train``
    for ``@app.train(...)``, else None."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Name):
        return "lbbsp_train" if target.id == "lbbsp_train" else None
    if isinstance(target, ast.Attribute):
        return target.attr if target.attr in ("lbbsp_train", "train") else None
    return None


def _user_metrics(reply: Message, keys: RecordKeys) -> tuple[str, MetricRecord]:
    """The reply's one MetricRecord and its name.

    Raises
    ------
    ValueError
        The reply holds no or several MetricRecords, or its record has no
        ``num-examples``.
    """
    records = reply.content.metric_records
    if len(records) != 1:
        raise ValueError(
            f"the train function's reply holds {len(records)} MetricRecords; "
            f"LB-BSP needs exactly one, with {keys.num_examples!r}"
        )
    name, metrics = next(iter(records.items()))
    if keys.num_examples not in metrics:
        raise ValueError(
            f"the train function's MetricRecord has no {keys.num_examples!r} "
            "(the local dataset size, the aggregation weight)"
        )
    return name, metrics
