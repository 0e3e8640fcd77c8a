"""Tests for mmrl.config: loading, overrides, variants, errors, round trip."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from mmrl.config import ConfigError, Variants, config_keys, load_config, save_config, to_dict, variants_of


# A small schema, three levels deep: root -> trainer -> optim.
@dataclass
class OptimConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["constant", "cosine"] = "constant"


@dataclass
class TrainerConfig:
    batch_size: int = 32
    epochs: int = 1
    lr: float = 1e-3
    clip: float | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)

    def validate(self):
        if self.batch_size % 2:
            raise ConfigError(f"batch_size must be even, got {self.batch_size}")


@dataclass
class AlgoConfig(Variants):
    type: str = "ppo"
    gamma: float = 0.99
    adv: Literal["gae", "grpo"] = "gae"


@AlgoConfig.variant("grpo")
@dataclass
class GRPOConfig(AlgoConfig):
    group_size: int = 8
    adv: Literal["gae", "grpo"] = "grpo"


@AlgoConfig.variant("rloo")
@dataclass
class RLOOConfig(AlgoConfig):
    leave_one_out: bool = True


@dataclass
class RunConfig:
    name: str
    tags: list[str] = field(default_factory=list)
    seed: int = 0
    debug: bool = False


@dataclass
class SimConfig:
    num_envs: int = 16
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Experiment:
    run: RunConfig
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    algorithm: AlgoConfig = field(default_factory=AlgoConfig)
    sim: SimConfig = field(default_factory=lambda: SimConfig(num_envs=64))


YAML = """
run:
  name: demo
  tags: [a, b]
trainer:
  lr: 1e-5          # YAML 1.1 reads this as the string "1e-5"
  batch_size: 8
  optim:
    schedule: cosine
algorithm:
  type: grpo
  group_size: 4
sim:
  kwargs: {robot: panda, cams: [1, 2]}
