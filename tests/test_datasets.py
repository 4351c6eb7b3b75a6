"""Tests for fl_lbbsp.datasets: data sources and silo partitioning."""

from __future__ import annotations

import gzip
import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from fl_lbbsp.datasets import (
    ArrayDataset,
    DataSourceError,
    PartitionSpec,
    load_cifar10,
    load_embedded,
    load_mnist_idx,
    load_source,
    partition_indices,
    train_test_split,
)

REAL_MNIST = Path(__file__).resolve().parents[2] / "shared/data/mnist"


@pytest.fixture(scope="module")
def digits() -> ArrayDataset:
    return load_embedded()


def _write_idx_pair(folder: Path, images: np.ndarray, labels: np.ndarray, prefix: str) -> None:
    """Write images/labels as gzip-compressed IDX files (ubyte)."""
    img_header = struct.pack(">BBBB", 0, 0, 0x08, 3) + struct.pack(">III", *images.shape)
    lab_header = struct.pack(">BBBB", 0, 0, 0x08, 1) + struct.pack(">I", labels.shape[0])
    (folder / f"{prefix}-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(img_header + images.astype(np.uint8).tobytes())
    )
    (folder / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(lab_header + labels.astype(np.uint8).tobytes())
    )


def _tiny_mnist(folder: Path, n: int = 12, prefix: str = "t10k") -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = np.arange(n, dtype=np.uint8) % 10
    _write_idx_pair(folder, images, labels, prefix)
    return images, labels


# ------------------------------------------------------------------------------------------
# Embedded digits
# ------------------------------------------------------------------------------------------


def test_embedded_digits_shape_and_range(digits: ArrayDataset) -> None:
    # Prepare / Execute: fixture loads scikit-learn's digits
    data = digits

    # Assert
    assert len(data) == 1797
    assert data.num_classes == 10
    assert data.input_shape == (1, 32, 32)
    assert data.x.dtype == np.float32 and data.y.dtype == np.int64
    assert float(data.x.min()) >= 0.0 and float(data.x.max()) <= 1.0
    assert float(data.x.max()) == 1.0
    assert set(np.unique(data.y).tolist()) == set(range(10))


def test_subset_selects_rows(digits: ArrayDataset) -> None:
    # Prepare
    idx = np.array([5, 0, 7])

    # Execute
    sub = digits.subset(idx)

    # Assert
    assert len(sub) == 3
    np.testing.assert_array_equal(sub.y, digits.y[idx])
    np.testing.assert_array_equal(sub.x, digits.x[idx])
    assert sub.num_classes == digits.num_classes and sub.name == digits.name


def test_train_test_split_is_stratified_and_deterministic(digits: ArrayDataset) -> None:
    # Prepare / Execute
    train_a, test_a = train_test_split(digits, test_fraction=0.2, seed=3)
    train_b, test_b = train_test_split(digits, test_fraction=0.2, seed=3)
    _, test_c = train_test_split(digits, test_fraction=0.2, seed=4)

    # Assert
    assert len(train_a) + len(test_a) == len(digits)
    assert len(test_a) == round(0.2 * len(digits))
    np.testing.assert_array_equal(test_a.y, test_b.y)
    np.testing.assert_array_equal(train_a.x, train_b.x)
    assert not np.array_equal(test_a.x, test_c.x)
    full = np.bincount(digits.y, minlength=10)
    part = np.bincount(test_a.y, minlength=10)
    assert np.all(np.abs(part - 0.2 * full) <= 1.0)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_train_test_split_rejects_bad_fraction(digits: ArrayDataset, fraction: float) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="test_fraction"):
        train_test_split(digits, test_fraction=fraction)


# ------------------------------------------------------------------------------------------
# MNIST (IDX)
# ------------------------------------------------------------------------------------------


