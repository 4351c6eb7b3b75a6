"""Image data sources for the federated-learning experiments (numpy only, no network).

Every loader returns an :class:`ArrayDataset` with images as float32 ``[N, C, H, W]`` arrays
scaled to ``[0, 1]`` and labels as int64 ``[N]`` arrays. Loaders never download anything:
they read files that are already on disk (or, for :func:`load_embedded`, the copy of the
UCI handwritten-digits data that ships inside scikit-learn).

Errors caused by the data source itself (missing folder or file, corrupt header, checksum
mismatch, unknown source spec) are raised as :class:`DataSourceError`, whose message is a
single line suitable for printing by a command-line interface without a traceback.
"""

from __future__ import annotations

import gzip
import hashlib
import pickle
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator

from .arrays import ArrayDataset, DataSourceError, train_test_split
from .hf import HF_IMAGE_COLUMN, HF_LABEL_COLUMN, hf_options, hf_source_spec, load_hf_disk

__all__ = [
    "ArrayDataset",
    "DataSourceError",
    "load_cifar10",
    "HF_IMAGE_COLUMN",
    "HF_LABEL_COLUMN",
    "hf_source_spec",
    "load_embedded",
    "load_hf_disk",
    "load_mnist_idx",
    "SourceSpec",
    "load_source",
    "parse_source_spec",
    "train_test_split",
]


# ---------------------------------------------------- Embedded: scikit-learn's handwritten digits


def load_embedded(*, upscale: int = 4) -> ArrayDataset:
    """Load the UCI handwritten digits bundled with scikit-learn (no network access).

    The real 8x8 images are enlarged ``upscale`` times by pixel repetition, by default to
    LeNet-5's native 32x32 input: a per-sample cost like MNIST's, so a round's compute
    time grows with the batch size as on a real silo rather than being all per-step
    overhead.

    Parameters
    ----------
    upscale : int (default: 4)
        Enlargement factor; 1 keeps the original 8x8 images.

    Returns
    -------
    ArrayDataset
        1797 grey-scale images (shape ``[1797, 1, 8*upscale, 8*upscale]``), 10 classes,
        pixel values (originally 0..16) divided by 16.
    """
    if isinstance(upscale, bool) or not isinstance(upscale, int) or upscale < 1:
        raise ValueError(f"upscale must be a positive integer, got {upscale!r}")
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0))[:, None, :, :]
    x = np.repeat(np.repeat(x, upscale, axis=2), upscale, axis=3)
    y = np.asarray(bunch.target, dtype=np.int64)
    return ArrayDataset(x=np.ascontiguousarray(x), y=y, num_classes=10, name="embedded-digits")


# ----------------------------------------------------------------------------- MNIST (IDX format)

_IDX_UBYTE = 0x08


