"""The models ``torchring bench train`` trains on synthetic data, and the shape of their inputs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 10


def mlp() -> nn.Module:
    """784-1024-1024-10 with ReLU, on flattened 28x28 images."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, 1024), nn.ReLU(),
        nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, NUM_CLASSES),
    )


class ConvNet(nn.Module):
    """The usual small MNIST convnet: two 3x3 convolutions, max-pooling, dropout, two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.drop_conv = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 12 * 12, 128)
        self.drop_fc = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = self.drop_conv(F.max_pool2d(x, 2)).flatten(1)
        return self.fc2(self.drop_fc(F.relu(self.fc1(x))))


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    """Identity, or a strided 1x1 projection with batch norm when the block changes the shape."""
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(out_channels))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A ResNet-18 layout (four stages of two basic blocks) at a quarter of the width, for 3x32x32 images."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64, 128), blocks_per_stage: int = 2) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        layers: list[nn.Module] = []
        in_channels = widths[0]
        for stage, width in enumerate(widths):
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(in_channels, width, stride))
                in_channels = width
        self.stages = nn.Sequential(*layers)
        self.fc = nn.Linear(in_channels, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4), with batch norm and a projection shortcut when shapes change."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


class ResNet50(nn.Module):
    """The ResNet-50 layout (bottleneck stages of 3, 4, 6 and 3 blocks) for 3x224x224 images, 1000 classes."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1))
        layers: list[nn.Module] = []
        in_channels = 64
        for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
            for block in range(blocks):
                layers.append(Bottleneck(in_channels, width, 2 if stage > 0 and block == 0 else 1))
                in_channels = width * Bottleneck.expansion
        self.stages = nn.Sequential(*layers)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def deep_mlp(layers: int = 50, width: int = 256) -> nn.Module:
    """``layers`` linear layers of ``width`` with ReLU: 100 parameter tensors, for the engine's per-tensor cost."""
    blocks: list[nn.Module] = []
    for _ in range(layers - 1):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks, nn.Linear(width, NUM_CLASSES))


#: name → (constructor, shape of one input sample)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "mlp": (mlp, (1, 28, 28)),
    "convnet": (ConvNet, (1, 28, 28)),
    "resnet": (SmallResNet, (3, 32, 32)),
    "deep": (deep_mlp, (256,)),
}


def build_model(name: str) -> nn.Module:
    """A freshly initialised model ``name`` (one of ``MODELS``)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name][0]()


def input_shape(name: str) -> tuple[int, ...]:
    """The shape of one input sample of model ``name``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name][1]