"""


@pytest.fixture
def yaml_path(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(YAML)
    return path


def error(overrides=(), data=None, schema=Experiment):
    data = {"run": {"name": "x"}} if data is None else data
    with pytest.raises(ConfigError) as info:
        load_config(schema, data, overrides)
    return str(info.value)


def test_load_yaml(yaml_path):
    cfg = load_config(Experiment, yaml_path)
    assert cfg.run == RunConfig(name="demo", tags=["a", "b"])
    assert cfg.trainer.lr == 1e-5 and isinstance(cfg.trainer.lr, float)
    assert cfg.trainer.batch_size == 8 and cfg.trainer.epochs == 1 and cfg.trainer.clip is None
    assert cfg.trainer.optim == OptimConfig(schedule="cosine")
    assert type(cfg.algorithm) is GRPOConfig
    assert (cfg.algorithm.type, cfg.algorithm.group_size, cfg.algorithm.adv) == ("grpo", 4, "grpo")
    # a partially given section goes on top of the default_factory instance (num_envs=64)
    assert cfg.sim == SimConfig(num_envs=64, kwargs={"robot": "panda", "cams": [1, 2]})


def test_defaults_and_missing_sections():
    cfg = load_config(Experiment, {"run": {"name": "x"}})
    assert cfg == Experiment(run=RunConfig(name="x"))
    assert type(cfg.algorithm) is AlgoConfig and cfg.algorithm.type == "ppo"
    assert cfg.sim.num_envs == 64


def test_overrides_of_each_type(yaml_path):
    cfg = load_config(
        Experiment,
        yaml_path,
        [
            "trainer.lr=3e-6",
            "trainer.epochs=3",
            "trainer.clip=1",
            "run.debug=true",
            "run.name=other",
            "run.tags=[x, y, z]",
            "trainer.optim.betas=[0.8, 0.9]",
            "trainer.optim.schedule=constant",
            "sim.num_envs=128",
            "sim.kwargs.robot=ur5",
            "sim.kwargs.new.deep=1",
            "algorithm.gamma=1",
        ],
    )
    assert cfg.trainer.lr == 3e-6 and cfg.trainer.epochs == 3
    assert cfg.trainer.clip == 1.0 and isinstance(cfg.trainer.clip, float)
    assert cfg.run == RunConfig(name="other", tags=["x", "y", "z"], debug=True)
    assert cfg.trainer.optim == OptimConfig(betas=(0.8, 0.9), schedule="constant")
    assert cfg.sim == SimConfig(num_envs=128, kwargs={"robot": "ur5", "cams": [1, 2], "new": {"deep": 1}})
    assert cfg.algorithm.gamma == 1.0 and cfg.algorithm.group_size == 4
    assert load_config(Experiment, yaml_path, ["trainer.clip=null"]).trainer.clip is None


def test_source_dict_is_not_mutated():
    data = {"run": {"name": "x"}}
    load_config(Experiment, data, ["run.seed=3", "trainer.lr=0.5"])
    assert data == {"run": {"name": "x"}}


def test_variant_by_override_keeps_given_keys(yaml_path):
    cfg = load_config(
        Experiment,
        {"run": {"name": "x"}, "algorithm": {"gamma": 0.5}},
        ["algorithm.type=grpo", "algorithm.group_size=16"],
    )
    assert type(cfg.algorithm) is GRPOConfig
    assert (cfg.algorithm.gamma, cfg.algorithm.group_size, cfg.algorithm.adv) == (0.5, 16, "grpo")
    # switching away from grpo: the given grpo-only key is now unknown, and the message says so
    msg = error(["algorithm.type=rloo"], data=yaml.safe_load(YAML))
    assert "unknown config key 'algorithm.group_size'" in msg and "(type 'rloo')" in msg
    assert "leave_one_out" in msg
    cfg = load_config(Experiment, {"run": {"name": "x"}}, ["algorithm.type=rloo", "algorithm.leave_one_out=false"])
    assert type(cfg.algorithm) is RLOOConfig and cfg.algorithm.leave_one_out is False
    assert cfg.algorithm.type == "rloo"


def test_variant_built_by_hand_has_its_type():
    assert GRPOConfig().type == "grpo" and AlgoConfig().type == "ppo"
    assert variants_of(AlgoConfig) == {"ppo": AlgoConfig, "grpo": GRPOConfig, "rloo": RLOOConfig}
    assert variants_of(GRPOConfig) == {"grpo": GRPOConfig}


def test_unknown_variant_lists_registered_types():
    msg = error(["algorithm.type=grpoo"])
    assert "'algorithm.type' = 'grpoo'" in msg
    assert "ppo, grpo, rloo" in msg and "did you mean 'grpo'" in msg


def test_unknown_key_names_path_choices_and_suggestion():
    msg = error(["trainer.lrr=1"])
    assert msg == (
        "unknown config key 'trainer.lrr'. Valid keys under 'trainer': batch_size, clip, "
        "epochs, lr, optim (did you mean 'lr'?)"
    )
    msg = error(data={"run": {"name": "x"}, "trainer": {"optim": {"shedule": "cosine"}}})
    assert "'trainer.optim.shedule'" in msg and "did you mean 'schedule'" in msg
    msg = error(["trainr.lr=1"])
    assert "unknown config key 'trainr'" in msg and "at the top level" in msg and "'trainer'" in msg
    assert "'trainer.lr' must be a float, got {'x': 1}" in error(["trainer.lr.x=1"])
    assert "'trainer.lr' is a value, not a section" in error(["trainer.lr=1", "trainer.lr.x=1"])


def test_bad_types():
    assert error(["trainer.lr=abc"]) == "config key 'trainer.lr' must be a float, got 'abc' (str)"
    msg = error(["trainer.epochs=true"])  # bool is not an int
    assert "config key 'trainer.epochs' must be an int, got True (bool)" == msg
    assert "'trainer.epochs' must be an int, got 1.5" in error(["trainer.epochs=1.5"])
    assert "'trainer.lr' must be a float, got True (bool)" in error(["trainer.lr=yes"])
    assert "'run.debug' must be a bool" in error(["run.debug=1"])
    assert "'run.tags[1]' must be a string, got 2 (int)" in error(["run.tags=[a, 2]"])
    assert "'run.tags' must be a list" in error(["run.tags=a"])
    assert "'trainer.optim.betas' must have 2 items" in error(["trainer.optim.betas=[1, 2, 3]"])
    assert "'trainer' must be a section" in error(["trainer=5"])
    assert "'sim.kwargs' must be a mapping" in error(["sim.kwargs=[1]"])
    assert "'trainer.clip' must be a float" in error(["trainer.clip=big"])


def test_float_strings_are_coerced():
    assert load_config(Experiment, {"run": {"name": "x"}, "trainer": {"lr": "1e-5"}}).trainer.lr == 1e-5
    assert load_config(Experiment, None, ["run.name=x", "trainer.lr=-2E3"]).trainer.lr == -2000.0
    # only for float fields: a str field keeps the text
    assert load_config(Experiment, None, ["run.name=1e-5"]).run.name == "1e-5"


def test_literal_values():
    msg = error(["algorithm.adv=grpoo"])
    assert msg.startswith("config key 'algorithm.adv' = 'grpoo' is not one of: gae, grpo")
    assert "is not one of: constant, cosine" in error(["trainer.optim.schedule=linear"])


def test_required_field():
    assert error(data={}) == "config key 'run.name' is required"
    assert error(data={"run": {"tags": []}}) == "config key 'run.name' is required"


@pytest.mark.parametrize("bad", ["trainer.lr", "=3", "trainer..lr=1", "trainer lr=1", "1x=2", ""])
def test_malformed_override(bad):
    assert error([bad]) == f"override {bad!r} must look like key.path=value (e.g. trainer.lr=1e-5)"


def test_validate_hook_gets_path_prefix():
    assert error(["trainer.batch_size=7"]) == "config section 'trainer': batch_size must be even, got 7"


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Experiment, tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(Experiment, tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("run: {name: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(Experiment, str(tmp_path / "bad.yaml"))


def test_round_trip(yaml_path, tmp_path):
    cfg = load_config(Experiment, yaml_path, ["trainer.clip=0.5", "trainer.optim.betas=[0.5, 0.6]"])
    out = save_config(cfg, tmp_path / "ckpt" / "config.yaml")
    text = out.read_text()
    assert "type: grpo" in text
    again = load_config(Experiment, out)
    assert again == cfg and type(again.algorithm) is GRPOConfig
    assert isinstance(again.trainer.optim.betas, tuple)
    assert to_dict(cfg)["algorithm"] == {"type": "grpo", "gamma": 0.99, "adv": "grpo", "group_size": 4}
    assert yaml.safe_load(text) == to_dict(cfg)


def test_config_keys():
    keys = config_keys(Experiment)
    assert "run.name: str (required)" in keys
    assert "trainer.lr: float = 0.001" in keys
    assert "trainer.optim.schedule: Literal['constant', 'cosine'] = 'constant'" in keys
    assert "sim.num_envs: int = 64" in keys  # the default_factory's value
    assert "algorithm.type: str = 'ppo'" in keys
    assert "algorithm.group_size: int = 8  [type=grpo]" in keys
    assert "algorithm.leave_one_out: bool = True  [type=rloo]" in keys


def test_schema_deeper_than_three_levels_is_rejected():
    @dataclass
    class D:
        x: int = 0

    @dataclass
    class C:
        d: D = field(default_factory=D)

    @dataclass
    class B:
        c: C = field(default_factory=C)

    @dataclass
    class A:
        b: B = field(default_factory=B)

    with pytest.raises(TypeError, match="too deep at 'b.c.d'"):
        load_config(A, {})
    assert load_config(B, {"c": {"d": {"x": 2}}}) == B(C(D(2)))


def test_variant_decorator_misuse():
    with pytest.raises(TypeError, match="@dataclass"):

        @AlgoConfig.variant("nope")
        class NotADataclass(AlgoConfig):
            pass

    with pytest.raises(TypeError, match="already registered"):

        @AlgoConfig.variant("grpo")
        @dataclass
        class Again(AlgoConfig):
            pass


@pytest.mark.parametrize(
    "path", sorted(Path(__file__).resolve().parents[1].glob("configs/*.yaml")), ids=lambda p: p.name
)
def test_every_shipped_config_loads(path):
    """Every file in configs/ validates (keys, registered names, simulator arguments) as shipped."""
    from mmrl.experiment import load_experiment
    from mmrl.registry import MissingDependencyError

    try:
        cfg = load_experiment(path)
    except MissingDependencyError as exc:  # e.g. the LeRobot configs outside .venv-lerobot
        pytest.skip(str(exc))
    assert cfg.run.name == path.stem


# values that cannot be right fail at load time, naming the key and the valid range (issue 18)
@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.iterations=-3", "'iterations' = -3 must be >= 0"),
        ("trainer.lr=-1", "'lr' = -1.0 must be > 0"),
        ("trainer.checkpoint_every=0", "'checkpoint_every' = 0 must be >= 1"),
        ("trainer.keep_checkpoints=0", "'keep_checkpoints' = 0 must be >= 1"),
        ("trainer.eval_episodes=0", "'eval_episodes' = 0 must be >= 1"),
        ("algorithm.gamma=2", "'gamma' = 2.0 must be between 0 and 1"),
        ("algorithm.lam=-0.1", "'lam' = -0.1 must be between 0 and 1"),
        ("algorithm.clip_low=-0.5", "'clip_low' = -0.5 must be > 0"),
        ("algorithm.dual_clip=0.5", "'dual_clip' = 0.5 must be > 1"),
        ("algorithm.minibatch_size=0", "'minibatch_size' = 0 must be >= 1"),
        ("algorithm.epochs=0", "'epochs' = 0 must be >= 1"),
        ("sim.num_envs=0", "'num_envs' = 0 must be >= 1"),
        ("warm_start.lr=0", "'lr' = 0.0 must be > 0"),
        ("run.device=gpu0", "'device' = 'gpu0' is not a device"),
    ],
)
def test_impossible_values_fail_at_load(override, message):
    from mmrl.experiment import load_experiment

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_experiment(None, [override])


def test_edge_values_that_are_right_still_load():
    from mmrl.experiment import load_experiment

    cfg = load_experiment(
        None,
        [
            "trainer.iterations=0",
            "algorithm.gamma=1",
            "algorithm.lam=0",
            "run.threads=-1",
            "run.device=cuda:1",
            "algorithm.clip_high=null",
        ],
    )
    assert cfg.trainer.iterations == 0 and cfg.algorithm.gamma == 1.0


# what the algorithm asks of the policy is checked against its declared capabilities when the config
# loads (mmrl.capabilities), naming the capability and the policy's own fix (issue 28)
@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["policy={type: gaussian}", "sim.type=gym", "sim.kwargs={env_id: Pendulum-v1}", "algorithm.objective=awm"],
            "'algorithm.objective' = 'awm' needs a likelihood-free loss .*, which policy 'gaussian' does not have as "
            "configured: the Gaussian policy has no flow-matching loss: use algorithm.objective=ppo",
        ),
        (
            ["policy.critic=false", "algorithm.advantage=gae"],
            "'algorithm.advantage' = 'gae' needs a critic .*, which policy 'flow_vla' does not have as configured: "
            "set policy.critic=true",
        ),
        (
            ["algorithm.kl_coef=0.1"],
            "'algorithm.kl_coef' > 0 needs a reference model, which policy 'flow_vla' does not "
            "provide as configured: the flow VLA keeps no reference model",
        ),
        (
            ["algorithm.objective=nft"],
            "'algorithm.objective' = 'nft' needs DiffusionNFT's forward-process loss .*, which policy 'flow_vla' "
            "does not have as configured: DiffusionNFT is for flow-matching generators",
        ),
        (["algorithm.objective=trpo"], "'objective' = 'trpo' is not one of: awm, nft, ppo"),
    ],
)
def test_what_a_policy_cannot_do_fails_at_load(overrides, message):
    from mmrl.experiment import load_experiment

    with pytest.raises(ConfigError, match=message):
        load_experiment(None, overrides)


def test_every_policy_declares_capabilities_its_checker_agrees_with():
    """Each registered policy's capabilities are data (frozen) for its default config; `mmrl check
    policy` compares them with what its rollouts hold (tests/policies/test_policy_check.py)."""
    import dataclasses

    from mmrl.capabilities import Capabilities
    from mmrl.registry import POLICIES, MissingDependencyError

    for name in POLICIES.names():
        try:
            cls = POLICIES.get(name)
        except MissingDependencyError:
            continue
        caps = cls.capabilities(cls.config_class())
        assert isinstance(caps, Capabilities), name
        with pytest.raises(dataclasses.FrozenInstanceError):
            caps.critic = not caps.critic
