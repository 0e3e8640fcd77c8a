"""Shared test setup: GPU tests carry the `gpu` marker and are skipped with a reason on CPU
machines; `killed_in_iteration` interrupts a training run mid-iteration (resume tests);
`one_torch_thread` (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``) keeps a module
on one intra-op thread, for tests whose work shares the 2 cores with worker processes;
`load_benchmark` imports a script of benchmarks/ by name."""

import contextlib
import os

# before torch loads OpenMP: idle threads sleep instead of spinning at barriers, as mmrl's own runs do
# (`mmrl.utils.threads`; here torch is imported first, so mmrl's setting would come too late). On a
# busy machine spinning threads fight the other processes for the cores: a VLM / flow-policy subset
# took 63 s beside one busy process with OpenMP's default and 38 s with this (34 s / 30 s quiet).
# Subprocesses (torchrun ranks, benchmark smokes) inherit it. A value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

# Under pytest-xdist (`-n 2 --dist loadgroup`, as the README's test command runs it) each test file
# runs whole on one worker (its module and session fixtures are built once, its tests keep their
# order), except these files, whose tests are independent end-to-end runs (a subprocess each) that
# the two workers share out one by one.
SPLIT_ACROSS_WORKERS = {"test_benchmarks_smoke.py"}
# and these share one worker: tests/distributed's files share the session fixture `runs` (two
# trainings), and the Ray tests each start a local Ray cluster, which two at once would fight over
ONE_WORKER = {"tests/distributed": "ranks", "tests/placement/test_ray_backend.py": "ranks"}


def worker_group(relpath: str) -> str:
    for prefix, group in ONE_WORKER.items():
        if relpath == prefix or relpath.startswith(prefix + "/"):
            return group
    return relpath


def pytest_configure(config):
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:  # the workers share the cores: one worker's torch threads must not crowd out another's
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        torch.set_num_threads(max(1, cpus // int(workers)))


def pytest_collection_modifyitems(config, items):
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            if item.path.name not in SPLIT_ACROSS_WORKERS and not item.get_closest_marker("xdist_group"):
                item.add_marker(
                    pytest.mark.xdist_group(worker_group(item.path.relative_to(config.rootpath).as_posix()))
                )
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine; CI never has one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def killed_in_iteration(monkeypatch):
    """``with killed_in_iteration(k): trainer.run()``: the run is interrupted (KeyboardInterrupt,
    as Ctrl-C would) in the update of iteration k (1-based), after its rollout; asserted raised."""
    from mmrl.trainer.on_policy import OnPolicy

    @contextlib.contextmanager
    def kill(k: int):
        original = OnPolicy.update

        def update(self, batch, gen):
            if self.trainer.state.iteration == k - 1:
                raise KeyboardInterrupt("killed")
            return original(self, batch, gen)

        monkeypatch.setattr(OnPolicy, "update", update)
        try:
            with pytest.raises(KeyboardInterrupt):
                yield
        finally:
            monkeypatch.setattr(OnPolicy, "update", original)

    return kill


@pytest.fixture(scope="module")
def one_torch_thread():
    # intra-op threads beyond the free cores spin against worker processes (4x slower on 2 cores)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark("vs_sb3")``: a script of ``benchmarks/`` imported as a module of that name
    (registered in ``sys.modules`` first, as its dataclasses need)."""
    import importlib.util
    import sys
    from pathlib import Path

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def tiny_wan(tmp_path_factory):
    """A tiny random-weight diffusers ``WanPipeline`` folder built offline (`mmrl.tiny.tiny_wan`),
    shared by the Wan generator, video policy and video training tests; skipped without diffusers
    or peft."""
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()  # peft imports transformers models, which import torchvision
    pytest.importorskip("diffusers")
    pytest.importorskip("peft")
    from mmrl.tiny.tiny_wan import tiny_wan_pipeline

    return tiny_wan_pipeline(tmp_path_factory.mktemp("wan"))


@pytest.fixture
def off_policy_tensors():
    """``tensors(trainer)``: every tensor an off-policy run trains (the policy's state dict, the
    critics with their targets and log(alpha)), copied: what a bit-identical resume must restore."""

    def tensors(trainer) -> dict:
        out = {f"policy.{k}": v.detach().clone() for k, v in trainer.policy.state_dict().items()}
        out.update({f"critics.{k}": v.detach().clone() for k, v in trainer.learner.critics.state_dict().items()})
        return out

    return tensors


@pytest.fixture
def supervised_steps():
    """``steps(policy, batch, opt, n)``: ``n`` optimizer steps on the mean of
    ``policy.supervised_loss(batch)``; returns each step's loss (before its update)."""

    def steps(policy, batch, opt, n: int) -> list[float]:
        losses = []
        for _ in range(n):
            loss = policy.supervised_loss(batch).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    return steps