def test_real_mnist_test_set() -> None:
    # Prepare
    if not (REAL_MNIST / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST not found at {REAL_MNIST}")
    assert (REAL_MNIST / "MD5SUMS").is_file(), "MD5SUMS expected beside the real MNIST files"

    # Execute (verifies the MD5 sums listed in MD5SUMS, raising on mismatch)
    data = load_mnist_idx(REAL_MNIST)

    # Assert
    assert len(data) == 10_000
    assert data.input_shape == (1, 28, 28)
    assert data.num_classes == 10 and data.name == "mnist"
    assert set(np.unique(data.y).tolist()) == set(range(10))
    assert float(data.x.min()) >= 0.0 and float(data.x.max()) <= 1.0


def test_mnist_tiny_gz_roundtrip(tmp_path: Path) -> None:
    # Prepare
    images, labels = _tiny_mnist(tmp_path)

    # Execute
    data = load_mnist_idx(tmp_path)

    # Assert
    assert data.x.shape == (12, 1, 28, 28) and data.x.dtype == np.float32
    np.testing.assert_array_equal(data.y, labels.astype(np.int64))
    np.testing.assert_allclose(data.x[:, 0], images / 255.0, rtol=0, atol=1e-7)


def test_mnist_prefers_train_files(tmp_path: Path) -> None:
    # Prepare
    _tiny_mnist(tmp_path, n=4, prefix="t10k")
    _tiny_mnist(tmp_path, n=7, prefix="train")

    # Execute
    data = load_mnist_idx(tmp_path)

    # Assert
    assert len(data) == 7


def test_mnist_md5_verified_when_listed(tmp_path: Path) -> None:
    # Prepare: correct MD5SUMS for both files
    _tiny_mnist(tmp_path)
    lines = [
        f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.name}"
        for p in sorted(tmp_path.glob("*.gz"))
    ]
    (tmp_path / "MD5SUMS").write_text("\n".join(lines) + "\n")

    # Execute
    data = load_mnist_idx(tmp_path)

    # Assert
    assert len(data) == 12


def test_mnist_corrupted_md5sums_entry_raises(tmp_path: Path) -> None:
    # Prepare
    _tiny_mnist(tmp_path)
    (tmp_path / "MD5SUMS").write_text(f"{'0' * 32}  t10k-images-idx3-ubyte.gz\n")

    # Execute / Assert
    with pytest.raises(DataSourceError, match="MD5 mismatch"):
        load_mnist_idx(tmp_path)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (struct.pack(">BBBB", 0, 0, 0x08, 2), "magic number"),
        (struct.pack(">BBBB", 1, 2, 0x08, 3), "magic number"),
        (struct.pack(">BBBB", 0, 0, 0x0D, 3), "magic number"),
        (b"\x00\x00", "header"),
        (struct.pack(">BBBB", 0, 0, 0x08, 3) + struct.pack(">III", 99, 28, 28), "dims"),
    ],
    ids=["wrong-ndim", "nonzero-prefix", "float-type", "truncated", "size-mismatch"],
)
def test_mnist_corrupt_header_raises(tmp_path: Path, header: bytes, match: str) -> None:
    # Prepare: valid labels, corrupt image file
    _tiny_mnist(tmp_path)
    body = b"" if len(header) < 4 else bytes(12 * 28 * 28)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + body))

    # Execute / Assert
    with pytest.raises(DataSourceError, match=match):
        load_mnist_idx(tmp_path)


