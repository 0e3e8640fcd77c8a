"""The trainer's reward stage: the one place where reward models score what a policy did.

A `RewardStage` holds the experiment's reward model (a `mmrl.reward.Reward`, or a `WeightedSum` of
several; the ``reward:`` section, built by `build_reward_stage`) and scores every decision of a
rollout, in training and evaluation alike. The collectors call it right after the simulator's step
(`mmrl.rollout.act`, the placement pipeline), so success, videos, dynamic sampling and the
non-finite check all see the scored reward. Its kind follows the simulator's action type (`KINDS`):

- ``text`` (VLM answers), ``image`` and ``video`` (generated images, videos): the decision's own
  output, scored against the observation's prompt and ``meta``; ``success_threshold`` sets
  ``success = score >= threshold``;
- ``frame`` (robot simulators): an image reward scores the frames the simulator renders after each
  step of the action chunk (its step trace, `mmrl.simulator.TRACE_KEYS`), the episode's
  instruction as the prompt (VLM-RM / VLM-RL). `FrameScoring` says when: every step (``step``,
  dense), or once per episode at its end (``episode_end``: its last frame, or the mean score over
  its frames, kept per env in `EpisodeScores` across decisions); with ``shaping: potential`` every
  step is paid its score's change since the episode's previous frame (`potential_shaping`), a shaping
  term for a sparse task reward. Success stays the simulator's.

The trained reward of each step is `combine` (`mmrl.algorithms.reward_synthesis.RewardSynthesis`)
of the model's score (0 where the step was not scored) and the simulator's terms (`TERMS`): ``task``
(its own reward), ``success``, ``terminated``, ``truncated`` (0 / 1) and ``step_cost`` (-1 on each
step that ran), summed over the steps of the decision, and for generated images and videos
``diversity`` (`mmrl.algorithms.reward_audit.sample_diversity`: each sample's mean distance to the
other samples of its prompt, a guard against collapsing onto one picture; logged as ``diversity``);
``failure_term`` names a term whose steps get ``combine.failure_penalty`` instead. The default adds
the score to the task reward.

Models are built once per process for equal (name, arguments) (`reward_model`: a small cache), with
the global torch RNG left untouched, so a run builds the same policy with or without a reward model.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from mmrl.algorithms.reward_audit import sample_diversity
from mmrl.algorithms.reward_synthesis import RewardSynthesis
from mmrl.errors import UserError
from mmrl.reward import FunctionReward, Reward, RewardError, WeightedSum, as_reward, import_reference
from mmrl.simulator import Completions, Observation, StepResult
from mmrl.utils.deadline import CallLimit

#: the stage's kind by the simulator's action type, and the reward kind each stage kind scores
KINDS = {"text": "text", "image": "image", "video": "video", "chunk": "frame"}
MODEL_KIND = {"text": "text", "image": "image", "video": "video", "frame": "image"}
SCORED = {
    "text": "actions are answers (text)",
    "image": "actions are images",
    "video": "actions are videos",
    "frame": "rendered frames are images",
}
#: what `RewardStage.combine` may name besides the model's score
TERMS = ("task", "success", "terminated", "truncated", "step_cost", "diversity")
GENERATED = ("image", "video")  # the stage kinds whose samples have a `sample_diversity`
TIMINGS = ("episode_end", "step")
SHAPINGS = ("none", "potential")
EPISODE_MODES = ("final", "mean")


def unknown_terms(combine: RewardSynthesis, failure_term: str | None = None) -> list[str]:
    """The terms ``combine`` (and ``failure_term``) name that the stage does not offer (`TERMS`)."""
    return sorted(set(combine.named_terms() + ([failure_term] if failure_term else [])) - set(TERMS))


@dataclass(frozen=True)
class FrameScoring:
    """When and how a ``frame`` stage scores a robot simulator's frames (``reward.frames``)."""

    timing: str = "episode_end"  # "step": every step's frame; "episode_end": once, when the episode ends
    episode_mode: str = "final"  # episode_end: the last frame ("final") or the mean over the frames ("mean")
    view: int = 0  # the camera scored when the simulator renders several
    # per-sample reward meta built from the instruction: templates formatted with {instruction} and
    # the named groups of `instruction_pattern` (e.g. {"positive_goal": "the gripper is on the {color} disc"})
    goal_meta: dict = field(default_factory=dict)
    instruction_pattern: str | None = None
    # step: "potential" pays the change of the score since the episode's previous scored frame
    # (`potential_shaping`), "none" the score itself
    shaping: str = "none"

    def __post_init__(self) -> None:
        if self.timing not in TIMINGS:
            raise ValueError(f"timing must be one of {list(TIMINGS)}, got {self.timing!r}")
        if self.shaping not in SHAPINGS:
            raise ValueError(f"shaping must be one of {list(SHAPINGS)}, got {self.shaping!r}")
        if self.shaping == "potential" and self.timing != "step":
            raise ValueError("shaping 'potential' pays each step's change of the score: it needs timing 'step'")
        if self.episode_mode not in EPISODE_MODES:
            raise ValueError(f"episode_mode must be one of {list(EPISODE_MODES)}, got {self.episode_mode!r}")

    def meta_for(self, instructions: list[str]) -> list[dict] | None:
        """Reward meta per instruction from `goal_meta` (None without templates)."""
        if not self.goal_meta:
            return None
        pattern = re.compile(self.instruction_pattern) if self.instruction_pattern else None
        out = []
        for text in instructions:
            fields = {"instruction": text}
            if pattern is not None:
                m = pattern.search(text)
                if m is None:
                    raise ValueError(f"instruction_pattern {pattern.pattern!r} does not match instruction {text!r}")
                fields.update({k: v for k, v in m.groupdict().items() if v is not None})
            try:
                out.append({k: t.format(**fields) for k, t in self.goal_meta.items()})
            except KeyError as exc:
                raise ValueError(
                    f"goal_meta template needs field {exc} (fields: {sorted(fields)}); "
                    "name it as a group of instruction_pattern"
                ) from exc
        return out


