"""A user's own data, the ``hf:PATH`` source: files read with Hugging Face ``datasets``.

PATH is one of

- a folder written by ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` of splits);
- one ``.parquet``, ``.csv``, ``.jsonl``/``.json`` or ``.arrow`` file;
- a folder of such files, all of one format (searched recursively, hidden entries
  skipped), as a Hugging Face Hub dataset repository lays them out.

Nothing is downloaded: only local paths are given to ``datasets``, with
``local_files_only``. Files are converted in a temporary cache that is deleted after
loading, so nothing is written under ``~/.cache``.

A test split the source provides is kept as the test set (:attr:`ArrayDataset.test`,
which :func:`~fl_lbbsp.datasets.train_test_split` returns as is): the ``"test"`` split of
a ``DatasetDict``, or, in a folder of files, the files whose path below the folder names
``test``, ``testing``, ``eval`` or ``evaluation`` between separators (``test.csv``,
``mnist_test.parquet``, ``data/test-00000-of-00001.parquet``, ``test/part-0.arrow``),
following the Hub's file-naming convention. Every other split (``train``,
``validation``, ...) is training data. A source that holds only a test split, and a single
file (whatever its name), is all training data; the runs then cut their own test set.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import ArrayDataset, DataSourceError

__all__ = [
    "HF_ACCEPTED",
    "HF_FILE_FORMATS",
    "HF_IMAGE_COLUMN",
    "HF_LABEL_COLUMN",
    "hf_options",
    "hf_source_spec",
    "load_hf_disk",
]

HF_IMAGE_COLUMN = "image"
"""Default image column of an ``hf:PATH`` source."""
HF_LABEL_COLUMN = "label"
"""Default label column of an ``hf:PATH`` source."""
HF_FILE_FORMATS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".jsonl": "json",
    ".json": "json",
    ".arrow": "arrow",
}
"""File extension -> the ``datasets`` builder that reads it."""
HF_ACCEPTED = (
    "a directory written by datasets' save_to_disk (Dataset or DatasetDict), "
    "a .parquet, .csv, .jsonl/.json or .arrow file, or a directory of such files"
)
"""What an ``hf:PATH`` may name, for error messages."""

_SAVED_MARKERS = ("dataset_dict.json", "state.json")
_SAVED_METADATA = frozenset({"dataset_dict.json", "state.json", "dataset_info.json"})
_TEST_NAME = re.compile(r"(?:^|[-._ 0-9/])(?:test|testing|eval|evaluation)(?:[-._ 0-9/]|$)")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_INTEGER = re.compile(r"[-+]?\d+")


def hf_source_spec(
    path: str | Path, *, image_column: str = HF_IMAGE_COLUMN, label_column: str = HF_LABEL_COLUMN
) -> str:
    """The source spec of a Hugging Face dataset on disk: ``hf:PATH``, with
    ``?image=COLUMN&label=COLUMN`` when a column is not the default."""
    options = [
        f"{key}={value}"
        for key, value, default in (
            ("image", image_column, HF_IMAGE_COLUMN),
            ("label", label_column, HF_LABEL_COLUMN),
        )
        if value != default
    ]
    return f"hf:{path}" + (f"?{'&'.join(options)}" if options else "")


def hf_options(spec: str, text: str) -> tuple[str, dict[str, str]]:
    """``PATH?image=a&label=b`` -> (PATH, {"image": a, "label": b}), defaults filled in.

    Raises
    ------
    DataSourceError
        An option other than ``image=COLUMN`` or ``label=COLUMN``.
    """
    raw_path, _, query = text.partition("?")
    options = {"image": HF_IMAGE_COLUMN, "label": HF_LABEL_COLUMN}
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        if not sep or key not in options or not value:
            raise DataSourceError(
                f"data source {spec!r}: bad option {item!r}; expected image=COLUMN or label=COLUMN"
            )
        options[key] = value
    return raw_path, options


# ----------------------------------------------------------------------------- Reading the splits


@contextmanager
def _quiet(datasets: Any) -> Iterator[None]:
    """``datasets``' progress bars off while loading (a CLI prints one line per round)."""
    enabled = bool(datasets.is_progress_bar_enabled())
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


