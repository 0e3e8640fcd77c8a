"""Training engines: the torch engine is exactly a guarded Adam step; DeepSpeed ZeRO on CPU (one process,
gloo) trains a flow VLA, matches the torch engine's updates and resumes exactly from its state dict."""

import importlib.util
import io
import math
import os

import pytest
import torch

from mmrl.batch import Batch
from mmrl.config import ConfigError
from mmrl.policies.base import encode_text
from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
from mmrl.trainer import train_engine
from mmrl.trainer.train_engine import TrainEngineConfig, build_train_engine

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed (pip install 'mmrl[deepspeed]')"
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # other processes share the cores


def linear(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2)


def flat(module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).clone()


# ---- torch engine ------------------------------------------------------------------------------
def test_torch_step_is_a_hand_made_adam_step():
    lin = linear()
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    w0 = [p.detach().clone() for p in lin.parameters()]
    engine = build_train_engine(TrainEngineConfig(), lin, lr=0.1, device="cpu")
    result = engine.step(((lin(x) - y) ** 2).mean(), max_norm=None)
    grads = [p.grad.clone() for p in lin.parameters()]
    assert result and result.taken
    assert result.grad_norm == pytest.approx(float(torch.cat([g.flatten() for g in grads]).norm()), rel=1e-6)
    b1, b2, eps = 0.9, 0.999, 1e-6
    for p, p0, g in zip(lin.parameters(), w0, grads):
        m, v = (1 - b1) * g / (1 - b1), (1 - b2) * g**2 / (1 - b2)  # bias-corrected first moments
        torch.testing.assert_close(p.detach(), p0 - 0.1 * m / (v.sqrt() + eps))


def test_torch_non_finite_loss_and_gradient_skip_the_step():
    lin = linear()
    engine = build_train_engine(TrainEngineConfig(), lin, lr=0.1, device="cpu")
    before = flat(lin)
    nan_loss = engine.step(lin.weight.sum() * float("nan"))
    inf_grad = engine.step(torch.sqrt((lin.weight * 0).abs()).sum())  # finite loss, nan gradient
    assert not nan_loss and math.isnan(nan_loss.grad_norm)
    assert not inf_grad and not math.isfinite(inf_grad.grad_norm)
    assert torch.equal(flat(lin), before) and not engine.optimizer.state
    assert all(p.grad is None for p in lin.parameters())


def test_torch_gradient_clipping_applies_max_norm():
    lin = linear()
    engine = build_train_engine(TrainEngineConfig(), lin, lr=0.1, device="cpu")
    result = engine.step(1000 * lin(torch.ones(4, 3)).sum(), max_norm=0.5)
    assert result.grad_norm > 100
    clipped = torch.cat([p.grad.flatten() for p in lin.parameters()]).norm()
    assert clipped == pytest.approx(0.5, rel=1e-4)


def test_lr_override_and_state_round_trip():
    lin = linear()
    engine = build_train_engine(TrainEngineConfig(), lin, lr=0.1, device="cpu")
    engine.step(lin(torch.ones(2, 3)).sum())
    other = build_train_engine(TrainEngineConfig(), linear(), lr=0.5, device="cpu")
    other.load_state_dict(engine.state_dict())
    for group in other.param_groups:
        group["lr"] = 0.01
    assert other.optimizer.param_groups[0]["lr"] == 0.01
    assert torch.equal(
        other.optimizer.state_dict()["state"][0]["exp_avg"], engine.optimizer.state_dict()["state"][0]["exp_avg"]
    )


