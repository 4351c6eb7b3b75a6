"""The server-silo contract: record keys shared by the strategy and the silo trainer.

Keys are kebab-case, like Flower's ``weighted_by_key="num-examples"``, and every one can be
renamed through the strategy's and the trainer's constructor parameters (shared/DESIGN.md,
"The contract between server and silo").
"""

from __future__ import annotations

import math
import re
from collections.abc import Container, Mapping

from pydantic import BaseModel, ConfigDict

__all__ = [
    "BUSY_TIME",
    "DECORATOR_USAGE",
    "STALE_SUPERLINK",
    "COMPUTE_END",
    "COMPUTE_START",
    "COMPUTE_TIME",
    "EVAL_ACCURACY",
    "EVAL_LOSS",
    "SILO_APP_METRICS",
    "SLOWDOWN",
    "PREDICTED_SPEED",
    "SAMPLES_DRAWN",
    "STARTUP_TIME",
    "TRAIN_LOSS",
    "WARM_WORKER",
    "ENCRYPTED_HEADER",
    "LAST_MODEL",
    "ACCEPTED_NORMS",
    "MODEL_REFUSED",
    "HE_CHECK",
    "NAMED_SILO",
    "REFUSED_ROUND",
    "INITIAL_MODEL",
    "UPDATE_PREFIX",
    "STEP_BATCH_SIZE",
    "OUT_OF_MEMORY",
    "SILO_ID_PATTERN",
    "BatchSizeOutOfMemoryError",
    "InvalidReplyError",
    "error_summary",
    "few",
    "RecordKeys",
    "is_out_of_memory",
    "out_of_memory_batch_size",
    "read_float",
    "read_int",
    "silo_metric",
    "is_encrypted",
]

_MISSING = object()

INITIAL_MODEL = "initial-model"
"""Encrypted cluster mode: the ArrayRecord of the plaintext initial model in a message to a
worker without a model replica."""

UPDATE_PREFIX = "aggregate-"
"""Encrypted cluster mode: aggregate ``v`` travels as the ArrayRecord ``aggregate-<v>``."""

ENCRYPTED_HEADER = "ckks-header"
"""ArrayRecord entry that marks an encrypted update (its plaintext header: weight, length,
key fingerprint, layout, digests). Checking for it needs no TenSEAL, so a plaintext run
never imports :mod:`fl_lbbsp.crypto`."""


def read_float(record: Mapping[str, object], key: str, default: object = _MISSING) -> float:
    """A finite number from a received record (a ConfigRecord's or MetricRecord's entry).

    Raises
    ------
    KeyError
        ``key`` is missing and no ``default`` is given.
    ValueError
        The entry is not a finite number (a bool, a list or a string is not).
    """
    value = record.get(key, default)
    if value is _MISSING:
        raise KeyError(f"{key!r} missing from the record")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r:.60}")
    return float(value)


def read_int(record: Mapping[str, object], key: str, default: object = _MISSING) -> int:
    """A whole number from a received record (``16`` or ``16.0``), as :func:`read_float`."""
    number = read_float(record, key, default)
    if not number.is_integer():
        raise ValueError(f"{key} must be a whole number, got {number!r}")
    return int(number)


def is_encrypted(record: Container[str]) -> bool:
    """Whether an ArrayRecord holds an encrypted update rather than plaintext arrays."""
    return ENCRYPTED_HEADER in record


DECORATOR_USAGE = (
    "decorate it as '@app.train()' then '@lbbsp_train()' on the next line, over "
    "'def train(msg: Message, context: Context, plan: LocalTraining) -> Message'"
)
"""How the silo decorator :func:`~fl_lbbsp.clients.lbbsp_train` is used: named by every
TypeError it raises, and by the server when a silo's train function was not decorated."""
STALE_SUPERLINK = (
    "no silo id, train-time, batch-size: train is not decorated with @lbbsp_train() "
    "under @app.train(), or, if it is, a stale local SuperLink (the `flower-superlink "
    "--simulation` an earlier `flwr run` left) runs an older app of that name: stop it "
    "(`pgrep -af flower-superlink`, `kill <pid>`), run again"
)
"""Why a reply was rejected when no reply of its round carries the silo id and the
decorator's metrics: the app is not decorated, or the decorated app is not the one that
ran (fits the 300 characters a rejection keeps)."""