@pytest.mark.parametrize("missing", ["folder", "labels"])
def test_mnist_missing_inputs_raise(tmp_path: Path, missing: str) -> None:
    # Prepare
    _tiny_mnist(tmp_path)
    target = tmp_path / "nope"
    if missing == "labels":
        (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
        target = tmp_path

    # Execute / Assert
    with pytest.raises(DataSourceError, match="not found|no MNIST"):
        load_mnist_idx(target)


# ------------------------------------------------------------------------------------------
# CIFAR-10 (python batches)
# ------------------------------------------------------------------------------------------


def _write_cifar_batch(path: Path, n: int, label_offset: int = 0) -> np.ndarray:
    """Write a batch whose red channel holds a known ramp; green/blue are constant."""
    data = np.zeros((n, 3072), dtype=np.uint8)
    ramp = (np.arange(1024) % 251).astype(np.uint8)
    data[:, :1024] = ramp  # red plane (channel-major: R then G then B)
    data[:, 1024:2048] = 7  # green plane
    data[:, 2048:] = 200  # blue plane
    labels = [(i + label_offset) % 10 for i in range(n)]
    with path.open("wb") as fh:
        pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, fh)
    return np.asarray(labels)


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "cifar-10-batches-py"])
def test_cifar10_channel_order_and_labels(tmp_path: Path, nested: bool) -> None:
    # Prepare
    folder = tmp_path / "cifar-10-batches-py" if nested else tmp_path
    folder.mkdir(exist_ok=True)
    labels_train = _write_cifar_batch(folder / "data_batch_1", n=4)
    labels_test = _write_cifar_batch(folder / "test_batch", n=3, label_offset=5)

    # Execute
    data = load_cifar10(tmp_path)

    # Assert
    assert data.x.shape == (7, 3, 32, 32) and data.x.dtype == np.float32
    assert data.input_shape == (3, 32, 32) and data.num_classes == 10
    np.testing.assert_array_equal(data.y, np.concatenate([labels_train, labels_test]))
    expected_red = ((np.arange(1024) % 251) / 255.0).reshape(32, 32)
    np.testing.assert_allclose(data.x[:, 0], np.broadcast_to(expected_red, (7, 32, 32)), atol=1e-7)
    np.testing.assert_allclose(data.x[:, 1], 7 / 255.0, atol=1e-7)
    np.testing.assert_allclose(data.x[:, 2], 200 / 255.0, atol=1e-7)
    assert data.x[0, 0, 0, 1] == pytest.approx(1 / 255.0)  # row-major within a plane


@pytest.mark.parametrize("case", ["missing-folder", "no-batches", "bad-format"])
def test_cifar10_errors(tmp_path: Path, case: str) -> None:
    # Prepare
    target = tmp_path
    if case == "missing-folder":
        target = tmp_path / "absent"
    elif case == "bad-format":
        with (tmp_path / "data_batch_1").open("wb") as fh:
            pickle.dump({b"data": np.zeros((2, 10), dtype=np.uint8), b"labels": [0, 1]}, fh)

    # Execute / Assert
    with pytest.raises(DataSourceError):
        load_cifar10(target)


# ------------------------------------------------------------------------------------------
# load_source
# ------------------------------------------------------------------------------------------


def test_load_source_dispatch(tmp_path: Path) -> None:
    # Prepare
    _tiny_mnist(tmp_path)
    _write_cifar_batch(tmp_path / "test_batch", n=2)

    # Execute
    mnist = load_source(f"mnist:{tmp_path}")
    cifar = load_source(f"cifar10:{tmp_path}")
    embedded = load_source("embedded")

    # Assert
    assert (mnist.name, len(mnist)) == ("mnist", 12)
    assert (cifar.name, len(cifar)) == ("cifar10", 2)
    assert embedded.input_shape == (1, 32, 32)


def test_embedded_upscale_repeats_the_real_pixels() -> None:
    # Prepare
    native = load_embedded(upscale=1)

    # Execute
    enlarged = load_embedded(upscale=4)

    # Assert: every 4x4 block of the enlarged image is one pixel of the original
    assert native.input_shape == (1, 8, 8)
    assert np.array_equal(enlarged.x[:, :, ::4, ::4], native.x)
    assert np.array_equal(enlarged.x[:, :, 3::4, 3::4], native.x)


@pytest.mark.parametrize(
    "spec", ["imagenet:/tmp", "foo", "", "mnist", "cifar10:", "Embedded", "svhn:/data"]
)
def test_load_source_unknown_spec(spec: str) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(DataSourceError) as info:
        load_source(spec)
    assert repr(spec) in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("scheme", ["mnist", "cifar10"])
def test_load_source_missing_path(tmp_path: Path, scheme: str) -> None:
    # Prepare
    missing = tmp_path / "does-not-exist"

    # Execute / Assert
    with pytest.raises(DataSourceError, match="does not exist") as info:
        load_source(f"{scheme}:{missing}")
    assert str(missing) in str(info.value)


# ------------------------------------------------------------------------------------------
# Partitioning
# ------------------------------------------------------------------------------------------