def test_autocast():
    lin = linear()
    fp32 = build_train_engine(TrainEngineConfig(), lin, lr=0.1, device="cpu")
    bf16 = build_train_engine(TrainEngineConfig(precision="bf16"), lin, lr=0.1, device="cpu")
    x = torch.randn(2, 3)
    with fp32.autocast():
        assert lin(x).dtype == torch.float32
    with bf16.autocast():
        assert lin(x).dtype == torch.bfloat16
    assert lin.weight.dtype == torch.float32  # torch bf16 = autocast over fp32 weights


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(backend="deepspeed", zero_stage=2, offload_params=True), ["offload_params", "zero_stage 3"]),
        (dict(backend="deepspeed", zero_stage=5), ["zero_stage", "5", "0, 1, 2, 3"]),
        (dict(backend="torch", precision="fp16"), ["precision", "fp16", "fp32, bf16"]),
        (dict(backend="torch", offload_optimizer=True), ["offload_optimizer", "deepspeed"]),
        (dict(backend="jax"), ["backend", "jax", "torch, deepspeed"]),
    ],
)
def test_config_errors_name_key_value_and_choices(kwargs, words):
    with pytest.raises(ConfigError) as err:
        TrainEngineConfig(**kwargs).validate()
    assert all(w in str(err.value) for w in words), str(err.value)


def test_config_errors_needing_context(monkeypatch):
    with pytest.raises(ConfigError, match="'precision' = 'fp16' needs a GPU"):
        TrainEngineConfig(backend="deepspeed", precision="fp16").validate("cpu")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else find_spec(name, *a)
    )
    with pytest.raises(ConfigError, match=r"pip install 'mmrl\[deepspeed\]'"):
        TrainEngineConfig(backend="deepspeed").validate("cpu")


def test_gradient_checkpointing():
    with pytest.raises(ConfigError, match="policy 'flow_vla'"):
        build_train_engine(TrainEngineConfig(gradient_checkpointing=True), make_policy(), 1e-3, "cpu")
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()  # a broken torchvision install would otherwise break the transformers import
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8, bos_token_id=0, eos_token_id=0
    )
    from mmrl.policies.base import Policy

    class Wrapper(Policy):  # a policy holding a Hugging Face model (the default hook finds it)
        def __init__(self):
            super().__init__()
            self.head, self.lm = torch.nn.Linear(8, 1), transformers.GPT2Model(cfg)

    wrapper = Wrapper()
    engine = build_train_engine(TrainEngineConfig(gradient_checkpointing=True), wrapper, 1e-3, "cpu")
    assert wrapper.lm.is_gradient_checkpointing
    wrapper.train()
    hidden = wrapper.lm(torch.tensor([[1, 2, 3]])).last_hidden_state
    assert engine.step(wrapper.head(hidden).sum())  # backward recomputes the checkpointed blocks
    assert wrapper.lm.h[0].attn.c_attn.weight.grad is not None


