"""PlacementConfig: bad values fail with the valid ones listed; the Ray backend without Ray says
which extra to install."""

import sys

import pytest

from mmrl.config import ConfigError, load_config
from mmrl.placement import PlacementConfig, RaySimWorker, registered_sim, start_sim_workers


def test_defaults_are_collocated_local_cpu():
    cfg = PlacementConfig()
    assert (cfg.mode, cfg.stages, cfg.backend, cfg.num_workers) == ("collocated", 1, "local", 0)
    assert PlacementConfig(mode="hybrid", stages=4).num_workers == 4
    assert PlacementConfig(mode="hybrid", stages=2).stage_slices(8) == [slice(0, 4), slice(4, 8)]


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"mode": "pipelined"}, "collocated, disaggregated, hybrid"),
        ({"backend": "slurm"}, "local, ray"),
        ({"mode": "hybrid", "stages": 1}, "valid stages are >= 2"),
        ({"mode": "disaggregated", "stages": 2}, "valid for mode 'disaggregated': 1"),
        ({"mode": "hybrid", "stages": 0}, "must be an int >= 1"),
        ({"render_device": "gpu0"}, "valid: cpu, cuda, cuda:<index>"),
        ({"max_restarts": -1}, "must be >= 0"),
        ({"ray_strategy": "spread"}, "PACK, SPREAD, STRICT_PACK, STRICT_SPREAD"),
        ({"backend": "ray", "render_device": "cuda:1"}, "valid: cpu, cuda"),
        ({"train_ranks": 2}, "train_ranks = 2 needs placement.backend=ray (or launch the ranks with torchrun"),
        ({"backend": "ray", "train_ranks": 0}, "train_ranks = 0 must be an int >= 1"),
        ({"backend": "ray", "train_cpus_per_rank": 0}, "train_cpus_per_rank = 0 must be > 0"),
    ],
)
def test_bad_values_list_the_valid_ones(kwargs, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        PlacementConfig(**kwargs)


def test_yaml_values_are_checked_too():
    with pytest.raises(ConfigError, match="'mode' = 'pipelined' is not one of: collocated, disaggregated, hybrid"):
        load_config(PlacementConfig, {"mode": "pipelined"})
    with pytest.raises(ConfigError, match="valid stages are >= 2"):
        load_config(PlacementConfig, {"mode": "hybrid"})
    assert load_config(PlacementConfig, {"mode": "hybrid", "stages": 2}).stages == 2


def test_stages_must_divide_the_envs():
    with pytest.raises(ConfigError, match="valid stages for 6 envs: 1, 2, 3, 6"):
        PlacementConfig(mode="hybrid", stages=4).stage_slices(6)


def test_ray_backend_names_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    cfg = PlacementConfig(mode="hybrid", stages=2, backend="ray")
    with pytest.raises(ImportError, match=r"needs Ray, which is not installed: pip install 'mmrl\[ray\]'"):
        start_sim_workers(registered_sim("reach"), 8, cfg)
    with pytest.raises(ImportError, match=r"pip install 'mmrl\[ray\]'"):
        RaySimWorker(registered_sim("reach", num_envs=2))


def test_collocated_starts_no_workers():
    with pytest.raises(ValueError, match="valid modes for workers: disaggregated, hybrid"):
        start_sim_workers(registered_sim("reach"), 8, PlacementConfig())


def test_a_ray_training_failure_names_the_rank_that_died_first():
    """Ray Train reports every rank's error; the ranks that only lost their peer in a collective are
    summed up after the one that died (`mmrl.ray_train.describe_failure`)."""
    from mmrl.ray_train import describe_failure

    class WorkerGroupError(Exception):
        pass

    err = WorkerGroupError("2 workers failed")
    err.worker_failures = {  # type: ignore[attr-defined]  # as Ray Train's error carries them
        0: RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:21935. This is typically ..."),
        1: WorkerGroupError("The actor is dead because its worker process has died. Worker exit type: ..."),
        2: ValueError("bad reward: nan\nValueError: reward term 'x' returned nan. More text"),
    }
    assert describe_failure(err) == (
        "rank 1: WorkerGroupError: its process died (killed, crashed, or its node was lost); "
        "rank 2: ValueError: ValueError: reward term 'x' returned nan (then rank(s) 0 lost it in a collective)"
    )