COMPUTE_TIME = "compute-time"
"""Metric of the shipped silo apps: the real, unemulated seconds of compute."""
COMPUTE_START = "compute-start"
"""Metric of every silo round: when its compute began, in seconds since the epoch on the
silo's own clock (an emulated round: when the silo got its instruction)."""
COMPUTE_END = "compute-end"
"""Metric of every silo round: when its compute ended, on the silo's clock (an emulated
round: after its emulated wait). ``compute-end - compute-start`` is the reply's own
interval, which the server checks the claimed ``train-time`` against (queueing before
the silo ran, in a pool of fewer actors than silos, is not in it)."""
BUSY_TIME = "busy-time"
"""Metric of the shipped silo apps: real seconds in the ClientApp for the round."""
STARTUP_TIME = "startup-time"
"""Metric of the shipped silo apps: seconds from the ClientApp's start to training."""
SLOWDOWN = "slowdown"
"""Metric of the shipped silo apps: the emulated slowdown factor k."""
TRAIN_LOSS = "train-loss"
"""Metric of the shipped silo apps: the mean training loss of the round."""
EVAL_LOSS = "eval-loss"
"""Evaluation metric: the loss on the silo's test split."""
EVAL_ACCURACY = "eval-acc"
"""Evaluation metric: the accuracy on the silo's test split."""
SAMPLES_DRAWN = "samples-drawn"
"""Default name of :attr:`RecordKeys.samples_drawn`, listed in :data:`SILO_APP_METRICS` so
that a server whose validator predates the key accepts it."""
WARM_WORKER = "warm-worker"
"""Metric of the quickstart silo: 1 when its warm worker trained, 0 when the ClientApp
process did (:mod:`fl_lbbsp.clients.warm`)."""
SILO_APP_METRICS: tuple[str, ...] = (
    COMPUTE_TIME,
    COMPUTE_START,
    COMPUTE_END,
    BUSY_TIME,
    STARTUP_TIME,
    SLOWDOWN,
    TRAIN_LOSS,
    WARM_WORKER,
    SAMPLES_DRAWN,
)
"""Metrics beyond the contract's that the shipped silo and worker apps send."""

MODEL_REFUSED = "model-refused"
"""Entry of a silo's reply ConfigRecord (``silo``): why it refused the global model it was
sent (NaN or inf, a norm far from its last model's) and trained from its last model."""
HE_CHECK = "he-check"
"""Encrypted mode, finding the silo behind a refused aggregate: the ArrayRecords of a train
message that ask the silo to check other silos' contributions (``he-check-0``, ...: one
contribution each), and the entry of the silo's encrypted update (so it is signed with it)
that answers them (:mod:`fl_lbbsp.crypto.blame`)."""
NAMED_SILO = "named"
"""Metric of a round in Flower's ``Result``, encrypted mode: ``named/<silo>`` is the round
whose aggregate that silo's contribution spoiled; it was named in this round and left out."""
REFUSED_ROUND = "lbbsp-refused-round"
"""ConfigRecord of a silo's Context state, encrypted mode: ``round``, the last round it
refused the global model in; it answers check requests only in the round after."""
LAST_MODEL = "lbbsp-last-model"
"""ArrayRecord of a silo's Context state: its model after its last round of training."""
ACCEPTED_NORMS = "lbbsp-accepted-norms"
"""ConfigRecord of a silo's Context state: ``norms``, the L2 norms of the last global
models it accepted (a server's rollback sends one of them again)."""

OUT_OF_MEMORY = "lbbsp: out of memory at batch size"
"""How a silo's error reply says its batch size did not fit its memory: this text and the
batch size (:class:`BatchSizeOutOfMemoryError`). Flower carries an exception to the server
only as an error reply's text, so the server reads it back with
:func:`out_of_memory_batch_size`."""

_OUT_OF_MEMORY = re.compile(re.escape(OUT_OF_MEMORY) + r" (\d+)")


class BatchSizeOutOfMemoryError(MemoryError):
    """A silo ran out of memory at the batch size it was sent.

    Raised in the silo (the round's work raised ``MemoryError`` or torch's
    ``OutOfMemoryError``); Flower turns it into an error reply whose text starts with
    :data:`OUT_OF_MEMORY` and the batch size, from which the server learns a cap for the
    silo (:class:`~fl_lbbsp.core.round.memory_caps.MemoryCaps`) instead of sending the size again.

    Parameters
    ----------
    batch_size : int
        The batch size that did not fit.
    cause : BaseException
        The memory error the work raised.
    """

    def __init__(self, *, batch_size: int, cause: BaseException) -> None:
        self.batch_size = int(batch_size)
        super().__init__(
            f"{OUT_OF_MEMORY} {self.batch_size} ({type(cause).__name__}: {cause}); the server "
            "caps this silo's batch size below it from the next round"
        )


def out_of_memory_batch_size(reason: str) -> int | None:
    """The batch size an error reply's ``reason`` says did not fit the silo's memory
    (:class:`BatchSizeOutOfMemoryError`); ``None``: the reply says no such thing."""
    found = _OUT_OF_MEMORY.search(reason)
    return int(found.group(1)) if found else None