def test_fsdp_wraps_the_blocks_the_hugging_face_models_name():
    """FSDP2's units in a policy holding a transformers model: each block class the model names in
    ``_no_split_modules`` (GPT2Block here), as accelerate's and TRL's FSDP recipes wrap."""
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    from mmrl.policies.base import Policy

    class Wrapper(Policy):
        def __init__(self):
            super().__init__()
            cfg = transformers.GPT2Config(n_layer=2, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
            self.cfg, self.head, self.lm = None, torch.nn.Linear(8, 1), transformers.GPT2Model(cfg)

    torch.manual_seed(0)
    wrapper = Wrapper()
    assert train_engine.framework_units(wrapper) == {"GPT2Block"}
    env, started = dict(os.environ), not torch.distributed.is_initialized()
    try:
        engine = build_train_engine(TrainEngineConfig(backend="fsdp"), wrapper, 1e-3, "cpu")
        assert sum(isinstance(m, GPT2Block) for m in engine.units) == 2 and len(engine.units) == 3  # + the root
    finally:
        if started:
            torch.distributed.destroy_process_group()
            os.environ.clear()
            os.environ.update(env)


@pytest.mark.parametrize("kind", ["sharded", "full"])
def test_fsdp_checkpointed_optimizer_resumes_in_the_torch_engine_exactly(kind, tmp_path):
    """An FSDP2 engine's checkpointed optimizer (``sharded``: torch.distributed.checkpoint files, each
    rank its own shards; ``full``: gathered whole) loads into a plain torch engine in a process with
    no process group, and the two then take the same steps bit for bit (FSDP2 on one rank is the
    torch engine's Adam)."""
    batch, env = demo_batch(), dict(os.environ)
    assert not torch.distributed.is_initialized()

    def train(engine, policy, batch, steps):  # through engine.loss: FSDP2 gathers its root unit there
        for s in steps:
            torch.manual_seed(s)
            loss, _ = engine.loss(lambda module, mb, algo: (module.supervised_loss(mb).mean(), {}), batch, None)
            assert engine.step(loss, max_norm=1.0)

    try:
        policy = make_policy()
        fsdp = build_train_engine(TrainEngineConfig(backend="fsdp", optimizer_checkpoint=kind), policy, 3e-3, "cpu")
        train(fsdp, policy, batch, [0, 1])
        with fsdp.checkpoint_state():
            own = fsdp.write_own_state(tmp_path) if fsdp.writes_own_state else []
            buf = io.BytesIO()
            torch.save(fsdp.state_dict(), buf)  # as state.pt holds it
            weights = {k: v.clone() for k, v in fsdp.module_state_dict().items()}  # one rank: views
        assert kind == "full" or sorted(own) == ["optimizer/.metadata", "optimizer/__0_0.distcp"]
        train(fsdp, policy, batch, [2, 3])
        with fsdp.checkpoint_state():
            expected = fsdp.module_state_dict()
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(env)
    twin = make_policy(seed=1)
    twin.load_state_dict(weights)
    engine = build_train_engine(TrainEngineConfig(), twin, 3e-3, "cpu")
    buf.seek(0)
    engine.load_optimizer(torch.load(buf, weights_only=False), tmp_path)
    train(engine, twin, batch, [2, 3])
    assert all(torch.equal(v, expected[k]) for k, v in twin.state_dict().items())


def test_optimizer_checkpoint_errors_name_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="'optimizer_checkpoint' = 'full' needs backend: fsdp"):
        TrainEngineConfig(backend="deepspeed", optimizer_checkpoint="full").validate()
    engine = build_train_engine(TrainEngineConfig(), make_policy(), 3e-3, "cpu")
    from mmrl.trainer.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="DeepSpeed ZeRO run on 2 rank.*backend=deepspeed on 2 rank"):
        engine.load_optimizer({train_engine.ZERO_RANKS: 2}, tmp_path)
    with pytest.raises(CheckpointError, match="no .metadata"):
        engine.load_optimizer({train_engine.SHARDED: "optimizer"}, tmp_path)
    engine.load_optimizer({}, tmp_path)  # an FSDP2 checkpoint saved before the first step: nothing to load
    assert not engine.optimizer.state


# ---- DeepSpeed on CPU ------------------------------------------------------------------------------
def make_policy(seed=0):
    torch.manual_seed(seed)
    return FlowVLAPolicy(FlowVLAConfig(chunk_size=4, num_steps=4), action_dim=2, state_dim=2)


def demo_batch(b=12) -> Batch:
    """Demonstrations as `Policy.warm_start_batch` builds them: the chunk to imitate follows the colour."""
    g = torch.Generator().manual_seed(0)
    colours = ["red", "green", "blue"]
    chunks = torch.tanh(torch.randn(3, 4, 2, generator=g))
    return Batch(
        image=torch.randint(0, 256, (b, 32, 32, 3), generator=g, dtype=torch.uint8),
        instruction=encode_text([f"reach the {colours[i % 3]} target" for i in range(b)]),
        state=torch.randn(b, 2, generator=g),
        actions=chunks[torch.arange(b) % 3],
    )


def train(engine, policy, batch, steps) -> list[torch.Tensor]:
    """``steps`` supervised steps, step s drawing its flow times and noise from seed s; params after each."""
    out = []
    for s in steps:
        torch.manual_seed(s)
        with engine.autocast():
            loss = policy.supervised_loss(batch).mean()
        assert engine.step(loss, max_norm=1.0)
        out.append(flat(policy))
    return out


