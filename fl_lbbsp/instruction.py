"""One round's instruction to a silo, as the server writes it into a train message's
ConfigRecord and the silo reads it back; the silo's identity and its round seed.

The server (:meth:`RoundInstruction.to_config`) and every silo entry point
(:meth:`RoundInstruction.from_config`) share this module, so the record's keys are
handled in one place. It imports pydantic and Flower's record types only (no torch), so a
light ClientApp process can use it too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar

from flwr.app import ConfigRecord
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .contract import RecordKeys, read_float, read_int

__all__ = ["InstructionError", "RoundInstruction", "round_seed", "silo_id_of"]

PARTITION_ID = "partition-id"
"""node_config entry: the silo's data partition (Flower's simulation sets it)."""


class InstructionError(ValueError):
    """A train message's ConfigRecord does not hold a valid round instruction: an entry is
    missing, not a number, or out of range. The message names the record key and the
    :class:`~fl_lbbsp.contract.RecordKeys` field."""


class RoundInstruction(BaseModel):
    """What the server tells one silo to do in one round.

    Parameters
    ----------
    batch_size : int
        B_i, the silo's batch size (positive).
    local_steps : int
        tau, the local steps (positive; 1 in cluster mode).
    lr : float
        eta, the learning rate (positive, finite).
    server_round : int (default: 1)
        The round number (>= 0).
    batch_offset : int | None (default: None)
        Cluster mode: where the worker's samples start in the round's global batch.

    Raises
    ------
    pydantic.ValidationError
        (a ValueError) on a value out of range, naming the field.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    batch_size: int = Field(gt=0, strict=True)
    local_steps: int = Field(gt=0, strict=True)
    lr: float = Field(gt=0, allow_inf_nan=False)
    server_round: int = Field(default=1, ge=0, strict=True)
    batch_offset: int | None = Field(default=None, ge=0, strict=True)

    _REQUIRED: ClassVar[tuple[str, ...]] = ("batch_size", "local_steps", "lr")
    _WHOLE: ClassVar[frozenset[str]] = frozenset(
        {"batch_size", "local_steps", "server_round", "batch_offset"}
    )

    @property
    def samples(self) -> int:
        """Samples the round processes: ``batch_size * local_steps``."""
        return self.batch_size * self.local_steps

    def to_config(
        self, keys: RecordKeys | None = None, *, base: Mapping[str, Any] | None = None
    ) -> ConfigRecord:
        """The instruction as a train message's ConfigRecord.

        Parameters
        ----------
        keys : RecordKeys | None (default: None)
            Record key names; ``None``: the defaults.
        base : Mapping | None (default: None)
            Entries to start from (the caller's config, copied); the instruction's
            entries replace theirs. Fields that are ``None`` are left out.
        """
        names = keys or RecordKeys()
        record = ConfigRecord(dict(base or {}))
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                record[getattr(names, name)] = value
        return record

    @classmethod
    def from_config(
        cls, record: Mapping[str, Any], keys: RecordKeys | None = None
    ) -> RoundInstruction:
        """Read the instruction from a train message's ConfigRecord (or a plain mapping).

        Whole numbers may come as floats (``16.0``); ``server-round`` defaults to 1; the
        optional fields are read when present. Other entries are ignored.

        Raises
        ------
        InstructionError
            An entry is missing (``batch-size``, ``local-steps``, ``lr``), not a number
            or out of range; the message names the key and the RecordKeys field.
        """
        names = keys or RecordKeys()
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            key = getattr(names, name)
            if key not in record:
                if name in cls._REQUIRED:
                    raise InstructionError(
                        f"the train message's config has no {key!r} (RecordKeys.{name}): "
                        "send it from an LB-BSP strategy with the same RecordKeys as the silo"
                    )
                continue
            read = read_int if name in cls._WHOLE else read_float
            try:
                values[name] = read(record, key)
            except ValueError as err:
                raise InstructionError(
                    f"the train message's {key!r} (RecordKeys.{name}): {err}"
                ) from None
        try:
            return cls(**values)
        except ValidationError as err:
            first = err.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else "?"
            key = getattr(names, name, name)
            raise InstructionError(
                f"the train message's {key!r} (RecordKeys.{name}) {first['msg'].lower()}, "
                f"got {record.get(key)!r:.40}"
            ) from None


def round_seed(run_seed: object, silo_id: str, server_round: int) -> int:
    """The seed of a silo's reshuffling in one round: the same silo (:func:`silo_id_of`;
    ``"global"`` for cluster mode's shared batch), round and run seed (its text hashed)
    give the same seed in every entry point (simulation, deployment, adapter): a
    non-negative 63-bit integer (a valid ``torch.Generator`` seed)."""
    digest = hashlib.sha256(f"{run_seed}:{silo_id}:{server_round}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def silo_id_of(
    node_config: Mapping[str, Any], keys: RecordKeys | None = None, *, node_id: int | None = None
) -> str:
    """The silo's stable id: node_config ``silo-id``, else ``partition-id``, else the node
    id, else ``"0"``."""
    names = keys or RecordKeys()
    value = node_config.get(names.silo_id, node_config.get(PARTITION_ID))
    if value is None:
        value = 0 if node_id is None else node_id
    return str(value)
