"""Registries of named parts: the speed estimators
(:data:`~fl_lbbsp.core.silo.estimators.ESTIMATORS`) and the allocators
(:data:`~fl_lbbsp.core.allocation.allocators.ALLOCATORS`).

A part is a pydantic model whose fields are its settings and whose class variable ``name``
is its key; adding one is one class and one :meth:`Registry.register`. A name given as a
string (a CLI flag, a run config, a checkpoint) becomes a class in one place,
:meth:`Registry.lookup`, which writes the one message for an unknown name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

__all__ = ["Registry"]

M = TypeVar("M", bound=BaseModel)


class Registry(dict[str, type[M]], Generic[M]):
    """Classes of one kind by their ``name``.

    Parameters
    ----------
    kind : str
        What the classes are, in messages (``"speed estimator"``, ``"allocator"``).
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, cls: type[M]) -> type[M]:
        """Add ``cls`` under its ``name`` (a class decorator)."""
        self[str(vars(cls)["name"])] = cls
        return cls

    @contextmanager
    def registered(self, cls: type[M]) -> Iterator[None]:
        """:meth:`register` ``cls`` for the duration of a ``with`` block."""
        self.register(cls)
        try:
            yield
        finally:
            del self[str(vars(cls)["name"])]

    def lookup(self, name: object) -> type[M]:
        """The class registered as ``name``.

        Raises
        ------
        ValueError
            If none is: the one message for an unknown name (the name cut to 40
            characters, the registered ones listed).
        """
        cls = self.get(name) if isinstance(name, str) else None
        if cls is None:
            raise ValueError(f"unknown {self.kind} {name!r:.40}: must be one of {sorted(self)}")
        return cls

    def build(self, name: object, options: Mapping[str, Any] | None = None) -> M:
        """The part ``name`` with the settings ``options``.

        Raises
        ------
        ValueError
            On an unknown name (:meth:`lookup`) or a bad setting (one line naming it).
        """
        cls = self.lookup(name)
        try:
            return cls(**dict(options or {}))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(
                f"{name} {self.kind}: {where}: {first['msg']} (got {first['input']!r:.60})"
            ) from None