def held_out_loss(policy, batch) -> float:
    torch.manual_seed(123)
    with torch.no_grad():
        return sum(policy.supervised_loss(batch).mean().item() for _ in range(4)) / 4


@pytest.fixture(scope="module")
def process_group():
    """One gloo group of one process for the module (the first run compiles DeepSpeed's comm op)."""
    env = dict(os.environ)
    train_engine.init_process_group(torch.device("cpu"))
    yield
    torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)


def deepspeed_engine(policy, lr=3e-3, **kwargs):
    return build_train_engine(TrainEngineConfig(backend="deepspeed", **kwargs), policy, lr, "cpu")


@needs_deepspeed
def test_zero2_trains_flow_vla_like_torch(process_group):
    batch = demo_batch()
    ref_policy, ds_policy = make_policy(), make_policy()
    ref = train(build_train_engine(TrainEngineConfig(), ref_policy, 3e-3, "cpu"), ref_policy, batch, range(20))
    engine = deepspeed_engine(ds_policy, zero_stage=2)
    assert type(engine.optimizer).__name__ == "DeepSpeedZeroOptimizer"
    first = held_out_loss(ds_policy, batch)
    ds = train(engine, ds_policy, batch, range(20))
    assert held_out_loss(ds_policy, batch) < 0.6 * first
    for a, b in zip(ref[:5], ds[:5]):  # fp32 Adam with the same eps: only summation order differs
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


@needs_deepspeed
def test_zero2_skips_non_finite_loss_and_gradient(process_group):
    policy = make_policy()
    engine = deepspeed_engine(policy, zero_stage=2)
    before = flat(policy)
    w = policy.expert.out.weight
    nan_loss = engine.step(w.sum() * float("nan"), max_norm=1.0)
    nan_grad = engine.step(torch.sqrt((w * 0).abs()).sum(), max_norm=1.0)
    assert not nan_loss and not nan_grad and not math.isfinite(nan_grad.grad_norm)
    assert torch.equal(flat(policy), before)
    assert engine.step(w.square().sum(), max_norm=1.0)  # and training goes on


@needs_deepspeed
def test_zero2_state_dict_round_trip_resumes_exactly(process_group):
    batch = demo_batch()
    policy = make_policy()
    engine = deepspeed_engine(policy, zero_stage=2)
    train(engine, policy, batch, range(3))
    saved_policy = {k: v.clone() for k, v in policy.state_dict().items()}
    buf = io.BytesIO()
    torch.save(engine.state_dict(), buf)  # as a checkpoint does
    expected = train(engine, policy, batch, range(3, 5))[-1]

    def resumed(load_optimizer: bool) -> torch.Tensor:
        fresh = make_policy(seed=1)  # a different init: everything must come from the checkpoint
        engine = deepspeed_engine(fresh, lr=1.0, zero_stage=2)
        if load_optimizer:  # the trainer's order: weights, then optimizer, then the config's lr
            fresh.load_state_dict(saved_policy)
            buf.seek(0)
            engine.load_state_dict(torch.load(buf, weights_only=False))
        else:
            engine.load_module_state_dict(saved_policy)
        for group in engine.param_groups:
            group["lr"] = 3e-3
        return train(engine, fresh, batch, range(3, 5))[-1]

    assert torch.equal(resumed(load_optimizer=True), expected)
    assert not torch.allclose(resumed(load_optimizer=False), expected, atol=1e-5)  # Adam's moments matter


