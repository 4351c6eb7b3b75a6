"""Tests for fl_lbbsp.models."""

from __future__ import annotations

import pytest
import torch

from fl_lbbsp.models import MLP, LeNet5, build_model


@pytest.mark.parametrize(
    ("shape", "flatten_size"),
    [((1, 8, 8), 16 * 2 * 2), ((1, 28, 28), 16 * 4 * 4), ((3, 32, 32), 16 * 5 * 5)],
    ids=["digits", "mnist", "cifar10"],
)
def test_lenet5_forward_shapes(shape: tuple[int, int, int], flatten_size: int) -> None:
    # Prepare
    torch.manual_seed(0)
    model = LeNet5(in_channels=shape[0], image_size=shape[1], num_classes=10)
    batch = torch.rand(4, *shape)

    # Execute
    logits = model(batch)

    # Assert
    assert logits.shape == (4, 10)
    assert model.flatten_size == flatten_size
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("hidden", [(128, 64), (32,), ()])
def test_mlp_forward_shapes(hidden: tuple[int, ...]) -> None:
    # Prepare
    model = MLP(input_shape=(1, 8, 8), num_classes=7, hidden=hidden)

    # Execute
    logits = model(torch.rand(5, 1, 8, 8))

    # Assert
    assert logits.shape == (5, 7)
    assert sum(isinstance(m, torch.nn.Linear) for m in model.modules()) == len(hidden) + 1


@pytest.mark.parametrize("name", ["lenet5", "mlp", "LeNet5"])
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)])
def test_build_model(name: str, shape: tuple[int, int, int]) -> None:
    # Prepare / Execute
    model = build_model(name, input_shape=shape, num_classes=10)
    out = model(torch.zeros(2, *shape))

    # Assert
    assert out.shape == (2, 10)


def test_model_trains_one_step() -> None:
    # Prepare
    torch.manual_seed(0)
    model = build_model("lenet5", input_shape=(1, 8, 8), num_classes=10)
    x, y = torch.rand(8, 1, 8, 8), torch.arange(8) % 10
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]

    # Execute
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()

    # Assert
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("name", ["resnet18", "", "lenet"])
def test_build_model_unknown_name(name: str) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="unknown model") as info:
        build_model(name, input_shape=(1, 8, 8), num_classes=10)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"in_channels": 1, "image_size": 2, "num_classes": 10},
        {"in_channels": 0, "image_size": 28, "num_classes": 10},
        {"in_channels": 1, "image_size": 28, "num_classes": 0},
    ],
    ids=["too-small", "no-channels", "no-classes"],
)
def test_lenet5_rejects_bad_arguments(kwargs: dict[str, int]) -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError):
        LeNet5(**kwargs)


def test_build_lenet5_rejects_non_square() -> None:
    # Prepare / Execute / Assert
    with pytest.raises(ValueError, match="square"):
        build_model("lenet5", input_shape=(1, 8, 10), num_classes=10)
