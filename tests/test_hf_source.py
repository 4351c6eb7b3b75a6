"""A user's own data: ``--dataset hf:PATH``, a Hugging Face dataset on disk (a
``save_to_disk`` folder, a parquet, CSV, JSON-lines or arrow file, or a folder of such
files), read without a download and partitioned with flwr-datasets."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

from fl_lbbsp.cli import main
from fl_lbbsp.datasets import (
    ArrayDataset,
    DataSourceError,
    hf_source_spec,
    load_source,
    parse_source_spec,
    partition_indices,
    train_test_split,
)
from fl_lbbsp.telemetry import read_telemetry

N, SIDE, CLASSES = 40, 8, 4


def _pictures(n: int = N, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, SIDE, SIDE), dtype=np.uint8)


def _labels(n: int = N) -> list[int]:
    return [i % CLASSES for i in range(n)]


def _dataset(n: int = N, seed: int = 0) -> Dataset:
    """``n`` grey 8x8 images as nested lists of ints, integer labels 0..3."""
    return Dataset.from_dict({"image": _pictures(n, seed).tolist(), "label": _labels(n)})


def _rows(data: ArrayDataset) -> set[tuple[int, ...]]:
    """Each sample as (label, pixels*255...), to compare datasets whatever their order."""
    pixels = np.rint(data.x.reshape(len(data), -1) * 255).astype(np.int64)
    return {(int(y), *p.tolist()) for y, p in zip(data.y, pixels, strict=True)}


def _written_rows(n: int, *, seed: int) -> set[tuple[int, ...]]:
    """The rows of ``_dataset(n, seed)`` as :func:`_rows` gives them."""
    pictures = _pictures(n, seed).reshape(n, -1)
    return {(y, *p.tolist()) for y, p in zip(_labels(n), pictures, strict=True)}


def _write_arrow(path: Path, table: pa.Table, *, stream: bool) -> None:
    with pa.OSFile(str(path), "wb") as sink:
        opened = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opened(sink, table.schema) as writer:
            writer.write_table(table)


def _wide_columns(data: Dataset) -> Dataset:
    """MNIST-as-CSV layout: ``label, p0, ..., p63``."""
    flat = np.asarray(data["image"]).reshape(len(data), -1)
    columns: dict[str, list[int]] = {"label": data["label"]}
    columns.update({f"p{i}": flat[:, i].tolist() for i in range(flat.shape[1])})
    return Dataset.from_dict(columns)


def _json_cells(data: Dataset) -> Dataset:
    return data.map(lambda row: {"image": json.dumps(row["image"])})


WRITERS: dict[str, Callable[[Dataset, Path], Path]] = {
    "save_to_disk": lambda d, p: (d.save_to_disk(str(p / "saved")), p / "saved")[1],
    "parquet": lambda d, p: (d.to_parquet(str(p / "d.parquet")), p / "d.parquet")[1],
    "csv, lists as Dataset.to_csv prints them": lambda d, p: (
        d.to_csv(str(p / "d.csv"), index=False),
        p / "d.csv",
    )[1],
    "csv, lists as JSON": lambda d, p: (
        _json_cells(d).to_csv(str(p / "d.csv"), index=False),
        p / "d.csv",
    )[1],
    "csv, one column per pixel": lambda d, p: (
        _wide_columns(d).to_csv(str(p / "d.csv"), index=False),
        p / "d.csv",
    )[1],
    "jsonl": lambda d, p: (d.to_json(str(p / "d.jsonl")), p / "d.jsonl")[1],
    "json array": lambda d, p: (d.to_json(str(p / "d.json"), lines=False), p / "d.json")[1],
    "arrow stream": lambda d, p: (
        _write_arrow(p / "d.arrow", d.data.table, stream=True),
        p / "d.arrow",
    )[1],
    "arrow file": lambda d, p: (
        _write_arrow(p / "d.arrow", d.data.table, stream=False),
        p / "d.arrow",
    )[1],
    "folder of parquet shards": lambda d, p: (
        (p / "shards").mkdir(),
        d.select(range(25)).to_parquet(str(p / "shards" / "train-0.parquet")),
        d.select(range(25, len(d))).to_parquet(str(p / "shards" / "train-1.parquet")),
        p / "shards",
    )[-1],
}


@pytest.mark.parametrize("form", list(WRITERS))
def test_every_accepted_form_loads_the_same_arrays(tmp_path: Path, form: str) -> None:
    # Prepare: 40 grey 8x8 images with labels 0..3, written in one of the accepted forms
    path = WRITERS[form](_dataset(), tmp_path)

    # Execute
    data = load_source(f"hf:{path}")

    # Assert: [40, 1, 8, 8] float32 pixels / 255 in the rows' order, labels as written
    assert data.x.shape == (N, 1, SIDE, SIDE) and data.x.dtype == np.float32
    np.testing.assert_allclose(data.x[:, 0], _pictures() / 255.0, rtol=1e-6)
    assert data.y.tolist() == _labels() and data.num_classes == CLASSES
    assert data.test is None


@pytest.fixture
def grey_digits(tmp_path: Path) -> Path:
    """60 grey 8x8 images (datasets.Image) with ClassLabel labels of 3 classes."""
    import PIL.Image

    features = Features({"image": Image(), "label": ClassLabel(names=["a", "b", "c"])})
    data = Dataset.from_dict(
        {
            "image": [PIL.Image.fromarray(p) for p in _pictures(60)],
            "label": [i % 3 for i in range(60)],
        },
        features=features,
    )
    path = tmp_path / "grey"
    data.save_to_disk(str(path))
    return path


@pytest.mark.parametrize("as_parquet", [False, True])
def test_encoded_images_load_in_0_1_and_partition(
    grey_digits: Path, tmp_path: Path, as_parquet: bool
) -> None:
    # Prepare: the Image/ClassLabel dataset as saved, or as parquet (features kept)
    path = grey_digits
    if as_parquet:
        path = tmp_path / "grey.parquet"
        Dataset.load_from_disk(str(grey_digits)).to_parquet(str(path))

    # Execute
    data = load_source(f"hf:{path}")
    parts = partition_indices(data.y, num_silos=3, spec="labels:1", seed=0)

    # Assert: [60, 1, 8, 8] float32 in [0, 1], the ClassLabel's 3 classes, one per silo
    assert data.x.shape == (60, 1, SIDE, SIDE) and data.x.dtype == np.float32
    np.testing.assert_allclose(data.x[0, 0], _pictures(60)[0] / 255.0, rtol=1e-6)
    assert data.num_classes == 3 and list(data.y[:4]) == [0, 1, 2, 0]
    assert [sorted(set(data.y[p].tolist())) for p in parts] == [[0], [1], [2]]


def _dict_on_disk(train: Dataset, test: Dataset, root: Path) -> Path:
    DatasetDict({"train": train, "test": test}).save_to_disk(str(root / "dict"))
    return root / "dict"


def _hub_layout(train: Dataset, test: Dataset, root: Path) -> Path:
    (root / "repo" / "data").mkdir(parents=True)
    (root / "repo" / "README.md").write_text("# my data\n")
    train.to_parquet(str(root / "repo" / "data" / "train-00000-of-00001.parquet"))
    test.to_parquet(str(root / "repo" / "data" / "test-00000-of-00001.parquet"))
    return root / "repo"


def _csv_pair(train: Dataset, test: Dataset, root: Path) -> Path:
    (root / "csvs").mkdir()
    _wide_columns(train).to_csv(str(root / "csvs" / "mnist_train.csv"), index=False)
    _wide_columns(test).to_csv(str(root / "csvs" / "mnist_test.csv"), index=False)
    return root / "csvs"


def _split_folders(train: Dataset, test: Dataset, root: Path) -> Path:
    for split, data in (("train", train), ("test", test)):
        (root / "arrows" / split).mkdir(parents=True)
        _write_arrow(root / "arrows" / split / "part-0.arrow", data.data.table, stream=True)
    return root / "arrows"


@pytest.mark.parametrize(
    "layout",
    [_dict_on_disk, _hub_layout, _csv_pair, _split_folders],
    ids=["DatasetDict", "hub-layout-parquet", "mnist_train+mnist_test.csv", "train/+test/"],
)
def test_a_provided_test_split_is_kept_as_the_test_set(
    tmp_path: Path, layout: Callable[[Dataset, Path], Path]
) -> None:
    # Prepare: 40 training and 12 test images, different pictures
    train, test = _dataset(N, seed=0), _dataset(12, seed=1)
    path = layout(train, test, tmp_path)

    # Execute
    data = load_source(f"hf:{path}")
    split_train, split_test = train_test_split(data, test_fraction=0.5, seed=3)

    # Assert: training data without the test rows; the split returns the source's test set
    assert len(data) == N and data.test is not None and len(data.test) == 12
    assert _rows(data) == _written_rows(N, seed=0)
    assert _rows(data.test) == _written_rows(12, seed=1)
    assert _rows(split_train) == _rows(data) and _rows(split_test) == _rows(data.test)
    assert data.test.num_classes == data.num_classes == CLASSES


def test_validation_is_training_data_and_labels_share_one_mapping(tmp_path: Path) -> None:
    # Prepare: string labels; the test split has a class the training splits lack
    def split(labels: list[str], seed: int) -> Dataset:
        return Dataset.from_dict({"image": _pictures(len(labels), seed).tolist(), "label": labels})

    DatasetDict(
        {
            "train": split(["cat", "dog"] * 4, 0),
            "validation": split(["dog"] * 3, 1),
            "test": split(["ant", "cat"], 2),
        }
    ).save_to_disk(str(tmp_path / "pets"))

    # Execute
    data = load_source(f"hf:{tmp_path / 'pets'}")

    # Assert: train + validation for training; ant=0, cat=1, dog=2 in both
    assert len(data) == 11 and data.test is not None and data.num_classes == 3
    assert data.y.tolist() == [1, 2] * 4 + [2] * 3 and data.test.y.tolist() == [0, 1]


@pytest.mark.parametrize("only_test", ["DatasetDict", "file named test"])
def test_a_source_with_only_a_test_split_is_all_training_data(
    tmp_path: Path, only_test: str
) -> None:
    # Prepare
    if only_test == "DatasetDict":
        path = tmp_path / "dict"
        DatasetDict({"test": _dataset()}).save_to_disk(str(path))
    else:
        path = tmp_path / "test.parquet"
        _dataset().to_parquet(str(path))

    # Execute
    data = load_source(f"hf:{path}")

    # Assert: the runs cut their own test set
    assert len(data) == N and data.test is None


def test_named_columns_colour_arrays_and_string_labels(tmp_path: Path) -> None:
    # Prepare: H x W x 3 arrays under "img", string labels "y"
    rng = np.random.default_rng(1)
    Dataset.from_dict(
        {
            "img": [rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8) for _ in range(10)],
            "y": ["cat", "dog"] * 5,
        }
    ).to_parquet(str(tmp_path / "pets.parquet"))
    spec = hf_source_spec(tmp_path / "pets.parquet", image_column="img", label_column="y")

    # Execute
    data = load_source(spec)

    # Assert: channels first, classes in sorted order
    assert spec == f"hf:{tmp_path / 'pets.parquet'}?image=img&label=y"
    assert data.x.shape == (10, 3, SIDE, SIDE) and data.num_classes == 2
    assert list(data.y[:2]) == [0, 1]


def test_nothing_is_fetched_over_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: a parquet file and a folder of CSVs; every socket connection fails
    _dataset().to_parquet(str(tmp_path / "d.parquet"))
    folder = _csv_pair(_dataset(), _dataset(12), tmp_path)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("hf:PATH tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)

    # Execute / Assert: both load
    assert len(load_source(f"hf:{tmp_path / 'd.parquet'}")) == N
    assert len(load_source(f"hf:{folder}")) == N


def _save(path: Path, columns: dict) -> Path:  # type: ignore[type-arg]
    Dataset.from_dict(columns).save_to_disk(str(path))
    return path


@pytest.mark.parametrize(
    ("columns", "query", "error"),
    [
        ({"pixels": [[[0]]] * 4, "label": [0] * 4}, "", "no column 'image'.*--hf-image-column"),
        ({"image": [[[0]]] * 4, "label": [0] * 4}, "?label=kind", "no column 'kind'"),
        ({f"p{i}": [0, 1] for i in range(4)}, "", "no column 'image'.*has p0, p1, p2, p3$"),
        ({"image": ["a", "b"], "label": [0, 1]}, "", "images of one size"),
        ({"image": [[[0, 1]], [[0]]], "label": [0, 1]}, "", "images of one size"),
        ({"image": [[0, 1, 2]] * 2, "label": [0, 1]}, "", "images of one size"),
        ({"image": [[[300]], [[0]]], "label": [0, 1]}, "", "0..255"),
        ({"image": [[[0]], [[1]]], "label": [0.5, 1.5]}, "", "class labels"),
        ({"image": [[[0]], [[1]]], "label": [-1, 1]}, "", ">= 0"),
        ({"image": [[[0]]], "label": [0]}, "", "at least 2 training samples"),
        (None, "?colour=x", "bad option 'colour=x'"),
    ],
)
def test_bad_hf_data_is_refused_in_one_line(
    tmp_path: Path,
    columns: dict | None,  # type: ignore[type-arg]
    query: str,
    error: str,
) -> None:
    # Prepare: a saved dataset with bad values, or a folder that is none
    path = tmp_path / "data"
    if columns is None:
        path.mkdir()
    else:
        _save(path, columns)

    # Execute / Assert
    with pytest.raises(DataSourceError, match=error) as info:
        load_source(f"hf:{path}{query}")
    assert "\n" not in str(info.value)


def _garbage_parquet(root: Path) -> Path:
    (root / "d.parquet").write_bytes(b"not a parquet file at all")
    return root / "d.parquet"


def _text_file(root: Path) -> Path:
    (root / "d.txt").write_text("image,label\n")
    return root / "d.txt"


def _no_extension(root: Path) -> Path:
    (root / "data").write_text("image,label\n")
    return root / "data"


def _empty_folder(root: Path) -> Path:
    (root / "empty").mkdir()
    (root / "empty" / "notes.md").write_text("nothing here\n")
    return root / "empty"


def _mixed_folder(root: Path) -> Path:
    (root / "mixed").mkdir()
    _dataset().to_parquet(str(root / "mixed" / "a.parquet"))
    _dataset().to_csv(str(root / "mixed" / "b.csv"), index=False)
    return root / "mixed"


def _broken_save(root: Path) -> Path:
    (root / "saved").mkdir()
    (root / "saved" / "state.json").write_text("{")
    return root / "saved"


def _shortened_cells(root: Path) -> Path:
    (root / "d.csv").write_text("image,label\n[0 1 ... 9],0\n[0 1 ... 9],1\n")
    return root / "d.csv"


def _mismatched_splits(root: Path) -> Path:
    small = Dataset.from_dict({"image": [[[0, 1], [2, 3]]] * 2, "label": [0, 1]})
    return _dict_on_disk(_dataset(), small, root)


ACCEPTED = r"expected a directory written by datasets' save_to_disk .* \.parquet, \.csv, "


@pytest.mark.parametrize(
    ("make", "error", "lists_accepted"),
    [
        (lambda root: root / "missing.parquet", r"path '.*missing\.parquet' does not exist", True),
        (_text_file, r"file '.*d\.txt' has extension '\.txt', not a format it can read", True),
        (_no_extension, r"file '.*data' has no extension, not a format it can read", True),
        (_garbage_parquet, r"file '.*d\.parquet' cannot be read as parquet \(.+\)", True),
        (_empty_folder, r"directory '.*empty' is not a folder written by save_to_disk", True),
        (_mixed_folder, r"directory '.*mixed' mixes formats \(csv, parquet\)", False),
        (_broken_save, r"directory '.*saved' looks like a save_to_disk folder but cannot", False),
        (_shortened_cells, r"shortened with '\.\.\.'.*JSON lists or one column per pixel", False),
        (_mismatched_splits, r"splits hold images of different sizes \(train .*, test", False),
    ],
    ids=[
        "missing",
        "txt",
        "no-extension",
        "corrupt-parquet",
        "empty-dir",
        "mixed-dir",
        "broken-save",
        "csv-shortened",
        "split-sizes",
    ],
)
def test_a_wrong_path_says_what_it_is_and_what_is_accepted(
    tmp_path: Path, make: Callable[[Path], Path], error: str, lists_accepted: bool
) -> None:
    # Prepare
    path = make(tmp_path)

    # Execute
    with pytest.raises(DataSourceError, match=error) as info:
        load_source(f"hf:{path}")

    # Assert: one line; a path refused for what it is lists the accepted forms, and a
    # file is never called a directory
    message = str(info.value)
    assert "\n" not in message
    assert bool(re.search(ACCEPTED, message)) == lists_accepted
    if path.is_file():
        assert "directory" not in message.split(";")[0]


@pytest.mark.parametrize(
    "test_split",
    [
        ArrayDataset(
            x=np.zeros((2, 1, 4, 4), np.float32), y=np.zeros(2, np.int64), num_classes=2, name="t"
        ),
        ArrayDataset(
            x=np.zeros((2, 1, 2, 2), np.float32), y=np.zeros(2, np.int64), num_classes=3, name="t"
        ),
    ],
    ids=["image-size", "classes"],
)
def test_a_test_split_that_does_not_match_is_refused(test_split: ArrayDataset) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="does not match the data"):
        ArrayDataset(
            x=np.zeros((3, 1, 2, 2), np.float32),
            y=np.zeros(3, np.int64),
            num_classes=2,
            name="d",
            test=test_split,
        )


def test_an_hf_spec_is_checked_without_loading() -> None:
    # Execute / Assert
    assert parse_source_spec("hf:/x/y?image=a") == ("hf", Path("/x/y"))
    with pytest.raises(DataSourceError, match="empty PATH"):
        parse_source_spec("hf:?image=a")


def test_simulate_runs_on_a_users_parquet_files(tmp_path: Path) -> None:
    # Prepare: a folder of train/test parquet files with the columns named otherwise
    renamed = {"image": "scan", "label": "finding"}
    folder = tmp_path / "scans"
    folder.mkdir()
    _dataset(60).rename_columns(renamed).to_parquet(str(folder / "train.parquet"))
    _dataset(12, seed=1).rename_columns(renamed).to_parquet(str(folder / "test.parquet"))
    argv = [
        "simulate", "--dataset", f"hf:{folder}", "--hf-image-column", "scan",
        "--hf-label-column", "finding", "--silos", "3", "--partition", "iid",
        "--rounds", "2", "--local-steps", "2", "--batch-size", "4", "--model", "mlp",
        "--in-process", "--no-wait", "--quiet", "--cost-model", "0.001,0.002",
        "--out", str(tmp_path / "out"),
    ]  # fmt: skip

    # Execute
    code = main(argv)

    # Assert: two rounds on the user's data, its columns recorded in the run's config
    assert code == 0
    events = read_telemetry(tmp_path / "out" / "lbbsp.jsonl")
    config = next(e for e in events if e["event"] == "config")
    assert config["dataset"] == f"hf:{folder}?image=scan&label=finding"
    assert len([e for e in events if e["event"] == "train"]) == 2


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--hf-image-column", "scan"], "--hf-image-column: only with --dataset hf:PATH"),
        (["--dataset", "hf:/does/not/exist"], "'/does/not/exist' does not exist; expected a"),
        (["--dataset", "hf:{txt}"], "file '{txt}' has extension '.txt'"),
    ],
    ids=["flag-without-hf", "missing", "txt-file"],
)
def test_hf_flags_and_paths_fail_before_round_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], error: str
) -> None:
    # Prepare
    txt = tmp_path / "labels.txt"
    txt.write_text("0\n1\n")
    extra = [a.format(txt=txt) for a in extra]

    # Execute
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--in-process", "--quiet", "--out", str(tmp_path), *extra])

    # Assert: exit 2, one line, no traceback
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert error.format(txt=txt) in err and len(err.splitlines()) == 1
    assert "Traceback" not in err
