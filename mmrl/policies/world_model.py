"""An action-conditioned video world model as a policy family: trained by the trainer's warm start on
recorded episodes, checkpointed and exported like any policy, and played as a simulator
(`simulators.world_model`), so a VLA trains inside it with any objective, unchanged.

``policy.type: world_model`` (`WorldModelConfig`). What it learns, from decision records
(`mmrl.episodes`: `datasets/reach_demos`, a LeRobotDataset read with ``transitions=True``, the
episodes a Dyna loop logs): given the ``context`` frames a policy saw up to a decision (newest last),
its instruction, its state and the action chunk it executed, the frame and the state that followed.

- The frame is sampled by flow matching (rectified flow: ``x_t = (1 - t) x0 + t eps``, velocity
  ``(x_t - x0) / t``, ``sample_steps`` Euler steps of the ODE from noise at ``t = 1``) of the frame's
  change (`mmrl.policies.tiny_world_model`); the state by the regression head. The network predicts
  ``x0`` (the x0 parameterisation of the same flow): the change is nearly a function of what the
  model is given, and a velocity network must first learn to copy the noise through (18 grey levels
  of error after one step where "nothing moves" had 1.8, measured with 1500 steps); the untrained
  x0 network, whose last layer starts at zero, predicts "nothing moves".
- The warm-start loss per example is the flow-matching loss (``|x0_hat - x0|^2``, the velocity
  loss weighted by ``t^2``) plus ``state_weight`` times the state's squared error (the frame model
  is conditioned on the recorded next state while training, on the predicted one while imagining).
- It does not act (``Capabilities.acts`` is False): a run of it is its warm start alone
  (``trainer.iterations: 0``, ``algorithm.objective: none``); the simulator it names (``sim``) is the
  one whose episodes it models and gives it the image size, state and action widths.

`rollout_error` measures it on held-out episodes: from each episode's first frame it imagines the
recorded chunks open-loop for a horizon and compares frames and states with what really happened,
beside the error of predicting "nothing moves" (the last real frame), the baseline to beat.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.config import ConfigError
from mmrl.episodes import next_rows, transitions
from mmrl.policies.base import Decision, Evaluation, Policy, PolicyConfig, decode_text, encode_text
from mmrl.policies.tiny_world_model import (
    TinyWorldModelNet,
    fit_keypoint,
    frames_to_unit,
    next_frame,
    unit_to_frames,
)


@dataclass
class WorldModelConfig(PolicyConfig):
    """Configuration of `WorldModelPolicy` (the ``policy`` section of a world-model run)."""

    type: str = "world_model"  # the policy family (`mmrl list`): an action-conditioned video world model
    backbone: str = "tiny"  # the built-in pixel-space model (`mmrl.policies.tiny_world_model`)
    image_size: int | None = None  # frame side; None = the simulator's (square, one camera)
    # actions per prediction: 1 (the world-model simulator steps one action at a time, so a policy of
    # any chunk size acts in it; records of single steps: the dataset's chunk_size 1)
    chunk_size: int = 1
    context: int = 1  # past frames each prediction sees (newest last; repeated at an episode's start)
    patch: int = 2  # the U-Net works on patch x patch pixel blocks (pixel unshuffle): 4x cheaper at 2
    ch: int = 16  # U-Net width (the coarse level has twice)
    mid_blocks: int = 2  # residual blocks at the coarse level
    keypoints: int = 2  # learned image points of the state, given to the frame model as maps (0: none)
    dim: int = 64  # width of the conditioning (instruction, action, state, flow time)
    sample_steps: int = 2  # Euler steps of the flow ODE per imagined frame
    state_weight: float = 1.0  # weight of the next state's squared error in the warm-start loss

    def validate(self) -> None:
        if self.backbone != "tiny":
            raise ConfigError(f"'backbone' = {self.backbone!r}: the world model's backbone is 'tiny' (built in)")
        for key in ("chunk_size", "context", "patch", "ch", "mid_blocks", "dim", "sample_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"'{key}' = {getattr(self, key)} must be >= 1")
        if self.keypoints < 0:
            raise ConfigError(f"'keypoints' = {self.keypoints} must be >= 0")
        if self.ch % 8:
            raise ConfigError(f"'ch' = {self.ch} must be a multiple of 8 (its GroupNorm has 8 groups)")
        if self.state_weight < 0:
            raise ConfigError(f"'state_weight' = {self.state_weight} must be >= 0")


def history_rows(records: dict, context: int) -> torch.Tensor:
    """long ``[M, context]``: for each decision row, the rows of the ``context`` frames up to it
    within its episode (oldest first; the episode's first row repeated before its start)."""
    nxt = next_rows(records)
    prev = torch.arange(nxt.shape[0])  # prev[r] = the row before r in its episode, or r itself
    has_next = nxt >= 0
    prev[nxt[has_next]] = has_next.nonzero().flatten()
    cols = [torch.arange(nxt.shape[0])]
    for _ in range(context - 1):
        cols.insert(0, prev[cols[0]])
    return torch.stack(cols, 1)


class WorldModelPolicy(Policy[WorldModelConfig]):
    """An action-conditioned video world model (see the module docstring)."""

    config_class = WorldModelConfig

    @classmethod
    def capabilities(cls, cfg: WorldModelConfig) -> Capabilities:
        return Capabilities(
            acts=False,
            likelihood=False,
            asynchronous=False,
            demonstrations=False,
            fixes={
                "acts": "a world model is trained by its warm start and played as a simulator (sim.type: world_model)"
            },
        )

    @classmethod
    def configure(cls, cfg: WorldModelConfig, sim) -> WorldModelConfig:
        shape = tuple(sim.image_shape)
        if len(shape) != 3 or shape[0] != shape[1]:
            raise ConfigError(
                f"the world model predicts one square camera, but simulator images are {shape}: "
                "use one camera with square frames"
            )
        if cfg.image_size is None:
            cfg = dataclasses.replace(cfg, image_size=int(shape[0]))
        elif cfg.image_size != shape[0]:
            raise ConfigError(f"'policy.image_size' = {cfg.image_size} but the simulator renders {shape[0]} px frames")
        return cfg

    def __init__(self, cfg: WorldModelConfig, action_dim: int, state_dim: int | None = None):
        super().__init__()
        if cfg.image_size is None:
            raise ConfigError("'policy.image_size' is unset: build the world model with a simulator or set it")
        self.cfg, self.action_dim, self.state_dim = cfg, int(action_dim), int(state_dim or 0)
        self.net = TinyWorldModelNet(
            image_size=cfg.image_size,
            action_dim=self.action_dim,
            chunk_size=cfg.chunk_size,
            state_dim=self.state_dim,
            context=cfg.context,
            patch=cfg.patch,
            ch=cfg.ch,
            mid_blocks=cfg.mid_blocks,
            keypoints=cfg.keypoints,
            dim=cfg.dim,
        )

    @property
    def chunk_size(self) -> int:
        return self.cfg.chunk_size

    @property
    def device(self) -> torch.device:
        return self.net.device

    # ------------------------------------------------------------------ training
    def warm_start_batch(self, data: dict) -> Batch:
        """Decision records (`mmrl.episodes`) -> one row per decision: ``context`` uint8 [M, K, H, W, 3],
        ``next_image``, ``instruction``, ``actions`` and, with a state, ``state`` / ``next_state``."""
        if "image" in data and data["image"].dim() != 4:
            raise ValueError(
                f"the world model predicts one camera, but the records' images are {tuple(data['image'].shape[1:])}"
            )
        t = transitions(data)
        if t["actions"].shape[1:] != (self.chunk_size, self.action_dim):
            raise ValueError(
                f"records hold chunks of {tuple(t['actions'].shape[1:])} but the world model takes "
                f"({self.chunk_size}, {self.action_dim}): record them with chunk_size {self.chunk_size}"
            )
        rows = history_rows(data, self.cfg.context)
        batch = Batch(
            context=data["image"][rows],
            next_image=t["next_image"],
            instruction=encode_text(t["instruction"], self.text_bytes),
            actions=t["actions"].float(),
        )
        if self.state_dim:
            if "next_state" not in t:
                raise ValueError("this world model predicts the state, but the records have no state / final_state")
            batch["state"], batch["next_state"] = t["state"].float(), t["next_state"].float()
        return batch

    @torch.no_grad()
    def update_statistics(self, batch: Batch) -> None:
        """Before the warm start: the learned keypoints start at the least-squares map from the
        state to where the frames change (`fit_keypoint`), each with its own small offset."""
        if not (self.net.keypoints and "next_image" in batch):
            return
        fit = fit_keypoint(batch["context"][:, -1], batch["next_image"], batch["state"], batch["next_state"])
        if fit is None:
            return
        w, b = fit
        k = self.net.keypoints
        offsets = torch.linspace(-1, 1, k)[:, None] * (2.0 / self.net.image_size)  # a pixel apart, along x
        self.net.keypoint.weight.copy_(w.repeat(k, 1).to(self.device))
        self.net.keypoint.bias.copy_((b[None] + torch.cat([offsets, torch.zeros(k, 1)], 1)).flatten().to(self.device))

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """Per example: the flow-matching loss of the frame's change, plus ``state_weight`` times the
        predicted state's squared error (mean over its dimensions)."""
        dev = self.device
        ctx = frames_to_unit(batch["context"].to(dev))  # [B, K, 3, H, W]
        change = (frames_to_unit(batch["next_image"].to(dev)) - ctx[:, -1]) / 2.0
        b = change.shape[0]
        actions = batch["actions"].to(dev)
        state = nxt = None
        loss = torch.zeros(b, device=dev)
        if self.state_dim:
            state, nxt = batch["state"].to(dev), batch["next_state"].to(dev)
            pred = self.net.next_state(state, actions)
            loss = loss + self.cfg.state_weight * (pred - nxt).pow(2).mean(1)
        cond = self.net.condition(decode_text(batch["instruction"]), actions, state, nxt)
        t = torch.rand(b, device=dev)
        eps = torch.randn_like(change)
        tt = t.view(-1, 1, 1, 1)
        x0 = self.net(((1 - tt) * change + tt * eps), t, ctx, cond)
        return loss + (x0 - change).pow(2).flatten(1).mean(1)

    # ------------------------------------------------------------------ imagining
    @torch.no_grad()
    def predict(
        self,
        context: torch.Tensor,
        instructions: list[str],
        actions: torch.Tensor,
        state: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The frame uint8 ``[B, H, W, 3]`` and state ``[B, D]`` (None without one) after executing
        ``actions [B, C, A]`` from ``context`` uint8 ``[B, K, H, W, 3]`` (newest last), sampled with
        ``sample_steps`` Euler steps from noise drawn on ``generator``."""
        dev = self.device
        ctx = frames_to_unit(context.to(dev))
        actions = actions.to(dev).float()
        nxt = None
        if self.state_dim:
            if state is None:
                raise ValueError(f"this world model reads a {self.state_dim}-dim state: pass state")
            state = state.to(dev).float()
            nxt = self.net.next_state(state, actions)
        cond = self.net.condition(instructions, actions, state, nxt)
        b = ctx.shape[0]
        x = torch.randn((b, *self.net.sample_shape), generator=generator, device=dev)
        k = self.cfg.sample_steps
        for i in range(k):  # t from 1 to 0 in k Euler steps of the velocity (x_t - x0) / t
            t = torch.full((b,), 1.0 - i / k, device=dev)
            x0 = self.net(x, t, ctx, cond)
            x = x0 if i == k - 1 else x - (x - x0) / (k - i)
        return unit_to_frames(next_frame(ctx[:, -1], x)), nxt

    # ------------------------------------------------------------------ not a policy that acts
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        raise NotImplementedError(
            "a world model does not act: it is trained by its warm start and played as a simulator "
            "(sim.type: world_model)"
        )

    def evaluate(self, batch: Batch) -> Evaluation:
        raise NotImplementedError("a world model has no actions to score: it is played as a simulator")


@torch.no_grad()
def imagine_records(model: WorldModelPolicy, records: dict, seed: int = 0, batch_size: int = 256) -> dict:
    """Recorded episodes as the world model imagines them: from each episode's first observation it
    replays the recorded actions open loop, and every later observation (``image``, ``state``,
    ``final_image``, ``final_state``) is replaced by the imagined one; the first observations, the
    actions and the real outcomes (rewards, success, ends) stay. Labelled with what really happened,
    these are the frames a reward model judging imagined episodes must learn (`mmrl.dyna`), and
    beside the real ones they measure the model (`rollout_error`)."""
    model.eval()
    t = transitions(records)
    nr, ep = next_rows(records), records["episode"].long()
    out = {**records, "image": records["image"].clone(), "final_image": records["final_image"].clone()}
    with_state = bool(model.state_dim) and "final_state" in records
    if with_state:
        out["state"], out["final_state"] = records["state"].clone(), records["final_state"].clone()
    starts = (records["step"].long() == 0).nonzero().flatten()
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for lo in range(0, len(starts), batch_size):
        rows = starts[lo : lo + batch_size]
        ctx = records["image"][rows][:, None].expand(-1, model.cfg.context, -1, -1, -1).clone()
        state = t["state"][rows].float() if model.state_dim else None
        alive = torch.ones(len(rows), dtype=torch.bool)
        while bool(alive.any()):
            instr = [t["instruction"][r] for r in rows.tolist()]
            img, nxt_state = model.predict(ctx, instr, t["actions"][rows], state, gen)
            img = img.cpu()
            nxt = nr[rows]
            on, ends = alive & (nxt >= 0), alive & (nxt < 0)
            out["image"][nxt[on]] = img[on]
            out["final_image"][ep[rows[ends]]] = img[ends]
            if with_state and nxt_state is not None:
                cpu_state = nxt_state.cpu().to(out["state"].dtype)
                out["state"][nxt[on]] = cpu_state[on]
                out["final_state"][ep[rows[ends]]] = cpu_state[ends].to(out["final_state"].dtype)
            alive = on
            rows = torch.where(on, nxt, rows)  # an ended episode stays, masked out
            ctx = torch.cat([ctx[:, 1:], img[:, None]], 1)
            state = nxt_state
    return out


@torch.no_grad()
def rollout_error(model: WorldModelPolicy, records: dict, horizon: int, seed: int = 0, batch_size: int = 256) -> dict:
    """Open-loop quality on recorded (held-out) episodes (`imagine_records`): per step ``k`` =
    1..horizon of the episodes still running at ``k``, ``frame_mae`` (mean absolute pixel error,
    0-255, of the imagined frame after step k against the real one), ``copy_mae`` (the same for the
    episode's first frame: predicting that nothing moves), ``state_mae`` (with a state) and
    ``episodes``; and their means over the steps (each step weighted by its episodes)."""
    real, imagined = transitions(records), transitions(imagine_records(model, records, seed, batch_size))
    step = records["step"].long()
    first = records["image"][(step == 0).nonzero().flatten()]
    start_of = torch.zeros(int(records["episode"].max()) + 1 if len(step) else 0, dtype=torch.long)
    start_of[records["episode"][step == 0]] = torch.arange(len(first))
    target = real["next_image"].float()
    err = (imagined["next_image"].float() - target).abs().flatten(1).mean(1)
    copy = (first[start_of[records["episode"]]].float() - target).abs().flatten(1).mean(1)
    state_err = (imagined["next_state"] - real["next_state"]).abs().mean(1) if model.state_dim else None
    steps = []
    for k in range(1, horizon + 1):
        rows = step == k - 1
        n = int(rows.sum())
        if not n:
            break
        row = {"step": k, "episodes": n, "frame_mae": float(err[rows].mean()), "copy_mae": float(copy[rows].mean())}
        if state_err is not None:
            row["state_mae"] = float(state_err[rows].mean())
        steps.append(row)
    total = sum(r["episodes"] for r in steps) or 1
    out: dict = {"horizon": horizon, "steps": steps}
    for key in ("frame_mae", "copy_mae", "state_mae"):
        if steps and key in steps[0]:
            out[key] = sum(r[key] * r["episodes"] for r in steps) / total
    return out