def _find_file(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _read_md5sums(folder: Path) -> dict[str, str] | None:
    md5_path = folder / "MD5SUMS"
    if not md5_path.is_file():
        return None
    sums: dict[str, str] = {}
    for lineno, raw in enumerate(md5_path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or len(parts[0]) != 32:
            raise DataSourceError(f"malformed line {lineno} in {md5_path}: {raw!r}")
        digest, name = parts
        sums[name.lstrip("*").strip()] = digest.lower()
    return sums


def _verify_md5(path: Path, sums: dict[str, str] | None) -> None:
    if sums is None or path.name not in sums:
        return
    digest = hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()
    if digest != sums[path.name]:
        raise DataSourceError(
            f"MD5 mismatch for {path}: expected {sums[path.name]}, got {digest} "
            "(file corrupt or MD5SUMS wrong)"
        )


def _read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """Parse an IDX file (optionally gzip-compressed) holding unsigned bytes."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataSourceError(f"cannot read IDX file {path}: {exc}") from exc
    if len(raw) < 4:
        raise DataSourceError(f"corrupt IDX header in {path}: file is only {len(raw)} bytes")
    zero0, zero1, dtype_code, ndim = raw[0], raw[1], raw[2], raw[3]
    if zero0 != 0 or zero1 != 0 or dtype_code != _IDX_UBYTE or ndim != expected_ndim:
        magic = int.from_bytes(raw[:4], "big")
        expected = (_IDX_UBYTE << 8) | expected_ndim
        raise DataSourceError(
            f"corrupt IDX header in {path}: magic number 0x{magic:08x}, expected 0x{expected:08x}"
        )
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DataSourceError(f"corrupt IDX header in {path}: truncated dimension list")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected_bytes = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header_len != expected_bytes:
        raise DataSourceError(
            f"corrupt IDX file {path}: header says dims {dims} ({expected_bytes} bytes) but "
            f"{len(raw) - header_len} data bytes follow"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(dims)


def load_mnist_idx(path: str | Path) -> ArrayDataset:
    """Load MNIST from IDX files in a folder (plain or ``.gz``).

    The training pair (``train-images-idx3-ubyte`` + ``train-labels-idx1-ubyte``) is used when
    both are present, otherwise the test pair (``t10k-images-idx3-ubyte`` +
    ``t10k-labels-idx1-ubyte``). If the folder holds an ``MD5SUMS`` file (``md5sum`` format),
    every file that is read and listed there is verified first.

    Parameters
    ----------
    path : str or pathlib.Path
        Folder holding the IDX files.

    Returns
    -------
    ArrayDataset
        Images of shape ``[N, 1, 28, 28]`` (pixel values divided by 255), 10 classes.

    Raises
    ------
    DataSourceError
        Missing folder or files, corrupt IDX header, inconsistent sizes or MD5 mismatch.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise DataSourceError(f"MNIST folder not found: {str(path)!r}")
    chosen: tuple[Path, Path] | None = None
    for prefix in ("train", "t10k"):
        img_file = _find_file(folder, f"{prefix}-images-idx3-ubyte")
        lab_file = _find_file(folder, f"{prefix}-labels-idx1-ubyte")
        if img_file is not None and lab_file is not None:
            chosen = (img_file, lab_file)
            break
    if chosen is None:
        raise DataSourceError(
            f"no MNIST IDX files in {str(folder)!r}: expected train-images-idx3-ubyte[.gz] + "
            "train-labels-idx1-ubyte[.gz] or t10k-images-idx3-ubyte[.gz] + "
            "t10k-labels-idx1-ubyte[.gz]"
        )
    images_path, labels_path = chosen
    sums = _read_md5sums(folder)
    _verify_md5(images_path, sums)
    _verify_md5(labels_path, sums)

    images = _read_idx(images_path, expected_ndim=3)
    labels = _read_idx(labels_path, expected_ndim=1)
    if images.shape[0] != labels.shape[0]:
        raise DataSourceError(
            f"MNIST size mismatch: {images.shape[0]} images in {images_path.name} but "
            f"{labels.shape[0]} labels in {labels_path.name}"
        )
    if images.shape[1:] != (28, 28):
        raise DataSourceError(
            f"MNIST images in {images_path} have size {images.shape[1:]}, expected (28, 28)"
        )
    if labels.size and labels.max() > 9:
        raise DataSourceError(f"MNIST labels in {labels_path} exceed 9 (max {labels.max()})")
    x = (images.astype(np.float32) / np.float32(255.0))[:, None, :, :]
    return ArrayDataset(
        x=np.ascontiguousarray(x), y=labels.astype(np.int64), num_classes=10, name="mnist"
    )


# ---------------------------------------------------------------------- CIFAR-10 (python version)

_CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


def _load_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with path.open("rb") as fh:
            batch: Any = pickle.load(fh, encoding="bytes")
    except Exception as exc:  # pickle raises many exception types on corrupt input
        raise DataSourceError(f"cannot read CIFAR-10 batch {path}: {exc}") from exc
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataSourceError(
            f"CIFAR-10 batch {path} is not a dict with keys b'data' and b'labels'"
        )
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64).reshape(-1)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataSourceError(
            f"CIFAR-10 batch {path}: b'data' must be uint8 [N, 3072], got {data.dtype} {data.shape}"
        )
    if data.shape[0] != labels.shape[0]:
        raise DataSourceError(
            f"CIFAR-10 batch {path}: {data.shape[0]} images but {labels.shape[0]} labels"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataSourceError(f"CIFAR-10 batch {path}: labels outside 0..9")
    return data, labels


def load_cifar10(path: str | Path) -> ArrayDataset:
    """Load CIFAR-10 from its "python version" pickled batches.

    All of ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` that are present are read
    and concatenated in that order (split the result with :func:`train_test_split`).

    Parameters
    ----------
    path : str or pathlib.Path
        Folder holding the batches, or a folder containing ``cifar-10-batches-py/``.

    Returns
    -------
    ArrayDataset
        Images of shape ``[N, 3, 32, 32]`` in RGB channel order, pixel values divided by 255,
        10 classes.

    Raises
    ------
    DataSourceError
        Missing folder, no batch files, or a batch of the wrong format.

    Notes
    -----
    The batches are Python pickles; only load files from a trusted source.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise DataSourceError(f"CIFAR-10 folder not found: {str(path)!r}")
    nested = folder / "cifar-10-batches-py"
    if nested.is_dir() and not any((folder / b).is_file() for b in _CIFAR_BATCHES):
        folder = nested
    files = [folder / b for b in _CIFAR_BATCHES if (folder / b).is_file()]
    if not files:
        raise DataSourceError(
            f"no CIFAR-10 batches in {str(path)!r}: expected data_batch_1..5 and/or test_batch "
            "(python version), directly or under cifar-10-batches-py/"
        )
    parts = [_load_cifar_batch(f) for f in files]
    data = np.concatenate([d for d, _ in parts], axis=0)
    labels = np.concatenate([lab for _, lab in parts], axis=0)
    x = data.reshape(-1, 3, 32, 32).astype(np.float32) / np.float32(255.0)
    return ArrayDataset(x=x, y=labels, num_classes=10, name="cifar10")


# ---------------------------------------------------------------------------------- Spec dispatch

_SPEC_FORMS = "'embedded', 'mnist:PATH', 'cifar10:PATH' or 'hf:PATH'"


def parse_source_spec(spec: str) -> tuple[str, Path | None]:
    """Check a source specification without loading it: ``(scheme, PATH)``.

    Parameters
    ----------
    spec : str
        ``"embedded"``, ``"mnist:PATH"``, ``"cifar10:PATH"`` or ``"hf:PATH"`` (a folder
        written by ``save_to_disk``, a ``.parquet``, ``.csv``, ``.jsonl``/``.json`` or
        ``.arrow`` file, or a folder of such files; ``"hf:PATH?image=COL&label=COL"`` names
        its columns). ``~`` in PATH is expanded.

    Raises
    ------
    DataSourceError
        Unknown scheme or empty PATH (whether PATH exists is checked on loading).
    """
    text = spec.strip()
    if text == "embedded":
        return "embedded", None
    scheme, sep, raw_path = text.partition(":")
    if not sep or scheme not in ("mnist", "cifar10", "hf"):
        raise DataSourceError(f"unknown data source {spec!r}; expected {_SPEC_FORMS}")
    if scheme == "hf":
        raw_path, _ = hf_options(spec, raw_path)
    if not raw_path.strip():
        raise DataSourceError(f"data source {spec!r} has an empty PATH; expected {_SPEC_FORMS}")
    return scheme, Path(raw_path.strip()).expanduser()


def _checked_spec(spec: str) -> str:
    parse_source_spec(spec)
    return spec


SourceSpec = Annotated[str, AfterValidator(_checked_spec)]
"""A config field holding a source specification, checked by :func:`parse_source_spec`."""


def load_source(spec: str) -> ArrayDataset:
    """Load a dataset from a source specification string.

    Parameters
    ----------
    spec : str
        ``"embedded"`` (scikit-learn digits), ``"mnist:PATH"`` (IDX folder),
        ``"cifar10:PATH"`` (python-version batches) or ``"hf:PATH"`` (:func:`load_hf_disk`),
        as :func:`parse_source_spec` reads them.

    Returns
    -------
    ArrayDataset
        The loaded dataset; for ``hf:PATH``, a test split the source provides is its
        ``test`` (kept by :func:`train_test_split`), never merged into the training data.

    Raises
    ------
    DataSourceError
        Unknown scheme, empty or non-existent PATH, or any loader error.
    """
    scheme, path = parse_source_spec(spec)
    if path is None:
        return load_embedded()
    if scheme == "hf":  # checks PATH itself, saying what it accepts
        _, options = hf_options(spec, spec.strip().partition(":")[2])
        return load_hf_disk(
            path, image_column=options["image"], label_column=options["label"], spec=spec
        )
    if not path.exists():
        raise DataSourceError(f"data source {spec!r}: path {str(path)!r} does not exist")
    loaders = {"mnist": load_mnist_idx, "cifar10": load_cifar10}
    return loaders[scheme](path)
