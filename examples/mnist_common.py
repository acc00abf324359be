"""The model and data shared by the MNIST examples.

With ``--data-dir`` holding torchvision's MNIST files the examples train on MNIST. Otherwise they use
scikit-learn's bundled handwritten digits (1,797 real 8x8 images, no download), scaled to 28x28 so
the same network applies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset


class Net(nn.Module):
    """The classic MNIST convnet of the PyTorch and Horovod examples."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def _torchvision_mnist(data_dir: str) -> tuple[Dataset, Dataset] | None:
    try:
        from torchvision import datasets, transforms
    except ImportError:
        return None
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    try:
        train = datasets.MNIST(data_dir, train=True, download=False, transform=transform)
        test = datasets.MNIST(data_dir, train=False, download=False, transform=transform)
    except RuntimeError:
        return None
    return train, test


def _digits() -> tuple[Dataset, Dataset]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    images = (images - images.mean()) / images.std()
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    images, labels = images[order], labels[order]
    split = int(0.8 * len(labels))
    return TensorDataset(images[:split], labels[:split]), TensorDataset(images[split:], labels[split:])


def load_datasets(data_dir: str | None) -> tuple[Dataset, Dataset, str]:
    """(train, test, description): MNIST from ``data_dir`` when present, else the bundled digits."""
    if data_dir:
        found = _torchvision_mnist(data_dir)
        if found is not None:
            return found[0], found[1], f"MNIST from {data_dir}"
    train, test = _digits()
    return train, test, "scikit-learn handwritten digits (MNIST files not found)"
