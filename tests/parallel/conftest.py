"""Fixtures for tests that run on every rank of a job started by ``torchring run``.

Every rank runs the same tests in the same order, so collectives line up across ranks.
"""

import pytest
import torch

import torchring as hvd


@pytest.fixture(scope="session", autouse=True)
def initialized():
    torch.manual_seed(1234)
    hvd.init()
    yield
    hvd.shutdown()


@pytest.fixture
def rank() -> int:
    return hvd.rank()


@pytest.fixture
def size() -> int:
    return hvd.size()
