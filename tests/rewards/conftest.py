"""Tiny random-weight models of the real classes (open_clip CLIP, transformers CLIPModel) for reward tests."""

import pytest


@pytest.fixture(scope="session")
def tiny_oc():
    """(model, model_name) of a tiny open_clip CLIP registered under its own config name."""
    from mmrl.tiny.tiny_models import register_tiny_open_clip, tiny_open_clip

    return tiny_open_clip(seed=0), register_tiny_open_clip()


@pytest.fixture(scope="session")
def tiny_hf_clip():
    """(CLIPModel, CLIPProcessor), tiny and random."""
    from mmrl.tiny.tiny_models import tiny_clip_model

    return tiny_clip_model(seed=0)


@pytest.fixture
def serve():
    """``serve(reward)`` starts a `rewards.http.RewardServer` for it (closed after the test)."""
    from rewards.http import RewardServer

    servers = []

    def start(reward):
        servers.append(RewardServer(reward).start())
        return servers[-1]

    yield start
    for s in servers:
        s.close()