@needs_deepspeed
def test_zero3_partitions_and_matches_torch(process_group, monkeypatch):
    """ZeRO-3 with every parameter partitioned (no persistence threshold), the loss computed by policy
    methods: the MultiheadAttention out_proj registration makes it match the torch engine."""
    base = train_engine.deepspeed_config
    monkeypatch.setattr(
        train_engine,
        "deepspeed_config",
        lambda cfg, lr: {**base(cfg, lr), "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
    )
    batch = demo_batch(b=6)
    ref_policy, ds_policy = make_policy(), make_policy()
    ref = train(build_train_engine(TrainEngineConfig(), ref_policy, 3e-3, "cpu"), ref_policy, batch, range(3))
    engine = deepspeed_engine(ds_policy, zero_stage=3)
    assert ds_policy.expert.out.weight.numel() == 0  # partitioned away
    train(engine, ds_policy, batch, range(3))
    full = engine.module_state_dict()
    torch.testing.assert_close(
        torch.cat([full[k].flatten() for k, _ in ds_policy.named_parameters()]), ref[-1], atol=1e-5, rtol=0
    )


@needs_deepspeed
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(zero_stage=2, precision="bf16"),
        dict(zero_stage=2, offload_optimizer=True),
        dict(zero_stage=3, offload_params=True, offload_optimizer=True),
    ],
)
def test_zero_variants_run_on_cpu(process_group, kwargs):
    batch = demo_batch(b=6)
    policy = make_policy()
    engine = deepspeed_engine(policy, **kwargs)
    before = engine.module_state_dict()
    train(engine, policy, batch, range(2))
    after = engine.module_state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert not all(torch.equal(before[k], after[k]) for k in before)
    if kwargs.get("precision") == "bf16":
        assert policy.expert.out.weight.dtype == torch.bfloat16  # DeepSpeed casts the weights


# ---- the trainer on DeepSpeed ------------------------------------------------------------------
def _quickstart(tmp_path, *extra):
    from mmrl.experiment import build_trainer
    from tests.trainer.test_trainer import tiny_cfg

    return build_trainer(tiny_cfg(tmp_path, "trainer.video_episodes=0", "run.threads=1", *extra))


@needs_deepspeed
def test_zero2_trains_the_quickstart_policy_like_torch(process_group, tmp_path):
    """The tiny quickstart (flow VLA + critic, warm start, 2 PPO iterations) with only
    ``trainer.engine`` changed: DeepSpeed ZeRO-2 on CPU reaches the torch run's parameters."""
    from mmrl.trainer.train_engine import DeepSpeedTrainEngine

    runs = {}
    for backend in ("torch", "deepspeed"):
        trainer = _quickstart(tmp_path / backend, f"trainer.engine.backend={backend}", "trainer.engine.zero_stage=2")
        trainer.warm_start()
        warm = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
        trainer.run()
        assert isinstance(trainer.optimizer, DeepSpeedTrainEngine) == (backend == "deepspeed")
        runs[backend] = (warm, {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()})
    (warm_t, torch_after), (warm_d, ds_after) = runs["torch"], runs["deepspeed"]
    moved = 0.0
    for k in torch_after:
        torch.testing.assert_close(warm_d[k], warm_t[k], atol=0, rtol=0)  # same warm start
        torch.testing.assert_close(ds_after[k], torch_after[k], atol=2e-5, rtol=0)
        moved = max(moved, float((torch_after[k] - warm_t[k]).abs().max()))
    assert moved > 1e-4  # the RL updates changed the weights (the comparison is not trivial)


@needs_deepspeed
def test_zero2_run_resumes_from_its_checkpoint_exactly(process_group, tmp_path, killed_in_iteration):
    extra = ["trainer.engine.backend=deepspeed", "trainer.iterations=4", "trainer.checkpoint_every=2"]
    straight = _quickstart(tmp_path / "a", *extra)
    straight.run()
    with killed_in_iteration(4):
        _quickstart(tmp_path / "b", *extra).run()
    resumed = _quickstart(tmp_path / "b", *extra)
    resumed.run()
    assert resumed.state.iteration == 4 and resumed.state.episodes == straight.state.episodes
    a, b = straight.policy.state_dict(), resumed.policy.state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=0, msg=f"parameter {k} differs")


# ---- critic learning rate -----------------------------------------------------------------------
class ActorCritic(torch.nn.Module):
    """Stands in for a policy: an actor and a ``value_head`` (`Policy.critic_parameters`' default)."""

    critic_parameters = FlowVLAPolicy.critic_parameters

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.actor, self.value_head = torch.nn.Linear(3, 2), torch.nn.Linear(3, 1)


