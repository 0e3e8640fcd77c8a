"""Shared test setup: GPU tests carry the `gpu` marker and are skipped with a reason on CPU machines."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine; CI never has one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