def _reason(err: BaseException) -> str:
    """The cause of a ``datasets`` error in at most 200 characters."""
    cause = err.__cause__ or err
    text = " ".join(f"{type(cause).__name__}: {cause}".split())
    return text if len(text) <= 200 else text[:197] + "..."


def _data_files(folder: Path) -> dict[str, list[Path]]:
    """The data files under ``folder`` by format (hidden entries and the metadata files
    of ``save_to_disk`` skipped)."""
    found: dict[str, list[Path]] = {}
    for file in sorted(folder.rglob("*")):
        relative = file.relative_to(folder).parts
        if any(part.startswith(".") for part in relative) or file.name in _SAVED_METADATA:
            continue
        fmt = HF_FILE_FORMATS.get(file.suffix.lower())
        if fmt is not None and file.is_file():
            found.setdefault(fmt, []).append(file)
    return found


def _load_files(datasets: Any, fmt: str, files: dict[str, list[Path]], name: str) -> Any:
    """The splits of ``files`` (split -> paths), read by ``datasets``' ``fmt`` builder
    into memory through a temporary cache, offline."""
    what = "file" if sum(map(len, files.values())) == 1 else "files"
    shown = ", ".join(repr(str(p)) for paths in files.values() for p in paths[:2])
    try:
        with tempfile.TemporaryDirectory(prefix="fl-lbbsp-hf-") as cache:
            return datasets.load_dataset(
                fmt,
                data_files={
                    split: [str(p.resolve()) for p in paths] for split, paths in files.items()
                },
                cache_dir=cache,
                keep_in_memory=True,
                download_config=datasets.DownloadConfig(local_files_only=True),
            )
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as err:
        raise DataSourceError(
            f"data source {name!r}: {what} {shown} cannot be read as {fmt} ({_reason(err)}); "
            f"expected {HF_ACCEPTED}"
        ) from None


def _read_splits(datasets: Any, path: Path, name: str) -> dict[str, Any]:
    """The named splits (``datasets.Dataset``) at ``path``: see the module docstring."""
    if not path.exists():
        raise DataSourceError(
            f"data source {name!r}: path {str(path)!r} does not exist; expected {HF_ACCEPTED}"
        )
    if path.is_dir() and any((path / marker).is_file() for marker in _SAVED_MARKERS):
        try:
            loaded = datasets.load_from_disk(str(path))
        except (OSError, ValueError, datasets.exceptions.DatasetsError) as err:
            raise DataSourceError(
                f"data source {name!r}: directory {str(path)!r} looks like a save_to_disk "
                f"folder but cannot be read ({_reason(err)})"
            ) from None
        return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    if path.is_dir():
        found = _data_files(path)
        if not found:
            raise DataSourceError(
                f"data source {name!r}: directory {str(path)!r} is not a folder written by "
                f"save_to_disk and holds no .parquet, .csv, .jsonl/.json or .arrow files; "
                f"expected {HF_ACCEPTED}"
            )
        if len(found) > 1:
            raise DataSourceError(
                f"data source {name!r}: directory {str(path)!r} mixes formats "
                f"({', '.join(sorted(found))}); keep one format per directory or name one file"
            )
        ((fmt, files),) = found.items()
        is_test = [bool(_TEST_NAME.search(f.relative_to(path).as_posix().lower())) for f in files]
        by_split = {
            split: [f for f, test in zip(files, is_test, strict=True) if test == (split == "test")]
            for split in ("train", "test")
        }
        return dict(_load_files(datasets, fmt, {k: v for k, v in by_split.items() if v}, name))
    if not path.is_file():
        raise DataSourceError(
            f"data source {name!r}: {str(path)!r} is neither a file nor a directory; "
            f"expected {HF_ACCEPTED}"
        )
    builder = HF_FILE_FORMATS.get(path.suffix.lower())
    if builder is None:
        kind = f"extension {path.suffix!r}" if path.suffix else "no extension"
        raise DataSourceError(
            f"data source {name!r}: file {str(path)!r} has {kind}, not a format it can read; "
            f"expected {HF_ACCEPTED}"
        )
    return dict(_load_files(datasets, builder, {"train": [path]}, name))


