"""A user's own data: ``--dataset hf:PATH``, a Hugging Face dataset saved with
``save_to_disk``, read without a download and partitioned with flwr-datasets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

from fl_lbbsp.cli import main
from fl_lbbsp.datasets import (
    DataSourceError,
    hf_source_spec,
    load_source,
    parse_source_spec,
    partition_indices,
)
from fl_lbbsp.telemetry import read_telemetry

N, SIDE = 60, 8


def _pictures(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (SIDE, SIDE), dtype=np.uint8) for _ in range(N)]


@pytest.fixture
def grey_digits(tmp_path: Path) -> Path:
    """60 grey 8x8 images (datasets.Image) with ClassLabel labels of 3 classes."""
    import PIL.Image

    features = Features({"image": Image(), "label": ClassLabel(names=["a", "b", "c"])})
    data = Dataset.from_dict(
        {
            "image": [PIL.Image.fromarray(p) for p in _pictures()],
            "label": [i % 3 for i in range(N)],
        },
        features=features,
    )
    path = tmp_path / "grey"
    data.save_to_disk(str(path))
    return path


def test_hf_dataset_loads_as_images_in_0_1_and_partitions(grey_digits: Path) -> None:
    # Execute
    data = load_source(f"hf:{grey_digits}")
    parts = partition_indices(data.y, num_silos=3, spec="labels:1", seed=0)

    # Assert: [N, 1, 8, 8] float32 in [0, 1], the ClassLabel's 3 classes, one per silo
    assert data.x.shape == (N, 1, SIDE, SIDE) and data.x.dtype == np.float32
    np.testing.assert_allclose(data.x[0, 0], _pictures()[0] / 255.0, rtol=1e-6)
    assert data.num_classes == 3 and list(data.y[:4]) == [0, 1, 2, 0]
    assert [sorted(set(data.y[p].tolist())) for p in parts] == [[0], [1], [2]]


def test_named_columns_colour_arrays_string_labels_and_splits(tmp_path: Path) -> None:
    # Prepare: a DatasetDict of two splits, H x W x 3 arrays under "img", string labels "y"
    rng = np.random.default_rng(1)
    split = {
        "img": [rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8) for _ in range(10)],
        "y": ["cat", "dog"] * 5,
    }
    DatasetDict({"train": Dataset.from_dict(split), "test": Dataset.from_dict(split)}).save_to_disk(
        str(tmp_path / "pets")
    )
    spec = hf_source_spec(tmp_path / "pets", image_column="img", label_column="y")

    # Execute
    data = load_source(spec)

    # Assert: both splits, channels first, classes in sorted order
    assert spec == f"hf:{tmp_path / 'pets'}?image=img&label=y"
    assert data.x.shape == (20, 3, SIDE, SIDE) and data.num_classes == 2
    assert list(data.y[:2]) == [0, 1]


def _save(path: Path, columns: dict) -> Path:  # type: ignore[type-arg]
    Dataset.from_dict(columns).save_to_disk(str(path))
    return path


@pytest.mark.parametrize(
    ("columns", "query", "error"),
    [
        ({"pixels": [[[0]]] * 4, "label": [0] * 4}, "", "no column 'image'.*--hf-image-column"),
        ({"image": [[[0]]] * 4, "label": [0] * 4}, "?label=kind", "no column 'kind'"),
        ({"image": ["a", "b"], "label": [0, 1]}, "", "images of one size"),
        ({"image": [[[0, 1]], [[0]]], "label": [0, 1]}, "", "images of one size"),
        ({"image": [[[300]], [[0]]], "label": [0, 1]}, "", "0..255"),
        ({"image": [[[0]], [[1]]], "label": [0.5, 1.5]}, "", "class labels"),
        ({"image": [[[0]], [[1]]], "label": [-1, 1]}, "", ">= 0"),
        ({"image": [[[0]]], "label": [0]}, "", "at least 2 samples"),
        (None, "", "not a saved Hugging Face dataset"),
        (None, "?colour=x", "bad option 'colour=x'"),
    ],
)
def test_bad_hf_sources_are_refused_in_one_line(
    tmp_path: Path,
    columns: dict | None,  # type: ignore[type-arg]
    query: str,
    error: str,
) -> None:
    # Prepare: a saved dataset, or a folder that is none
    path = tmp_path / "data"
    if columns is None:
        path.mkdir()
    else:
        _save(path, columns)

    # Execute / Assert
    with pytest.raises(DataSourceError, match=error) as info:
        load_source(f"hf:{path}{query}")
    assert "\n" not in str(info.value)


def test_an_hf_spec_is_checked_without_loading() -> None:
    # Execute / Assert
    assert parse_source_spec("hf:/x/y?image=a") == ("hf", Path("/x/y"))
    with pytest.raises(DataSourceError, match="empty PATH"):
        parse_source_spec("hf:?image=a")


def test_simulate_runs_on_a_users_hf_dataset(grey_digits: Path, tmp_path: Path) -> None:
    # Prepare: rename the columns on disk to show the flags
    renamed = tmp_path / "renamed"
    Dataset.load_from_disk(str(grey_digits)).rename_columns(
        {"image": "scan", "label": "finding"}
    ).save_to_disk(str(renamed))
    argv = [
        "simulate", "--dataset", f"hf:{renamed}", "--hf-image-column", "scan",
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
    assert config["dataset"] == f"hf:{renamed}?image=scan&label=finding"
    assert len([e for e in events if e["event"] == "train"]) == 2


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--hf-image-column", "scan"], "--hf-image-column: only with --dataset hf:PATH"),
        (["--dataset", "hf:/does/not/exist"], "does not exist"),
    ],
)
def test_hf_flags_and_paths_fail_before_round_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], error: str
) -> None:
    # Execute
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--in-process", "--quiet", "--out", str(tmp_path), *extra])

    # Assert: exit 2, one line
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert error in err and len(err.splitlines()) == 1
