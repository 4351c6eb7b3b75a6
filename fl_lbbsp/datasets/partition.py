"""Split sample indices across silos with the flwr-datasets partitioners.

The partitioning itself is done by :mod:`flwr_datasets.partitioner`
(``IidPartitioner``, ``PathologicalPartitioner``, ``DirichletPartitioner``) over an in-memory
Hugging Face ``datasets.Dataset`` with a ``label`` and an ``index`` column; this module only
translates a textual :class:`PartitionSpec` into a partitioner and returns numpy index arrays.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

__all__ = ["PartitionSpec", "PartitionText", "partition_indices"]

_ACCEPTED_FORMS = "'iid', 'labels:K' (K a positive integer) or 'dirichlet:ALPHA' (ALPHA > 0)"


class PartitionSpec(BaseModel):
    """How samples are distributed across silos.

    Parameters
    ----------
    kind : {"iid", "labels", "dirichlet"}
        ``"iid"``: uniform random split; ``"labels"``: each silo holds exactly
        ``classes_per_silo`` classes (pathological non-IID); ``"dirichlet"``: per-class
        proportions drawn from ``Dir(alpha)``.
    classes_per_silo : int or None
        Classes per silo, required (and > 0) for ``"labels"``, else None (default: None).
    alpha : float or None
        Dirichlet concentration, required (finite, > 0) for ``"dirichlet"``, else None
        (default: None).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["iid", "labels", "dirichlet"]
    classes_per_silo: int | None = Field(default=None, ge=1)
    alpha: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check_parameters(self) -> PartitionSpec:
        if self.kind == "labels":
            if self.classes_per_silo is None:
                raise ValueError("'labels' needs classes_per_silo >= 1")
        elif self.classes_per_silo is not None:
            raise ValueError(f"classes_per_silo is only valid for 'labels', not {self.kind!r}")
        if self.kind == "dirichlet":
            if self.alpha is None:
                raise ValueError("'dirichlet' needs a finite alpha > 0")
        elif self.alpha is not None:
            raise ValueError(f"alpha is only valid for 'dirichlet', not {self.kind!r}")
        return self

    @classmethod
    def parse(cls, text: str) -> PartitionSpec:
        """Parse ``"iid"``, ``"labels:K"`` or ``"dirichlet:ALPHA"`` (surrounding whitespace
        ignored); ValueError, naming the value, on any other text."""
        raw = text.strip() if isinstance(text, str) else text
        bad = ValueError(f"invalid partition spec {text!r}: expected {_ACCEPTED_FORMS}")
        if not isinstance(raw, str):
            raise bad
        kind, sep, arg = raw.partition(":")
        arg = arg.strip()
        try:
            if kind == "iid" and not sep:
                return cls(kind="iid")
            if kind == "labels" and sep:
                return cls(kind="labels", classes_per_silo=int(arg))
            if kind == "dirichlet" and sep:
                return cls(kind="dirichlet", alpha=float(arg))
        except (ValueError, ValidationError) as exc:
            raise bad from exc
        raise bad

    def __str__(self) -> str:
        if self.kind == "labels":
            return f"labels:{self.classes_per_silo}"
        if self.kind == "dirichlet":
            return f"dirichlet:{self.alpha:g}"
        return "iid"


def _checked_partition(text: str) -> str:
    PartitionSpec.parse(text)
    return text


PartitionText = Annotated[str, AfterValidator(_checked_partition)]
"""A config field holding a partition specification, checked by :meth:`PartitionSpec.parse`."""


