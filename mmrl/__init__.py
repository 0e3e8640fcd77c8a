"""mmrl: reinforcement-learning post-training for multimodal policies (VLM, VLA, diffusion)."""

from mmrl.utils.threads import prefer_passive_waits as _prefer_passive_waits
from mmrl.version import __version__  # noqa: F401  (mmrl.__version__)

_prefer_passive_waits()  # before torch is imported: sleeping OpenMP waits (mmrl.utils.threads)


def train(config, *overrides: str, reward=None, reward_weights=None, train_dataset=None, eval_dataset=None) -> dict:
    """Train an experiment (`mmrl.api.train`): ``mmrl.train("configs/x.yaml", "trainer.lr=1e-4", reward=fn)``;
    several rewards as TRL takes them: ``reward=[f, g], reward_weights=[1.0, 0.5]``; a Hugging Face
    ``Dataset`` of questions: ``train_dataset=ds`` (and ``eval_dataset``)."""
    from mmrl.api import train as _train

    return _train(
        config,
        *overrides,
        reward=reward,
        reward_weights=reward_weights,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
    )


def evaluate(run_or_checkpoint, *overrides: str) -> dict:
    """Evaluate a run's newest checkpoint with its own config (`mmrl.api.evaluate`)."""
    from mmrl.api import evaluate as _evaluate

    return _evaluate(run_or_checkpoint, *overrides)


def load_policy(run_or_checkpoint, device: str = "cpu"):
    """A run's trained policy for inference, without building its simulator (`mmrl.api.load_policy`)."""
    from mmrl.api import load_policy as _load

    return _load(run_or_checkpoint, device)


def export_policy(run_or_checkpoint, to, merge: bool = True, push_to_hub: str | None = None, private: bool = True):
    """`mmrl export RUN --to DIR` (`mmrl.export.export`): the trained policy in its family's format,
    with a model card; ``push_to_hub="user/repo"`` uploads it. Returns the folder."""
    from mmrl.export import export as _export

    return _export(run_or_checkpoint, to, merge=merge, push_to_hub=push_to_hub, private=private)
