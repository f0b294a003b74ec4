"""The Fashion-MNIST networks of tools/fashion_net.c in PyTorch, for the
benchmarks' PyTorch co-processes (imported after they have found torch)."""
from torch import nn


def net(arch):
    """The network ARCH (mlp|cnn), with PyTorch's default initialisation."""
    if arch == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(1), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Flatten(1), nn.Linear(784, 256), nn.ReLU(),
                         nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
