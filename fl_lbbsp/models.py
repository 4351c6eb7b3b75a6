"""Neural-network models trained by the federated silos.

References
----------
.. [1] Y. LeCun, L. Bottou, Y. Bengio and P. Haffner, "Gradient-based learning applied to
   document recognition", Proceedings of the IEEE, 86(11):2278-2324, 1998.
.. [2] C. Chen, Q. Weng, W. Wang, B. Li and B. Li, "Accelerating Distributed Learning in
   Non-Dedicated Environments" (LB-BSP), IEEE Transactions on Cloud Computing, 2021,
   Sec. 5.5 (LeNet-5 is the model of the federated-learning experiments).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import nn

__all__ = ["MODEL_NAMES", "MLP", "LeNet5", "ModelName", "build_model"]


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class LeNet5(nn.Module):
    """LeNet-5 convolutional network sized to the input images.

    The classic architecture of LeCun et al. (1998) [1]_: conv 6@5x5 -> 2x2 max-pool ->
    conv 16@5x5 -> 2x2 max-pool -> fc 120 -> fc 84 -> fc ``num_classes``, with ReLU
    activations. It is the model trained in the federated-learning experiments of Chen et al.
    (IEEE TCC 2021, Sec. 5.5) [2]_.

    Parameters
    ----------
    in_channels : int
        Number of input channels, e.g. 1 for MNIST/digits, 3 for CIFAR-10.
    image_size : int
        Height (= width) of the square input images.
    num_classes : int
        Number of output logits.

    Notes
    -----
    For images smaller than 28x28 (e.g. the 8x8 scikit-learn digits) both convolutions use
    ``padding=2`` so the spatial size survives the two poolings; otherwise no padding is used
    (28x28 -> 4x4x16 features, 32x32 -> 5x5x16 features as in the original). The flatten size
    is computed with a dummy forward pass. ``forward`` returns unnormalised logits.
    """

    def __init__(self, *, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        _check_positive("in_channels", in_channels)
        _check_positive("image_size", image_size)
        _check_positive("num_classes", num_classes)
        padding = 2 if image_size < 28 else 0
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, kernel_size=5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, kernel_size=5, padding=padding),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        try:
            with torch.no_grad():
                dummy = torch.zeros(1, in_channels, image_size, image_size)
                flat = int(self.features(dummy).flatten(1).shape[1])
        except RuntimeError as exc:
            raise ValueError(f"image_size={image_size} is too small for LeNet-5") from exc
        if flat == 0:
            raise ValueError(f"image_size={image_size} is too small for LeNet-5")
        self.flatten_size = flat
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits of shape ``[N, num_classes]`` for images ``[N, C, H, W]``."""
        out: torch.Tensor = self.classifier(self.features(x))
        return out


class MLP(nn.Module):
    """Fully connected network: flatten -> (Linear, ReLU) * len(hidden) -> Linear.

    Parameters
    ----------
    input_shape : tuple of int
        Shape of one input sample, e.g. ``(1, 8, 8)``; it is flattened.
    num_classes : int
        Number of output logits.
    hidden : tuple of int
        Widths of the hidden layers; empty gives a linear model (default: (128, 64)).
    """

    def __init__(
        self,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        hidden: tuple[int, ...] = (128, 64),
    ) -> None:
        super().__init__()
        if len(input_shape) == 0:
            raise ValueError("input_shape must not be empty")
        for dim in input_shape:
            _check_positive("input_shape entries", dim)
        for width in hidden:
            _check_positive("hidden widths", width)
        _check_positive("num_classes", num_classes)
        in_features = math.prod(input_shape)
        layers: list[nn.Module] = [nn.Flatten()]
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.ReLU()]
            in_features = width
        layers.append(nn.Linear(in_features, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits of shape ``[N, num_classes]``."""
        out: torch.Tensor = self.net(x)
        return out


ModelName = Literal["lenet5", "mlp"]
"""A config field naming a model of :func:`build_model`."""
MODEL_NAMES: tuple[str, ...] = get_args(ModelName)


def build_model(name: str, *, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Build a model by name.

    Parameters
    ----------
    name : str
        ``"lenet5"`` or ``"mlp"`` (case-insensitive).
    input_shape : tuple of int
        ``(C, H, W)`` of one image; LeNet-5 requires ``H == W``.
    num_classes : int
        Number of output logits.

    Returns
    -------
    torch.nn.Module
        A freshly initialised model (uses the global torch RNG).

    Raises
    ------
    ValueError
        Unknown ``name`` or unsupported ``input_shape``.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key == "lenet5":
        if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
            raise ValueError(
                f"lenet5 needs square (C, H, W) images, got input_shape={tuple(input_shape)}"
            )
        return LeNet5(
            in_channels=input_shape[0], image_size=input_shape[1], num_classes=num_classes
        )
    if key == "mlp":
        return MLP(input_shape=tuple(input_shape), num_classes=num_classes)
    raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODEL_NAMES)}")