def potential_shaping(score: torch.Tensor, last: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """Potential-based shaping (Ng, Harada, Russell 1999, with the discount 1 of a finite episode):
    each frame is paid ``score - last``, its score's change since the episode's previous scored
    frame, and 0 where there is none (``seen`` False: the episode's first frame). Over an episode the
    payments sum to its last frame's score minus its first's, so the shaping cannot pay a policy for
    lingering near the goal instead of reaching it (which ends the episode and its payments)."""
    return torch.where(seen, score - last, torch.zeros_like(score))


class EpisodeScores:
    """Per env, the running sum and count of the frame scores of the episode in progress (a
    ``frame`` stage with ``episode_mode: mean``), or its last frame's score (``shaping: potential``);
    owned by whoever runs the episodes (a collector), and saved with its episodes in progress."""

    def __init__(self, num_envs: int):
        self.total = torch.zeros(num_envs)
        self.count = torch.zeros(num_envs, dtype=torch.long)
        self.last = torch.zeros(num_envs)

    def state_dict(self) -> dict:
        return {"total": self.total.clone(), "count": self.count.clone(), "last": self.last.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.total, self.count = state["total"].clone(), state["count"].clone()
        self.last = state["last"].clone() if "last" in state else torch.zeros_like(self.total)


class RewardStage:
    """A reward model scoring each decision of a rollout (see the module docstring)."""

    SAMPLE_ROWS = 8  # completions kept for the log's table per drain

    def __init__(
        self,
        model: Reward,
        kind: str,
        success_threshold: float | None = None,
        name: str | None = None,
        combine: RewardSynthesis | None = None,
        failure_term: str | None = None,
        frames: FrameScoring | None = None,
        heldout: Reward | None = None,
    ):
        if kind not in MODEL_KIND:
            raise ValueError(f"a reward stage scores {sorted(MODEL_KIND)}, not {kind!r}")
        self.name = name or model.name
        if model.kind != MODEL_KIND[kind]:
            raise ValueError(
                f"reward '{self.name}' scores {model.kind}, but the simulator's {SCORED[kind]}: use a "
                f"reward of kind {MODEL_KIND[kind]!r}"
            )
        if kind == "frame" and success_threshold is not None:
            raise ValueError(
                "success_threshold applies to single-turn rewards (answers, images); a robot "
                "simulator's success is its own: remove reward.success_threshold"
            )
        if kind != "frame" and frames is not None:
            raise ValueError(
                f"frames options apply to robot simulators' frames, not to a {kind} reward: remove reward.frames"
            )
        self.model, self.kind, self.threshold = model, kind, success_threshold
        self.combine = combine or RewardSynthesis(weights={"model": 1.0, "task": 1.0})
        unknown = unknown_terms(self.combine, failure_term)
        if unknown:
            raise ValueError(f"combine names unknown term(s) {unknown}; terms: model, {', '.join(TERMS)}")
        if "diversity" in self.combine.named_terms() and kind not in GENERATED:
            raise ValueError(
                f"combine names 'diversity', which measures generated images and videos, not a {kind} reward's "
                "samples: remove it from reward.combine"
            )
        self.failure_term = failure_term
        self.frames = (frames or FrameScoring()) if kind == "frame" else None
        self._lock = threading.Lock()  # an async collector scores in a background thread
        self._sums: dict[str, list[float]] = {}  # part -> [sum of finite scores, count]
        self._lengths: list[int] = []  # completion lengths (tokens where known, else characters)
        self._rows: list[dict] = []  # the first `SAMPLE_ROWS` (prompt, completion, rewards) since the last drain
        self._div = [0.0, 0]  # sum and count of the finite sample diversities since the last drain
        if heldout is not None and heldout.kind != model.kind:
            raise ValueError(
                f"the held-out reward '{heldout.name}' scores {heldout.kind}, the trained one {model.kind}: "
                "audit with a reward of the same kind"
            )
        #: a reward model never trained on, scored beside the trained one on the samples of an audit
        self.heldout = heldout
        #: while auditing (`start_audit`): per scoring call, the scores and the labels of its samples
        self._audit: list[dict[str, torch.Tensor]] | None = None

    # ---- what the collectors ask ---------------------------------------------------------------
    @property
    def traced(self) -> bool:
        """Whether the simulator's step trace is needed (``step_chunk(actions, trace=True)``)."""
        return self.kind == "frame"

    @property
    def keeps_episode_state(self) -> bool:
        """Whether scoring needs per-env state across decisions (`EpisodeScores`): a frame stage's
        episode mean, or its potential-based shaping's previous score."""
        fs = self.frames  # a frame stage's (None for the others)
        return fs is not None and (
            (fs.timing == "episode_end" and fs.episode_mode == "mean") or fs.shaping == "potential"
        )

    def episode_scores(self, num_envs: int) -> EpisodeScores | None:
        """The per-env state a collector keeps for this stage across decisions (None: none needed)."""
        return EpisodeScores(num_envs) if self.keeps_episode_state else None

    @property
    def defines_success(self) -> bool:
        return self.threshold is not None

    def check_simulator(self, sim) -> None:
        """Raise ValueError naming the fix unless this stage scores what ``sim``'s actions are."""
        if KINDS.get(sim.action_type) != self.kind:
            raise ValueError(
                f"reward '{self.name}' is a {self.kind} reward stage, but the simulator's actions are "
                f"{sim.action_type!r}"
            )
        if self.kind == "frame":
            from mmrl.checks.simulator import supports_trace

            assert self.frames is not None  # every frame stage has its FrameScoring
            if not supports_trace(sim):
                raise ValueError(
                    f"reward '{self.name}' scores the frames of each step, but {type(sim).__name__}."
                    "step_chunk takes no trace= (mmrl.simulator.TRACE_KEYS): keep Simulator's own "
                    "step_chunk, or take trace= and pass it on"
                )
            views = sim.image_shape[0] if len(sim.image_shape) == 4 else 1
            if not sim.has_images:
                raise ValueError(
                    f"reward '{self.name}' scores rendered frames, but the simulator renders none "
                    "(has_images is false): enable its images or remove the reward section"
                )
            if not 0 <= self.frames.view < views:
                raise ValueError(
                    f"reward.frames.view = {self.frames.view} but the simulator renders {views} "
                    f"camera(s): use 0..{views - 1}"
                )

    def __call__(
        self, res: StepResult, obs: Observation, actions, alive: torch.Tensor, episodes: EpisodeScores | None = None
    ) -> StepResult:
        """``res`` of the decision ``actions`` taken on ``obs`` in the envs ``alive`` (bool [N]: whose
        episode the collector is still recording), its reward replaced by the combination of the
        model's score and the simulator's terms (and ``success`` set by the threshold). ``episodes``:
        the collector's `episode_scores` state, for ``episode_mode: mean`` and ``shaping: potential``."""
        if not bool(alive.any()):  # nothing recorded here (e.g. a crashed sim worker's stand-in result)
            return res
        if self.kind == "frame":
            return self._frames(res, obs, alive, episodes)
        return self._single_turn(res, obs, actions, alive)

    # ---- scoring -----------------------------------------------------------------------------
    def _score(self, samples, prompts: list[str], meta: list[dict]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The model's scores of ``samples`` (float [B], CPU) and its named parts, logged."""
        try:
            if isinstance(self.model, WeightedSum):  # every part scored once: logged, then combined
                parts = self.model.parts(samples, prompts, meta)
                score = self.model.combine(parts)
            else:
                score = self.model(samples, prompts, meta)
                parts = {self.name: score}
        except UserError:  # a user's reward function: its one line names it, what it did and the fix
            raise
        except Exception as exc:
            raise RewardError(
                f"reward '{self.name}' failed on {len(prompts)} samples (first prompt {prompts[0]!r}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self._record(parts)
        return score.float().cpu(), parts

    def _diversity(self, samples, prompts: list[str]) -> torch.Tensor | None:
        """`sample_diversity` of generated images / videos [B] (None for other kinds), its finite
        values logged as ``diversity``."""
        if self.kind not in GENERATED:
            return None
        div = sample_diversity(samples, prompts)
        ok = torch.isfinite(div)
        with self._lock:
            self._div[0] += float(div[ok].sum())
            self._div[1] += int(ok.sum())
        return div

    def _raw(self, score: torch.Tensor, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The score before any per-batch normalisation of a weighted sum's parts (what the audit
        compares across evaluations: a standardised score has mean 0 in every batch)."""
        if isinstance(self.model, WeightedSum) and self.model.normalize:
            return self.model.combine(parts, normalize=False).float().cpu()
        return score

    def _combined(
        self, score: torch.Tensor, task, success, terminated, truncated, ran: torch.Tensor, diversity=None
    ) -> torch.Tensor:
        """`combine` of one step's score [B] and terms [B] (CPU float), 0 where the step did not run;
        ``diversity`` 0 where not measured (a prompt seen once, a stage that does not measure it)."""
        terms = {
            "task": task.float().cpu(),
            "success": success.float().cpu(),
            "terminated": terminated.float().cpu(),
            "truncated": truncated.float().cpu(),
            "step_cost": -ran.float().cpu(),
            "diversity": torch.zeros(len(ran)) if diversity is None else diversity.float().cpu().nan_to_num(0.0),
        }
        ran = ran.cpu()
        failure = terms[self.failure_term].bool() & ran if self.failure_term else None
        out = self.combine(score, terms, failure)
        return torch.where(ran, out, torch.zeros_like(out))

    def _single_turn(self, res: StepResult, obs: Observation, actions, alive: torch.Tensor) -> StepResult:
        # the model scores the decisions that end their episode by the task (terminated): every
        # single-turn answer or image; of a multi-turn episode (simulators.tool_env) its answer, not
        # its tool-call turns nor a turn cut short (truncated: a cap, a tool error), scored 0 here
        answered = alive.cpu() & res.terminated.cpu()
        if not bool(answered.any()):
            return self._unscored(res, alive)
        if not bool(answered.eq(alive.cpu()).all()):
            res = self._unscored(res, alive & ~answered.to(alive.device))
        rows = answered.nonzero().flatten().tolist()
        prompts = [obs.instruction[r] for r in rows]
        meta = [dict(obs.meta[r]) if obs.meta is not None else {} for r in rows]
        samples: Completions | list | torch.Tensor
        if isinstance(actions, Completions):
            samples = Completions([actions[r] for r in rows], [actions.num_tokens[r] for r in rows])
            for m, n in zip(meta, samples.num_tokens):
                m["completion_tokens"] = n  # the overlong penalty reads it
        elif isinstance(actions, list):
            samples = [actions[r] for r in rows]
        else:
            samples = actions[torch.tensor(rows, device=actions.device)].cpu()
        score, parts = self._score(samples, prompts, meta)
        if self.kind == "text":
            self._record_completions(samples, prompts, score, parts)
        idx = torch.tensor(rows, device=res.reward.device)
        diversity = self._diversity(samples, prompts)
        raw = self._raw(score, parts)
        self._audited(raw, res.success[idx], res.reward[idx], samples, prompts, meta, diversity)  # the task's labels
        reward = res.reward.clone()
        ran = torch.ones(len(rows), dtype=torch.bool)
        reward[idx] = self._combined(
            score, res.reward[idx], res.success[idx], res.terminated[idx], res.truncated[idx], ran, diversity
        ).to(reward.device, reward.dtype)
        res.reward = reward
        if self.threshold is not None:
            success = res.success.clone()
            success[idx] |= score.to(success.device) >= self.threshold
            res.success = success
        return res

    def _unscored(self, res: StepResult, rows: torch.Tensor) -> StepResult:
        """``res`` with the reward of the ``rows`` (bool [N]) the combination of score 0 and their terms."""
        idx = rows.to(res.reward.device)
        reward = res.reward.clone()
        zero = torch.zeros(int(idx.sum()))
        reward[idx] = self._combined(
            zero, res.reward[idx], res.success[idx], res.terminated[idx], res.truncated[idx], zero == 0
        ).to(reward.device, reward.dtype)
        res.reward = reward
        return res

    def _frames(
        self, res: StepResult, obs: Observation, alive: torch.Tensor, episodes: EpisodeScores | None
    ) -> StepResult:
        """Score the frames of the decision's steps (see `FrameScoring`); the reward becomes the sum
        over its steps of `_combined`, success stays the simulator's."""
        trace = res.info.get("trace")
        if trace is None:
            raise RewardError(
                f"reward '{self.name}' scores the frames of each step, but the simulator returned no "
                "step trace: its step_chunk must take trace=True (mmrl.simulator.TRACE_KEYS; "
                "`mmrl check simulator NAME` checks it)"
            )
        fs = self.frames
        assert fs is not None  # every frame stage has its FrameScoring
        if episodes is None and self.keeps_episode_state:
            what = "episode_mode 'mean'" if fs.timing == "episode_end" else "shaping 'potential'"
            raise ValueError(f"{what} needs the collector's episode_scores state")
        frames = trace["image"]
        if frames.dim() == 6:  # several cameras: [N, K, V, H, W, 3]
            frames = frames[:, :, fs.view]
        ran = trace["active"].cpu()
        ended = ran & (trace["terminated"] | trace["truncated"]).cpu()
        recorded = alive.cpu()[:, None]  # envs whose episode the collector still records
        n, k_steps = ran.shape
        score = torch.zeros(n, k_steps)
        for k in range(k_steps):
            if fs.timing == "step":
                rows = (ran[:, k] & recorded[:, 0]).nonzero().flatten()
            elif fs.episode_mode == "final":
                rows = (ended[:, k] & recorded[:, 0]).nonzero().flatten()
            else:  # mean: every frame scored and summed; the episode's mean paid at its end
                rows = (ran[:, k] & recorded[:, 0]).nonzero().flatten()
            if rows.numel() == 0:
                continue
            prompts = [obs.instruction[i] for i in rows.tolist()]
            meta = fs.meta_for(prompts)
            if meta is None:
                meta = [dict(obs.meta[i]) for i in rows.tolist()] if obs.meta is not None else [{} for _ in prompts]
            scored = frames[rows.to(frames.device), k]
            s, parts = self._score(scored, prompts, meta)
            at = rows.to(trace["success"].device)
            raw = self._raw(s, parts)
            self._audited(raw, trace["success"][at, k], trace["reward"][at, k], scored, prompts, meta)
            if fs.timing == "episode_end" and fs.episode_mode == "mean":
                assert episodes is not None  # checked above
                episodes.total[rows] += s
                episodes.count[rows] += 1
                done = rows[ended[rows, k]]
                score[done, k] = episodes.total[done] / episodes.count[done].clamp(min=1).float()
                episodes.total[done], episodes.count[done] = 0.0, 0
            elif fs.shaping == "potential":
                assert episodes is not None  # checked above
                score[rows, k] = potential_shaping(s, episodes.last[rows], episodes.count[rows] > 0)
                episodes.last[rows], episodes.count[rows] = s, 1
                episodes.count[rows[ended[rows, k]]] = 0  # the next frame of these envs starts a new episode
            else:
                score[rows, k] = s
        reward = torch.zeros(n)
        for k in range(k_steps):  # summed step by step, as the simulator sums its own reward
            reward += self._combined(
                score[:, k],
                trace["reward"][:, k],
                trace["success"][:, k],
                trace["terminated"][:, k],
                trace["truncated"][:, k],
                ran[:, k],
            )
        res.reward = reward.to(res.reward.device)
        return res

    # ---- the audit (`mmrl.algorithms.reward_audit`) --------------------------------------------
    def start_audit(self) -> None:
        """Keep, from now until `finish_audit`, each scored sample's score with its labels: the
        simulator's own success and reward of that step (before this stage's threshold and
        combination), and the held-out reward's score where there is one."""
        with self._lock:
            self._audit = []

    def finish_audit(self) -> dict[str, torch.Tensor] | None:
        """What was kept since `start_audit` (``score``, ``success``, ``task``, ``heldout`` and
        ``diversity`` where there are; [N] each, CPU), or None when nothing was scored; stops keeping."""
        with self._lock:
            parts, self._audit = self._audit, None
        if not parts:
            return None
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def _audited(self, score, success, task, samples, prompts: list[str], meta: list[dict], diversity=None) -> None:
        if self._audit is None:
            return
        rec = {"score": score.float().cpu(), "success": success.bool().cpu(), "task": task.float().cpu()}
        if diversity is not None:
            rec["diversity"] = diversity.float().cpu()
        if self.heldout is not None:
            try:
                rec["heldout"] = self.heldout(samples, prompts, meta).float().cpu()
            except UserError:
                raise
            except Exception as exc:
                raise RewardError(
                    f"held-out reward '{self.heldout.name}' (reward.audit.heldout) failed on {len(prompts)} "
                    f"samples: {type(exc).__name__}: {exc}"
                ) from exc
        with self._lock:
            self._audit.append(rec)

    # ---- logs --------------------------------------------------------------------------------
    def _record(self, parts: dict[str, torch.Tensor]) -> None:
        with self._lock:
            for k, v in parts.items():
                v = v.float()
                ok = torch.isfinite(v)
                acc = self._sums.setdefault(k, [0.0, 0, 0.0])
                acc[0] += float(v[ok].sum())
                acc[1] += int(ok.sum())
                acc[2] += float(v[ok].double().pow(2).sum())

    def _record_completions(self, samples, prompts, score, parts) -> None:
        tokens = samples.num_tokens if isinstance(samples, Completions) else [None] * len(samples)
        lengths = [int(n) if n is not None else len(c) for c, n in zip(samples, tokens)]
        with self._lock:
            self._lengths.extend(lengths)
            for i in range(min(len(prompts), self.SAMPLE_ROWS - len(self._rows))):
                row = {"prompt": prompts[i], "completion": str(samples[i]), "reward": float(score[i])}
                if len(parts) > 1:
                    row.update({k: float(v[i]) for k, v in parts.items()})
                self._rows.append(row)

    def drain(self) -> dict:
        """What was scored since the last drain, as TRL logs it; then forgets it:
        ``rewards/<part>/mean`` and ``/std`` over the finite scores (one per part of a weighted sum,
        else the reward's own); for images and videos ``diversity`` (the mean `sample_diversity`);
        for text, ``completions/{mean,min,max}_length`` (tokens) and ``completions``,
        the first `SAMPLE_ROWS` rows of prompt, completion and rewards (the completions table)."""
        with self._lock:
            out: dict = {}
            for k, (total, n, squares) in self._sums.items():
                if n:  # TRL's rewards/<name>/mean and /std (unbiased) over the finite scores
                    out[f"rewards/{k}/mean"] = total / n
                    out[f"rewards/{k}/std"] = max(squares - total * total / n, 0.0) ** 0.5 / max(n - 1, 1) ** 0.5
            if self._div[1]:  # generated images / videos: the mean distance within a prompt's samples
                out["diversity"] = self._div[0] / self._div[1]
            if self._lengths:
                out.update(
                    {
                        "completions/mean_length": sum(self._lengths) / len(self._lengths),
                        "completions/min_length": min(self._lengths),
                        "completions/max_length": max(self._lengths),
                    }
                )
            if self._rows:
                out["completions"] = list(self._rows)
            self._sums, self._lengths, self._rows, self._div = {}, [], [], [0.0, 0]
        return out


# ---- building ------------------------------------------------------------------------------------
CACHE_SIZE = 4  # distinct registered reward models kept per process (a run's training and `mmrl eval`)
_MODELS: OrderedDict[str, Reward] = OrderedDict()


def reward_model(name: str, kwargs: dict | None = None, kind: str = "image") -> Reward:
    """The reward model ``name``: a registered reward (`mmrl list`), or a function / `Reward` class
    named by reference (``module.path:function`` or ``path/file.py:function``; ``kind`` is what a
    function scores). Registered models with equal (name, arguments) are built once per process
    (the `CACHE_SIZE` most recent are kept); building leaves the global torch RNG untouched."""
    from mmrl.registry import REWARDS

    kwargs = dict(kwargs or {})
    if ":" in name:  # a user's function (or Reward class): TRL-style, cheap to build
        with torch.random.fork_rng(devices=[]):
            return as_reward(import_reference(name), kind, name=name.rpartition(":")[2], **kwargs)
    try:
        key = json.dumps([name, kwargs], sort_keys=True)
    except TypeError:  # arguments that are objects (a model passed in Python): not cached
        key = None
    if key is not None and key in _MODELS:
        _MODELS.move_to_end(key)
        return _MODELS[key]
    with torch.random.fork_rng(devices=[]):  # a random init before loading must not move the global RNG
        model = REWARDS.build(name, **kwargs)
    if key is not None:
        _MODELS[key] = model
        while len(_MODELS) > CACHE_SIZE:
            _MODELS.popitem(last=False)
    return model


def build_reward_stage(
    type: str | None,
    kwargs: dict,
    weights: dict[str, float],
    action_type: str,
    success_threshold: float | None = None,
    combine: RewardSynthesis | None = None,
    failure_term: str | None = None,
    frames: FrameScoring | None = None,
    timeout_s: float | None = None,
    heldout: tuple[str, dict] | None = None,
    normalize_parts: bool = False,
) -> RewardStage:
    """The stage of an experiment's ``reward:`` section (`mmrl.trainer.reward_config.RewardConfig` holds the
    fields) for a simulator whose actions are ``action_type``: one model (``type``) or a weighted
    sum (``weights``, with per-part ``kwargs``), checked with its `Reward.preflight` before any work.
    ``timeout_s`` limits each call of a user's reward function (`FunctionReward`; None: automatic,
    ``inf``: none; see `mmrl.utils.deadline`). ``heldout``: (name, arguments) of a reward never
    trained on, scored beside the trained one in audits (``reward.audit.heldout``);
    ``normalize_parts``: a weighted sum's parts standardised over each scored batch (`WeightedSum`)."""
    kind = KINDS[action_type]
    if weights:
        parts = {n.rpartition(":")[2]: reward_model(n, kwargs.get(n), MODEL_KIND[kind]) for n in weights}
        model: Reward = WeightedSum(parts, list(weights.values()), normalize=normalize_parts)
        name = "weighted_sum"
    else:
        assert type is not None, "RewardConfig.validate: a reward section names a type or weights"
        model = reward_model(type, kwargs, MODEL_KIND[kind])
        name = type.rpartition(":")[2]
    for part in [r for _, r in model.items] if isinstance(model, WeightedSum) else [model]:
        if isinstance(part, FunctionReward):  # user code: limited (registered models are mmrl's)
            part.time_limit = CallLimit(timeout_s, "reward.timeout_s")
    held = reward_model(heldout[0], heldout[1], MODEL_KIND[kind]) if heldout is not None else None
    for which, m in ((name, model), *(((held.name, held),) if held is not None else ())):
        try:
            m.preflight()  # e.g. a reward server that does not answer: said before any work
        except RewardError as exc:
            raise UserError(f"reward '{which}' cannot score: {exc}") from None
    return RewardStage(
        model,
        kind,
        success_threshold,
        name=name,
        combine=combine,
        failure_term=failure_term,
        frames=frames,
        heldout=held,
    )


__all__ = [
    "RewardStage",
    "FrameScoring",
    "EpisodeScores",
    "potential_shaping",
    "build_reward_stage",
    "reward_model",
    "KINDS",
    "TERMS",
]
