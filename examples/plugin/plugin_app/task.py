"""Model, data and the training loop, as in Flower's quickstart-pytorch (``task.py``).

The one change for LB-BSP: ``train`` runs the batches its loader yields (exactly tau of
them, of this silo's batch size) instead of a number of epochs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fl_lbbsp.clients.app import SiloSetup, silo_data, test_data


class Net(nn.Module):
    """A small CNN for the 32x32 grey digits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data(partition_id: int, num_partitions: int) -> TensorDataset:
    """This silo's partition of the embedded digits (IID)."""
    data = silo_data(SiloSetup(num_silos=num_partitions, partition="iid"), partition_id)
    return TensorDataset(torch.from_numpy(data.x), torch.from_numpy(data.y))


def load_test_data() -> TensorDataset:
    """The held-out test split."""
    data = test_data(SiloSetup(num_silos=1))
    return TensorDataset(torch.from_numpy(data.x), torch.from_numpy(data.y))


def train(net: nn.Module, trainloader: DataLoader, lr: float) -> float:
    """Train on every batch of ``trainloader``; return the mean loss."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    net.train()
    total, batches = 0.0, 0
    for x, y in trainloader:
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        total, batches = total + loss.item(), batches + 1
    return total / max(batches, 1)


def test(net: nn.Module, testloader: DataLoader) -> tuple[float, float]:
    """Loss and accuracy on ``testloader``."""
    net.eval()
    loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in testloader:
            out = net(x)
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += int((out.argmax(1) == y).sum())
            count += len(y)
    return loss / count, correct / count
