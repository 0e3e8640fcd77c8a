"""The reference runs the multi-rank tests compare against, trained once per session."""

import pytest

from tests.distributed.launch import run, train_cmd


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """The short quickstart (PPO + GAE) in one process with 8 envs (`one`) and on 2 ranks with 4 each
    (`two`, DDP)."""
    out = tmp_path_factory.mktemp("ddp")
    run(train_cmd(out, "one", 1, 8))
    run(train_cmd(out, "two", 2, 4))
    return out