def test_value_lr_moves_the_critic_at_its_own_rate():
    """Adam's first step moves every weight by its group's lr (|m / sqrt(v)| = 1): the actor by lr,
    the critic by value_lr; a schedule scales both."""
    net = ActorCritic()
    engine = build_train_engine(TrainEngineConfig(), net, lr=1e-3, device="cpu", value_lr=0.1)
    assert [g["lr"] for g in engine.param_groups] == [1e-3, 0.1] and engine.lr_scales == [1.0, 100.0]
    a0, c0 = flat(net.actor), flat(net.value_head)
    x = torch.randn(4, 3)
    engine.step(net.actor(x).sum() + net.value_head(x).sum())
    assert torch.allclose((flat(net.actor) - a0).abs(), torch.full_like(a0, 1e-3), rtol=1e-3)
    assert torch.allclose((flat(net.value_head) - c0).abs(), torch.full_like(c0, 0.1), rtol=1e-3)
    single = build_train_engine(TrainEngineConfig(), ActorCritic(), lr=1e-3, device="cpu")
    assert [g["lr"] for g in single.param_groups] == [1e-3] and single.lr_scales == [1.0]


def test_value_lr_without_a_critic_fails_naming_the_key():
    class NoCritic(torch.nn.Module):
        critic_parameters = FlowVLAPolicy.critic_parameters

        def __init__(self):
            super().__init__()
            self.actor = torch.nn.Linear(3, 2)

    with pytest.raises(ConfigError, match="value_lr"):
        build_train_engine(TrainEngineConfig(), NoCritic(), lr=1e-3, device="cpu", value_lr=0.1)


def test_value_lr_reaches_the_trainer_and_follows_the_schedule(tmp_path):
    from mmrl.experiment import build_trainer, load_experiment

    cfg = load_experiment(
        None,
        [
            f"run.output_dir={tmp_path}",
            "trainer.lr=0.001",
            "trainer.value_lr=0.01",
            "trainer.lr_schedule=linear",
            "trainer.iterations=4",
            "sim.num_envs=4",
            "sim.eval_num_envs=4",
            "policy.dim=16",
            "policy.expert_dim=16",
        ],
    )
    trainer = build_trainer(cfg)
    trainer.state.iteration = 2  # half way: both rates halved
    trainer.set_lr()
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([5e-4, 5e-3])
    critic = {id(p) for p in trainer.policy.value_head.parameters()}
    assert {id(p) for p in trainer.optimizer.param_groups[1]["params"]} == critic
    trainer.close()


@pytest.mark.parametrize("method", ["sde", "cps", "noise"])
def test_bf16_on_the_cpu_gives_ratio_1_before_an_update(method):
    """The rollout (eval mode) and the recompute (train mode) under the trainer's bf16 autocast on the
    CPU take the same kernels: nn.Transformer's fast path, which CPU autocast does not stop, is off
    (it made the ratio about 1% off 1; found by scripts/device_check.py's dry run)."""
    from mmrl.experiment import build_policy, build_sim, load_experiment
    from mmrl.trainer.train_engine import autocast

    level = 0.0 if method == "noise" else 0.5
    cfg = load_experiment(
        "configs/quickstart.yaml",
        [
            "policy.dim=16",
            "policy.expert_dim=16",
            "policy.expert_layers=1",
            f"policy.method={method}",
            f"policy.noise_level={level}",
        ],
    )
    sim = build_sim(cfg, 8, seed=0)
    torch.manual_seed(0)
    policy = build_policy(cfg, sim)
    obs = sim.reset(0)
    with autocast("cpu", "bf16"):
        policy.eval()
        batch = policy.rollout(obs, torch.Generator().manual_seed(0)).batch
        policy.train()
        with torch.no_grad():
            logp = policy.evaluate(batch).logp
    assert torch.exp(logp.float() - batch["old_logp"].float()).sub(1).abs().max() < 1e-3
    assert torch.backends.mha.get_fastpath_enabled()  # restored after