def _label_groups(
    classes: np.ndarray, num_silos: int, k: int
) -> tuple[dict[int, int], Literal["grouped", "first-deterministic"]]:
    """Map each class to a group of ``k`` classes for the "labels" partitioning.

    Returns the class -> group mapping (classes missing from it are not hosted by any silo)
    and the strategy name.
    """
    c = len(classes)
    if num_silos * k <= c:
        # Disjoint: silo p hosts classes [p*k, (p+1)*k) (in sorted order).
        used = classes[: num_silos * k]
        return {int(cls): i // k for i, cls in enumerate(used)}, "grouped"
    if c % k == 0:
        # Not enough classes to be disjoint: silo p hosts group p % (c / k); silos that share
        # a group split its samples evenly.
        return {int(cls): i // k for i, cls in enumerate(classes)}, "grouped"
    return {}, "first-deterministic"


def partition_indices(
    y: np.ndarray, *, num_silos: int, spec: PartitionSpec | str, seed: int = 0
) -> list[np.ndarray]:
    """Assign every sample index to one silo.

    Parameters
    ----------
    y : numpy.ndarray
        Integer labels, shape ``[N]``.
    num_silos : int
        Number of silos (partitions), at least 1 and at most ``N``.
    spec : PartitionSpec or str
        The partitioning scheme, or its text form (see :meth:`PartitionSpec.parse`).
    seed : int
        Seed for shuffling / Dirichlet sampling; results are deterministic (default: 0).

    Returns
    -------
    list of numpy.ndarray
        ``num_silos`` sorted int64 index arrays into ``y``, pairwise disjoint and non-empty.
        ``iid`` and ``dirichlet`` cover every index. ``labels:K`` gives each silo exactly K
        classes; when ``num_silos * K <= num_classes`` the silos' classes are disjoint
        (silo p gets the p-th block of K classes in sorted order) and classes beyond the
        first ``num_silos * K`` are left out; otherwise, if K divides the number of
        classes, silo p gets class block ``p % (num_classes / K)`` (blocks shared by
        several silos are split evenly), else flwr's ``first-deterministic`` mode is used.

    Raises
    ------
    ValueError
        Bad arguments, or a partitioning that would leave a silo empty.
    """
    import datasets  # type: ignore[import-untyped]
    from flwr_datasets.partitioner import (  # type: ignore[import-untyped]
        DirichletPartitioner,
        IidPartitioner,
        Partitioner,
        PathologicalPartitioner,
    )

    if isinstance(spec, str):
        spec = PartitionSpec.parse(spec)
    labels = np.asarray(y).reshape(-1)
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64)
    n = int(labels.size)
    if isinstance(num_silos, bool) or int(num_silos) != num_silos or num_silos < 1:
        raise ValueError(f"num_silos must be a positive integer, got {num_silos!r}")
    if num_silos > n:
        raise ValueError(
            f"cannot split {n} samples into {num_silos} non-empty silos "
            f"(partition spec {str(spec)!r}); use at most {n} silos"
        )

    index = np.arange(n, dtype=np.int64)
    partitioner: Partitioner
    columns: dict[str, np.ndarray] = {"label": labels, "index": index}
    if spec.kind == "iid":
        # IidPartitioner takes contiguous shards, so shuffle the rows first.
        perm = np.random.default_rng(seed).permutation(n)
        columns = {"label": labels[perm], "index": index[perm]}
        partitioner = IidPartitioner(num_partitions=num_silos)
    elif spec.kind == "labels":
        k = int(spec.classes_per_silo or 0)
        classes = np.unique(labels)
        if k > len(classes):
            raise ValueError(
                f"partition spec {str(spec)!r} asks for {k} classes per silo but the data has "
                f"only {len(classes)} classes"
            )
        mapping, mode = _label_groups(classes, num_silos, k)
        if mode == "grouped":
            keep = np.isin(labels, np.fromiter(mapping, dtype=np.int64))
            kept_labels = labels[keep]
            group = np.array([mapping[int(v)] for v in kept_labels], dtype=np.int64)
            columns = {"label": kept_labels, "index": index[keep], "group": group}
            # One class *group* per silo, group p % num_groups for silo p.
            partitioner = PathologicalPartitioner(
                num_partitions=num_silos,
                partition_by="group",
                num_classes_per_partition=1,
                class_assignment_mode="deterministic",
                shuffle=True,
                seed=seed,
            )
        else:
            partitioner = PathologicalPartitioner(
                num_partitions=num_silos,
                partition_by="label",
                num_classes_per_partition=k,
                class_assignment_mode="first-deterministic",
                shuffle=True,
                seed=seed,
            )
    else:
        alpha = float(spec.alpha or 0.0)
        partitioner = DirichletPartitioner(
            num_partitions=num_silos,
            partition_by="label",
            alpha=alpha,
            min_partition_size=min(10, max(1, n // (10 * num_silos))),
            self_balancing=False,
            shuffle=True,
            seed=seed,
        )

    partitioner.dataset = datasets.Dataset.from_dict(
        {name: col.tolist() for name, col in columns.items()}
    )
    try:
        parts = [
            np.sort(np.asarray(partitioner.load_partition(i)["index"], dtype=np.int64))
            for i in range(num_silos)
        ]
    except ValueError as exc:
        raise ValueError(
            f"partition spec {str(spec)!r} cannot split {n} samples into {num_silos} silos: {exc}"
        ) from exc
    empty = [i for i, p in enumerate(parts) if p.size == 0]
    if empty:
        raise ValueError(
            f"partition spec {str(spec)!r} leaves silo(s) {empty} empty when splitting {n} "
            f"samples into {num_silos} silos; use fewer silos or another spec"
        )
    return parts
