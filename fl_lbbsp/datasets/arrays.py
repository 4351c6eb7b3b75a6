"""The in-memory dataset every source returns, its error type and its train/test split."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ArrayDataset", "DataSourceError", "train_test_split"]


class DataSourceError(ValueError):
    """A data source could not be found, read, or verified.

    The message is always a single line (newlines are replaced by spaces), so a CLI can print
    ``f"error: {exc}"`` without a traceback.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """An in-memory labelled image dataset.

    Parameters
    ----------
    x : numpy.ndarray
        Images, float32, shape ``[N, C, H, W]``, values in ``[0, 1]``.
    y : numpy.ndarray
        Integer class labels, int64, shape ``[N]``, values in ``[0, num_classes)``.
    num_classes : int
        Number of classes of the task (labels need not all be present, e.g. in a subset).
    name : str
        Human-readable name of the source (e.g. ``"mnist"``).
    test : ArrayDataset | None (default: None)
        A test split the source itself provides (e.g. the ``"test"`` split of a Hugging
        Face ``DatasetDict``), with the same image shape and ``num_classes``;
        :func:`train_test_split` returns it as the test part instead of cutting one out of
        ``x``/``y``. ``x``/``y`` never include it. ``None``: the source has no test split.

    Raises
    ------
    ValueError
        Arrays of the wrong shape or type, labels outside ``[0, num_classes)``, or a test
        split that does not match (image shape, ``num_classes``) or has one of its own.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str
    test: ArrayDataset | None = None

    def __post_init__(self) -> None:
        if self.x.ndim != 4:
            raise ValueError(f"x must have shape [N, C, H, W], got shape {self.x.shape}")
        if self.x.dtype != np.float32:
            raise ValueError(f"x must be float32, got {self.x.dtype}")
        if self.y.ndim != 1 or self.y.dtype != np.int64:
            raise ValueError(f"y must be a 1-D int64 array, got {self.y.dtype} {self.y.shape}")
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"x and y disagree on the number of samples: {self.x.shape[0]} != {len(self.y)}"
            )
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if self.y.size and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise ValueError(
                f"labels must lie in [0, {self.num_classes}), "
                f"got range [{self.y.min()}, {self.y.max()}]"
            )
        if self.test is not None:
            if self.test.test is not None:
                raise ValueError("a test split cannot have a test split of its own")
            if (self.test.input_shape, self.test.num_classes) != (
                self.input_shape,
                self.num_classes,
            ):
                raise ValueError(
                    f"the test split ({self.test.input_shape}, {self.test.num_classes} classes)"
                    f" does not match the data ({self.input_shape}, {self.num_classes} classes)"
                )

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape ``(C, H, W)`` of one image."""
        _, c, h, w = self.x.shape
        return (int(c), int(h), int(w))

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, indices: Sequence[int] | np.ndarray) -> ArrayDataset:
        """Return the samples at ``indices`` (in that order) as a new dataset.

        Parameters
        ----------
        indices : sequence of int or numpy.ndarray
            Integer positions into this dataset (copies are made, not views).

        Returns
        -------
        ArrayDataset
            Same ``num_classes`` and ``name``, selected samples only (without ``test``).
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return ArrayDataset(
            x=self.x[idx], y=self.y[idx], num_classes=self.num_classes, name=self.name
        )


def train_test_split(
    data: ArrayDataset, *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[ArrayDataset, ArrayDataset]:
    """Split a dataset into shuffled train and test parts, stratified by label.

    Each class contributes ``floor(test_fraction * n_class)`` samples to the test part; the
    remaining test slots (to reach ``round(test_fraction * N)``, at least 1 and at most
    ``N - 1``) go to the classes with the largest fractional remainders. A dataset that
    carries its source's own test split (``data.test``) is not cut: the result is
    ``(data, data.test)``, each shuffled, and ``test_fraction`` is not used.

    Parameters
    ----------
    data : ArrayDataset
        Dataset to split (at least 2 samples).
    test_fraction : float
        Fraction of samples in the test part, strictly between 0 and 1 (default: 0.2).
    seed : int
        Seed of the numpy ``Generator``; the split is deterministic for a seed (default: 0).

    Returns
    -------
    tuple of ArrayDataset
        ``(train, test)``, both in shuffled order.

    Raises
    ------
    ValueError
        ``test_fraction`` outside (0, 1), or fewer than 2 samples.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n = len(data)
    if n < 2:
        raise ValueError(f"need at least 2 samples to split, got {n}")
    rng = np.random.default_rng(seed)
    if data.test is not None:
        test = data.test
        return data.subset(rng.permutation(n)), test.subset(rng.permutation(len(test)))
    classes = np.unique(data.y)
    per_class = [rng.permutation(np.flatnonzero(data.y == c)) for c in classes]
    exact = np.array([test_fraction * len(idx) for idx in per_class])
    counts = np.floor(exact).astype(np.int64)
    target = int(min(max(round(test_fraction * n), 1), n - 1))
    remainder = target - int(counts.sum())
    if remainder > 0:
        sizes = np.array([len(idx) for idx in per_class])
        eligible = np.flatnonzero(counts < sizes - 1)
        if eligible.size == 0:
            eligible = np.flatnonzero(counts < sizes)
        frac = (exact - counts)[eligible]
        tiebreak = rng.random(eligible.size)
        order = eligible[np.lexsort((tiebreak, -frac))]
        counts[order[:remainder]] += 1
    test_idx = np.concatenate([idx[:k] for idx, k in zip(per_class, counts, strict=True)])
    train_idx = np.concatenate([idx[k:] for idx, k in zip(per_class, counts, strict=True)])
    return data.subset(rng.permutation(train_idx)), data.subset(rng.permutation(test_idx))
