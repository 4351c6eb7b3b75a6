"""Data sources (numpy arrays, no network) and silo partitioning via flwr-datasets."""

from fl_lbbsp.datasets.partition import PartitionSpec, partition_indices
from fl_lbbsp.datasets.sources import (
    ArrayDataset,
    DataSourceError,
    load_cifar10,
    load_embedded,
    load_mnist_idx,
    load_source,
    train_test_split,
)

__all__ = [
    "ArrayDataset",
    "DataSourceError",
    "PartitionSpec",
    "load_cifar10",
    "load_embedded",
    "load_mnist_idx",
    "load_source",
    "partition_indices",
    "train_test_split",
]