# ------------------------------------------------------------------------------ Columns to arrays


def _pixel_columns(datasets: Any, split: Any, label_column: str) -> list[str] | None:
    """One column per pixel (MNIST as CSV): every column but the label numeric, k*k of
    them; ``None`` otherwise."""
    columns = [c for c in split.column_names if c != label_column]
    features = split.features  # a copy on every access: once, not once per column
    numeric = all(
        isinstance(features[c], datasets.Value)
        and str(features[c].dtype).startswith(("int", "uint", "float"))
        for c in columns
    )
    side = math.isqrt(len(columns))
    return columns if numeric and side >= 2 and side * side == len(columns) else None


def _parse_cells(cells: Sequence[str], spec: str, column: str) -> np.ndarray:
    """Pixels written as text (a CSV cell): a JSON list, or the numbers of a list as
    ``Dataset.to_csv`` prints it (``[0 1 2]``, ``[array([0, 1]) array([2, 3])]``)."""
    rows: list[np.ndarray] = []
    for cell in cells:
        if "..." in cell:
            raise DataSourceError(
                f"data source {spec!r}: column {column!r} holds lists shortened with '...' "
                "(numpy's print-out): write them as JSON lists or one column per pixel"
            )
        try:
            rows.append(np.asarray(json.loads(cell)))
            continue
        except ValueError:
            pass
        tokens = _NUMBER.findall(re.sub(r"dtype=\w+", "", cell))
        integer = all(_INTEGER.fullmatch(t) for t in tokens)
        rows.append(np.asarray(tokens, dtype=np.int64 if integer else np.float64))
    if len({row.shape for row in rows}) == 1:
        return np.stack(rows)
    return np.array(cells, dtype=object)  # refused by the caller: not of one size


def _hf_pixels(images: np.ndarray, spec: str, column: str) -> np.ndarray:
    """Images as float32 ``[N, C, H, W]`` in [0, 1] (integers / 255, floats as they are).

    Accepted: ``[N, H, W]``, ``[N, H, W, C]`` or ``[N, C, H, W]`` arrays, ``[N, k*k]`` flat
    grey images, and text cells that parse to either.
    """
    cells = images.tolist() if images.ndim == 1 and images.dtype.kind in "UO" else []
    if cells and all(isinstance(cell, str) for cell in cells):
        images = _parse_cells(cells, spec, column)
    if images.ndim == 2 and images.dtype != object:
        side = math.isqrt(images.shape[1])
        if side >= 1 and side * side == images.shape[1]:
            images = images.reshape(-1, side, side)
    if images.dtype == object or images.ndim not in (3, 4):
        raise DataSourceError(
            f"data source {spec!r}: column {column!r} must hold images of one size "
            f"(H x W, H x W x C or k*k values), got {images.dtype} values of shape "
            f"{images.shape[1:]}"
        )
    if images.ndim == 3:
        images = images[:, None]
    elif images.shape[-1] in (1, 3, 4) and images.shape[1] not in (1, 3):
        images = np.moveaxis(images, -1, 1)  # HWC -> CHW
    if np.issubdtype(images.dtype, np.integer):
        if images.size and (images.min() < 0 or images.max() > 255):
            raise DataSourceError(
                f"data source {spec!r}: integer pixels of column {column!r} must lie in 0..255"
            )
        return (images / 255.0).astype(np.float32)
    if not np.issubdtype(images.dtype, np.floating) or not np.isfinite(images).all():
        raise DataSourceError(
            f"data source {spec!r}: column {column!r} must hold finite numeric pixels"
        )
    return np.ascontiguousarray(images, dtype=np.float32)