def _assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    merged = np.concatenate(parts)
    assert merged.size == n
    np.testing.assert_array_equal(np.sort(merged), np.arange(n))


def test_iid_covers_every_index_once(digits: ArrayDataset) -> None:
    # Prepare / Execute
    parts = partition_indices(digits.y, num_silos=5, spec="iid", seed=0)

    # Assert
    assert len(parts) == 5
    _assert_disjoint_cover(parts, len(digits))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    for p in parts:  # shuffled before sharding, so every silo sees (nearly) every class
        assert len(np.unique(digits.y[p])) >= 9


def test_labels2_five_silos_gets_two_disjoint_classes_each(digits: ArrayDataset) -> None:
    # Prepare / Execute
    parts = partition_indices(digits.y, num_silos=5, spec=PartitionSpec.parse("labels:2"))

    # Assert
    class_sets = [set(np.unique(digits.y[p]).tolist()) for p in parts]
    assert all(len(s) == 2 for s in class_sets)
    assert set().union(*class_sets) == set(range(10))  # disjoint: 5 x 2 = 10 classes
    _assert_disjoint_cover(parts, len(digits))


def test_labels_more_silos_than_class_blocks(digits: ArrayDataset) -> None:
    # Prepare / Execute: 10 silos x 2 classes > 10 classes, blocks are shared
    parts = partition_indices(digits.y, num_silos=10, spec="labels:2", seed=1)

    # Assert
    assert all(len(np.unique(digits.y[p])) == 2 for p in parts)
    _assert_disjoint_cover(parts, len(digits))


def test_dirichlet_nonempty_and_deterministic(digits: ArrayDataset) -> None:
    # Prepare / Execute
    a = partition_indices(digits.y, num_silos=5, spec="dirichlet:0.5", seed=7)
    b = partition_indices(digits.y, num_silos=5, spec="dirichlet:0.5", seed=7)
    c = partition_indices(digits.y, num_silos=5, spec="dirichlet:0.5", seed=8)

    # Assert
    assert all(len(p) > 0 for p in a)
    _assert_disjoint_cover(a, len(digits))
    for pa, pb in zip(a, b, strict=True):
        np.testing.assert_array_equal(pa, pb)
    assert any(not np.array_equal(pa, pc) for pa, pc in zip(a, c, strict=True))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("iid", PartitionSpec(kind="iid")),
        (" labels:2 ", PartitionSpec(kind="labels", classes_per_silo=2)),
        ("dirichlet:0.3", PartitionSpec(kind="dirichlet", alpha=0.3)),
    ],
)
def test_partition_spec_parse(text: str, expected: PartitionSpec) -> None:
    # Prepare / Execute
    spec = PartitionSpec.parse(text)

    # Assert
    assert spec == expected
    assert PartitionSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(
    "text",
    [
        "labels:0",
        "labels:x",
        "dirichlet:-1",
        "foo",
        "dirichlet:",
        "labels",
        "iid:3",
        "dirichlet:nan",
        "labels:2.5",
        "",
    ],
)
def test_partition_spec_parse_failures(text: str) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError) as info:
        PartitionSpec.parse(text)
    message = str(info.value)
    assert repr(text) in message
    assert "labels:K" in message and "dirichlet:ALPHA" in message


@pytest.mark.parametrize(
    ("y", "num_silos", "spec", "match"),
    [
        ([0, 1, 2], 5, "iid", "at most 3 silos"),
        ([0, 1, 2], 0, "iid", "positive integer"),
        (list(range(10)) * 2, 2, "labels:11", "only 10 classes"),
        ([0, 0, 0, 0, 1], 4, "labels:1", "cannot split"),
        ([0.5, 1.0], 1, "iid", "integers"),
    ],
    ids=["more-silos-than-samples", "zero-silos", "too-many-classes", "class-too-small", "float"],
)
def test_partition_indices_errors(y: list[float], num_silos: int, spec: str, match: str) -> None:
    # Prepare
    labels = np.asarray(y)

    # Execute / Assert
    with pytest.raises(ValueError, match=match):
        partition_indices(labels, num_silos=num_silos, spec=spec)
