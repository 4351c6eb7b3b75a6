"""Data sources (numpy arrays, no network) and silo partitioning via flwr-datasets."""

from fl_lbbsp.datasets.partition import PartitionSpec, PartitionText, partition_indices
from fl_lbbsp.datasets.sources import (
    ArrayDataset,
    DataSourceError,
    SourceSpec,
    hf_source_spec,
    load_cifar10,
    load_embedded,
    load_hf_disk,
    load_mnist_idx,
    load_source,
    parse_source_spec,
    train_test_split,
)

__all__ = [
    "ArrayDataset",
    "DataSourceError",
    "PartitionSpec",
    "PartitionText",
    "SourceSpec",
    "hf_source_spec",
    "load_cifar10",
    "load_embedded",
    "load_hf_disk",
    "load_mnist_idx",
    "load_source",
    "parse_source_spec",
    "partition_indices",
    "train_test_split",
]