def _nested_numbers(column: Any) -> np.ndarray | None:
    """An arrow column of equally long (nested) lists of numbers as one array, read without
    a Python object per value; ``None`` for anything else (decoded the slow way)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    values = column.combine_chunks()
    shape = [len(values)]
    while isinstance(values.type, pa.ListType | pa.LargeListType | pa.FixedSizeListType):
        lengths = pc.list_value_length(values)
        if not len(values) or values.null_count or pc.min(lengths) != pc.max(lengths):
            return None
        shape.append(int(pc.min(lengths).as_py()))
        values = values.flatten()
    numeric = pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
    if len(shape) == 1 or not numeric or values.null_count:
        return None
    return np.asarray(values.to_numpy(zero_copy_only=False)).reshape(shape)


def _split_arrays(
    datasets: Any, split: Any, image_column: str, label_column: str, spec: str
) -> tuple[np.ndarray, np.ndarray, Any]:
    """One split's (pixels, raw labels, label feature)."""
    columns = split.column_names
    pixels = None
    if image_column == HF_IMAGE_COLUMN and image_column not in columns and label_column in columns:
        pixels = _pixel_columns(datasets, split, label_column)
    missing = [c for c in (image_column, label_column) if c not in columns]
    if pixels is None and missing:
        flags = {image_column: "--hf-image-column", label_column: "--hf-label-column"}
        raise DataSourceError(
            f"data source {spec!r}: no column {missing[0]!r} (choose one with "
            f"{flags[missing[0]]}); the dataset has {', '.join(columns)}"
        )
    try:
        if pixels is not None:  # through arrow: numpy formatting is slow on many columns
            arrow = split.with_format("arrow")[:]
            side = math.isqrt(len(pixels))
            planes = [arrow.column(c).to_numpy(zero_copy_only=False) for c in pixels]
            images = np.column_stack(planes).reshape(-1, side, side)
            x = _hf_pixels(images, spec, f"{pixels[0]}..{pixels[-1]}")
            labels = arrow.column(label_column).to_numpy(zero_copy_only=False)
        else:
            chosen = split.select_columns([image_column, label_column])
            arrow = chosen.with_format("arrow")[:]
            nested = _nested_numbers(arrow.column(image_column))
            if nested is None:  # datasets.Image, ragged lists, text, ...: decoded by numpy
                nested = np.asarray(chosen.with_format("numpy")[:][image_column])
            x = _hf_pixels(nested, spec, image_column)
            labels = arrow.column(label_column).to_numpy(zero_copy_only=False)
    except (OSError, ValueError) as err:
        if isinstance(err, DataSourceError):
            raise
        raise DataSourceError(
            f"data source {spec!r}: column {image_column!r} cannot be decoded ({_reason(err)})"
        ) from None
    return x, labels, split.features[label_column]


def _labels(
    datasets: Any, raws: list[np.ndarray], features: list[Any], spec: str, column: str
) -> tuple[list[np.ndarray], int]:
    """The splits' labels as int64 classes, one mapping for all splits, and their number."""
    if all(isinstance(f, datasets.ClassLabel) for f in features):
        ys = [r.astype(np.int64) for r in raws]
        num_classes = max(int(f.num_classes) for f in features)
    else:
        raw = np.concatenate(raws)
        if np.issubdtype(raw.dtype, np.integer):
            y = raw.astype(np.int64)
            num_classes = int(y.max()) + 1
        elif raw.dtype.kind in "UO" and all(isinstance(v, str) for v in raw.tolist()):
            names, y = np.unique(raw.astype(str), return_inverse=True)
            y, num_classes = y.astype(np.int64).reshape(-1), len(names)
        else:
            raise DataSourceError(
                f"data source {spec!r}: column {column!r} must hold class labels "
                f"(ClassLabel, integers or strings), got {raw.dtype}"
            )
        ys = np.split(y, np.cumsum([len(r) for r in raws])[:-1])
    low = min((int(y.min()) for y in ys if y.size), default=0)
    if low < 0:
        raise DataSourceError(f"data source {spec!r}: labels must be >= 0, got {low}")
    return ys, num_classes