SILO_ID_PATTERN = r"[A-Za-z0-9_.-]{1,128}"
"""What a silo id (``silo-id``) may be: 1 to 128 of ``A-Z a-z 0-9 _ . -`` (safe in a file
name, a log line and a telemetry record)."""


class InvalidReplyError(ValueError):
    """A train reply that must be left out of the round; the message is the reason."""


# An exception line of a traceback: "ImportError: message" or "pkg.mod.SomeError: message".
_EXCEPTION_LINE = re.compile(
    r"^\s*((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)))"
    r"(?:: (.*))?$"
)
# Exceptions that runtimes wrap a ClientApp's own exception in: never the cause.
_WRAPPERS = frozenset({"ClientAppException", "RayTaskError", "RayActorError"})
_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>$", re.DOTALL)
MAX_SUMMARY = 300


def few(names: list[str]) -> str:
    """Names for one line: the first 5 quoted, then how many more (``'a', 'b' and 3 more``)."""
    shown = ", ".join(repr(n) for n in names[:5])
    return shown if len(names) <= 5 else f"{shown} and {len(names) - 5} more"


def error_summary(reason: str) -> str:
    """One line for an error a silo sent back: ``"ExceptionType: message"``.

    Runtimes wrap a ClientApp's exception in their own and in whole tracebacks (Ray's
    ``ClientAppException`` carries the actor's traceback, Flower's simulation prints it as
    ``<class '...'>:<'...'>``). The summary is the last exception line of the text that is
    not such a wrapper, i.e. the exception the silo's code raised; failing that, the
    wrapper's message, else the first non-empty line; at most 300 characters.

    Parameters
    ----------
    reason : str
        The error reply's reason, or any exception text.
    """
    text = reason.strip()
    wrapped = _FLOWER_REASON.match(text)
    if wrapped is not None:
        name, text = wrapped.group(1), wrapped.group(2).strip()
        if name not in _WRAPPERS and "\n" not in text:
            return f"{name}: {text}"[:MAX_SUMMARY]
    found = None
    for line in text.splitlines():
        match = _EXCEPTION_LINE.match(line)
        if match is not None and match.group(2) not in _WRAPPERS and match.group(3):
            found = f"{match.group(2)}: {match.group(3).strip()}"
    if found is None:
        marker = re.search(r"occurred\. Message: (.+)", text)  # Flower's ClientAppException
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        found = marker.group(1).strip() if marker else (lines[0] if lines else "no reason given")
    return found[:MAX_SUMMARY]


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a memory failure: ``MemoryError`` (host memory), torch's
    ``OutOfMemoryError`` (a GPU's, any torch version), or a ``RuntimeError`` saying "out of
    memory" (older torch, MPS); checked without importing torch."""
    if isinstance(error, MemoryError):
        return True
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


STEP_BATCH_SIZE = "step-batch-size"
"""Telemetry field of the ``lbbsp-tau`` baseline: the batch size a silo used per step,
where ``batch-size`` holds its equivalent share of the round's work."""


class RecordKeys(BaseModel):
    """Names of the ConfigRecord / MetricRecord entries exchanged each round.

    Parameters
    ----------
    batch_size : str (default: "batch-size")
        Config: the silo's batch size B_i. Metric: the batch size actually used.
    local_steps : str (default: "local-steps")
        Config: local steps tau, the same for all silos.
    lr : str (default: "lr")
        Config: learning rate eta, the same for all silos.
    server_round : str (default: "server-round")
        Config: the round number.
    num_examples : str (default: "num-examples")
        Metric: the silo's local dataset size, the FL aggregation weight.
    train_time : str (default: "train-time")
        Metric: seconds of compute for the tau steps (emulated when a slowdown is set).
    samples_processed : str (default: "samples-processed")
        Metric: samples processed in the round (B_i * tau).
    cpu_percent : str (default: "cpu-percent")
        Metric: CPU utilisation during training (psutil).
    memory_percent : str (default: "memory-percent")
        Metric: memory utilisation (psutil).
    max_batch_size : str (default: "max-batch-size")
        Metric: the silo's memory cap x_o; 0 when unknown.
    silo_id : str (default: "silo-id")
        Reply ConfigRecord (and node_config): the silo's stable id.
    silo_record : str (default: "silo")
        Key of the reply's ConfigRecord that carries the silo id.
    signature : str (default: "signature")
        Reply ConfigRecord (``silo_record``): the silo's Ed25519 signature of the reply
        (:mod:`fl_lbbsp.security.identity`), checked when the server has a silo registry.
    he_time : str (default: "he-time")
        Metric: seconds spent decrypting the global model and encrypting the update
        (encrypted mode), apart from ``train-time``; the linear allocator's fixed cost.
    model_version : str (default: "model-version")
        Encrypted cluster mode. Config: the model version (number of aggregated
        gradients applied) the worker must bring its replica to. Metric: the version its
        gradient (or evaluation) was computed at.
    momentum : str (default: "momentum")
        Config (encrypted cluster mode): the SGD momentum the workers apply.
    batch_offset : str (default: "batch-offset")
        Config (cluster mode): where the worker's samples start in the round's global
        batch.
    samples_drawn : str (default: "samples-drawn")
        Metric: samples the silo's training drew through the batch sampler LB-BSP handed
        it (``LocalTraining.batch_sampler``); 0 when it drew none (it used its own
        loader). ``samples_processed`` equals it whenever it is not 0.
    misuse : str (default: "misuse")
        Reply ConfigRecord (``silo_record``): present when the silo's training did not
        draw what it was told (no batch through the sampler, another number of batches
        or another batch size); one line saying what was drawn, what was instructed and
        the fix. Its ``train-time`` then does not measure B_i x tau samples.

    Every name must be a non-empty string.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", str_min_length=1)

    batch_size: str = "batch-size"
    local_steps: str = "local-steps"
    lr: str = "lr"
    server_round: str = "server-round"
    num_examples: str = "num-examples"
    train_time: str = "train-time"
    samples_processed: str = "samples-processed"
    cpu_percent: str = "cpu-percent"
    memory_percent: str = "memory-percent"
    max_batch_size: str = "max-batch-size"
    silo_id: str = "silo-id"
    silo_record: str = "silo"
    signature: str = "signature"
    he_time: str = "he-time"
    model_version: str = "model-version"
    momentum: str = "momentum"
    batch_offset: str = "batch-offset"
    samples_drawn: str = SAMPLES_DRAWN
    misuse: str = "misuse"

    @classmethod
    def of(cls, keys: object, *, owner: str) -> RecordKeys:
        """``keys`` as RecordKeys: ``None`` the defaults, a RecordKeys itself, a mapping of
        its field names to names (``{"batch_size": "bs"}``) converted.

        Raises
        ------
        TypeError
            ``keys`` is none of these; the message starts with ``owner``
            (``"lbbsp_train(keys=...)"``) and shows the fix.
        pydantic.ValidationError
            The mapping names a field RecordKeys does not have, or a name is empty.
        """
        if keys is None:
            return cls()
        if isinstance(keys, RecordKeys):
            return keys
        if isinstance(keys, Mapping):
            return cls(**{str(k): v for k, v in keys.items()})
        raise TypeError(
            f"{owner} takes a fl_lbbsp.contract.RecordKeys, e.g. "
            "keys=RecordKeys(batch_size='bs'), or a mapping of its field names to record "
            f"keys, not {type(keys).__name__}"
        )


PREDICTED_SPEED = "predicted-speed"
"""The balancer's predicted speed of a silo (samples per second) after a round: a field of
the round's telemetry record and, per silo, of the round's metrics in Flower's Result."""


DISTRUSTED = "distrusted"
"""The silos whose updates the trusted clip left out of a round's aggregate, their history
of agreement with the others' centre being a negative outlier of the federation's
(:class:`fl_lbbsp.core.trusted_clip.TrustedClip`): a field of the round's telemetry
record."""


CLIPPED = "clipped"
"""How many of a round's updates the robust aggregation shortened to its radius (0: the
round's result is FedAvg's mean of the updates it kept): a field of the round's telemetry
record."""


TRANSFER_TIME = "transfer-time"
"""A silo's learned per-round transfer time beyond the smallest silo's (seconds; waited
minus claimed time, robustly: :class:`fl_lbbsp.core.silo.transfer.TransferTimes`), the fixed
cost the allocation adds to its cost line: a field of the round's telemetry record."""


WAITED_TIME = "waited-time"
"""Seconds the server waited for a silo's reply, from sending its instruction to receiving
the reply (its compute, its start-up, its transfers, the messaging): a field of the
round's telemetry record, and what the silo's transfer time is learned from."""


WALL_CLOCK_TIME = "wall-clock-time"
"""Seconds a run's train rounds took (each its wall time, or its slowest silo's reported
round where that is longer: emulated times not waited out): a field of the last round's
train metrics in Flower's Result."""

EQUAL_SPLIT_TIME = "equal-split-time"
"""Seconds the equal split (FedAvg) would have needed for the same rounds, predicted from the
silos' cost curves (:func:`fl_lbbsp.core.round.equal_split.equal_split_time`): a field of the last
round's train metrics in Flower's Result."""


def silo_metric(key: str, silo: str) -> str:
    """The name of one silo's entry in a round's MetricRecord: ``"batch-size/hospital-a"``."""
    return f"{key}/{silo}"