def load_hf_disk(
    path: str | Path,
    *,
    image_column: str = HF_IMAGE_COLUMN,
    label_column: str = HF_LABEL_COLUMN,
    spec: str | None = None,
) -> ArrayDataset:
    """Load an image-classification dataset from local files with Hugging Face ``datasets``.

    Nothing is downloaded (see the module docstring for the accepted paths). A test split
    the source provides (a ``DatasetDict``'s ``"test"``, or files named ``*test*`` in a
    folder of files) becomes :attr:`ArrayDataset.test`; every other split is training data.

    Parameters
    ----------
    path : str | Path
        A folder written by ``save_to_disk``, one ``.parquet``, ``.csv``,
        ``.jsonl``/``.json`` or ``.arrow`` file, or a folder of such files.
    image_column : str (default: "image")
        Column of images: ``datasets.Image`` or arrays, all of one size, H x W (grey),
        H x W x C, or k*k values (a k x k grey image); in a CSV, a cell holding such a list
        as text. Integer pixels are divided by 255, float pixels taken as they are. When the
        default column is absent and every other column is a number, k*k of them (MNIST as
        CSV: ``label, pixel1, ..., pixel784``), those columns are the pixels in order.
    label_column : str (default: "label")
        Column of labels: ``ClassLabel`` (its ``num_classes``), integers >= 0 (max + 1
        classes) or strings (classes in sorted order); one mapping for all splits.
    spec : str | None (default: None)
        The source spec, for error messages.

    Returns
    -------
    ArrayDataset
        The training data, with the source's test split as ``test`` (or ``None``).

    Raises
    ------
    DataSourceError
        A path that does not exist or is none of the accepted forms (the message says what
        is accepted and whether PATH is a file or a directory), a file that cannot be read,
        a missing column, values that are not images of one size and class labels, splits
        with images of different sizes, or fewer than 2 training samples.
    """
    import datasets  # type: ignore[import-untyped]

    name = spec or hf_source_spec(path, image_column=image_column, label_column=label_column)
    with _quiet(datasets):
        splits = _read_splits(datasets, Path(path).expanduser(), name)
        test = splits.pop("test") if "test" in splits and len(splits) > 1 else None
        ordered = [*splits.values(), *([] if test is None else [test])]
        arrays = [_split_arrays(datasets, s, image_column, label_column, name) for s in ordered]
    xs = [x for x, _, _ in arrays]
    if len({x.shape[1:] for x in xs}) > 1:
        sizes = ", ".join(f"{split} {x.shape[1:]}" for split, x in zip(splits, xs, strict=False))
        raise DataSourceError(
            f"data source {name!r}: the splits hold images of different sizes ({sizes}"
            f"{'' if test is None else f', test {xs[-1].shape[1:]}'})"
        )
    ys, num_classes = _labels(
        datasets, [r for _, r, _ in arrays], [f for _, _, f in arrays], name, label_column
    )
    k = len(splits)
    x_train, y_train = np.concatenate(xs[:k]), np.concatenate(ys[:k])
    if len(y_train) < 2:
        raise DataSourceError(
            f"data source {name!r}: needs at least 2 training samples, has {len(y_train)}"
        )
    label = f"hf:{Path(path).name}"
    held_out = None
    if test is not None:
        if len(ys[-1]) == 0:
            raise DataSourceError(f"data source {name!r}: its test split is empty")
        held_out = ArrayDataset(x=xs[-1], y=ys[-1], num_classes=num_classes, name=label)
    return ArrayDataset(x=x_train, y=y_train, num_classes=num_classes, name=label, test=held_out)
