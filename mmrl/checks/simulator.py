"""Contract checker for simulators (see `mmrl.simulator`).

``check_simulator(sim_or_factory)`` drives a simulator through the contract with random actions and
raises ``AssertionError`` naming the check and the problem on the first violation; it returns the
names of the checks that passed (a list with ``notes``, ``action_bounds`` = ``"clipped"`` or
``"rejected"`` attached). It is generic: it only uses ``reset``, ``step``, ``step_chunk`` and, when
implemented, ``get_state`` / ``set_state``; checks that need a snapshot are done in a weaker form
(with a note) when the simulator has none.

Checks, in order:

- ``attributes``: num_envs, action_dim, max_episode_steps, image_shape, state_dim, device.
- ``reset``: an `Observation` with image uint8 ``[N, *image_shape]``, N instruction strings, state
  float ``[N, state_dim]`` (or None when state_dim is None), everything on ``sim.device``.
- ``reset_deterministic``: the same seed twice gives identical observations.
- ``reset_seed_list``: a seed list with repeats gives identical rows for equal seeds, and
  ``reset(s)`` equals ``reset([s, s+1, ...])``.
- ``step`` / ``step_chunk``: a `StepResult` with reward float ``[N]``, terminated / truncated /
  success bool ``[N]``, finite values, on the device; ``final_obs`` when some env is done.
- ``state_roundtrip``: ``get_state`` returns copies and ``set_state`` reproduces the next steps.
- ``action_bounds``: actions outside ``[-1, 1]`` are rejected (an exception) or clipped (same result
  as the clipped actions; needs a snapshot to tell, else a note).
- ``episode``: random steps until just before the time limit: no episode outlives
  ``max_episode_steps``, ``truncated`` only at the limit, ``final_obs`` for every done row.
- ``truncation``: episodes reaching ``max_episode_steps`` end (inside a chunk).
- ``chunk_mid_episode_end``: with a snapshot, a chunk equals the same actions stepped one at a
  time up to each env's end (reward sum, flags, final observation), so actions after the end of an
  episode are ignored.
- ``step_trace``: ``step_chunk(actions, trace=True)`` (what the reward stage scores a robot
  simulator's frames from, `mmrl.simulator.TRACE_KEYS`) has every key in shape, its per-step rewards
  and flags add up to the result's, the frame where an episode ended is its ``final_obs``; with a
  snapshot, the traced chunk equals the untraced one and each step's frame the one-step replay's.
- ``auto_reset``: envs that ended keep running a fresh episode (not truncated again at once).

Single-turn simulators (``action_type`` text or image) get random answers / images of their type,
and instead of the chunk, bounds and time-limit checks: ``single_turn``, every decision ends every
episode with a ``final_obs``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from mmrl.simulator import (
    ACTION_TYPES,
    STEP_FIELDS,
    Completions,
    Observation,
    Simulator,
    StepResult,
    step_result_problem,
)


def supports_trace(sim) -> bool:
    """Whether ``sim.step_chunk`` takes ``trace=`` (step traces, `mmrl.simulator.TRACE_KEYS`)."""
    import inspect

    try:
        return "trace" in inspect.signature(sim.step_chunk).parameters
    except (TypeError, ValueError):
        return False


class CheckResult(list):
    """Names of the passed checks, plus ``notes`` (skipped or weakened checks) and
    ``action_bounds`` ("clipped", "rejected" or "unverified")."""

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self.action_bounds = "unverified"


class _Checker:
    def __init__(self, sim: Any, seed: int, chunk_size: int, verbose: bool):
        self.sim = sim
        self.seed = seed
        self.chunk_size = chunk_size
        self.verbose = verbose
        self.result = CheckResult()
        self.check = "setup"
        self.gen = torch.Generator().manual_seed(seed)

    # -------------------------------------------------------------- helpers
    def fail(self, msg: str) -> NoReturn:
        raise AssertionError(f"check_simulator[{self.check}] {type(self.sim).__name__}: {msg}")

    def ensure(self, cond: Any, msg: str) -> None:
        if not cond:
            self.fail(msg)

    def passed(self) -> None:
        self.result.append(self.check)

    def note(self, msg: str) -> None:
        self.result.notes.append(f"{self.check}: {msg}")
        if self.verbose:
            print(f"check_simulator[{self.check}] note: {msg}")

    def on_device(self, t: torch.Tensor) -> bool:
        want = torch.device(self.sim.device)
        return t.device.type == want.type and (want.index is None or t.device.index == want.index)

    @property
    def traces(self) -> bool:
        """Whether ``step_chunk`` takes ``trace=`` (`mmrl.simulator.TRACE_KEYS`; every `Simulator`
        subclass that keeps the default ``step_chunk`` does)."""
        return supports_trace(self.sim)

    @property
    def single_turn(self) -> bool:
        """Text, image and video simulators: one decision per episode, actions of their natural type."""
        return getattr(self.sim, "action_type", "chunk") != "chunk"

    def actions(self, *shape: int, scale: float = 1.0):
        """Random actions of the simulator's type: float ``[*shape, action_dim]`` in [-scale, scale]
        for a chunk simulator; for a single-turn one, ``shape[0]`` random answers, images or videos."""
        kind = getattr(self.sim, "action_type", "chunk")
        if kind == "text":
            words = ["0", "1", "2", "3", "red", "blue", "yes", "no", "(A)", "x = 4", ""]
            pick = torch.randint(0, len(words), (shape[0],), generator=self.gen).tolist()
            return Completions([words[i] for i in pick], [max(1, len(words[i])) for i in pick])
        if kind in ("image", "video"):  # image_shape: (H, W, 3), a video's (F, H, W, 3)
            img = torch.randint(0, 256, (shape[0], *self.sim.image_shape), generator=self.gen, dtype=torch.uint8)
            return img.to(self.sim.device)
        a = (torch.rand(*shape, self.sim.action_dim, generator=self.gen) * 2 - 1) * scale
        return a.to(self.sim.device)

    def first(self, x):
        """The first step of a chunk (a single-turn action is its own first step)."""
        return x if self.single_turn else x[:, 0]

    def snapshot(self) -> dict | None:
        if not callable(getattr(self.sim, "get_state", None)) or not callable(getattr(self.sim, "set_state", None)):
            return None
        try:
            return self.sim.get_state()
        except NotImplementedError:
            return None

    def obs(self, obs: Any, what: str, rows: torch.Tensor | None = None) -> None:
        sim, n = self.sim, self.sim.num_envs
        self.ensure(isinstance(obs, Observation), f"{what} must be an Observation, got {type(obs).__name__}")
        img = obs.image
        self.ensure(isinstance(img, torch.Tensor), f"{what}.image must be a torch.Tensor, got {type(img).__name__}")
        self.ensure(img.dtype == torch.uint8, f"{what}.image must be uint8, got {img.dtype}")
        want = (n, *sim.image_shape)
        self.ensure(tuple(img.shape) == want, f"{what}.image shape {tuple(img.shape)} != [N, *image_shape] {want}")
        self.ensure(self.on_device(img), f"{what}.image is on {img.device}, sim.device is {sim.device}")
        ins = obs.instruction
        self.ensure(
            isinstance(ins, list) and len(ins) == n,
            f"{what}.instruction must be a list of {n} strings, got {type(ins).__name__} "
            f"of length {len(ins) if hasattr(ins, '__len__') else '?'}",
        )
        self.ensure(all(isinstance(s, str) for s in ins), f"{what}.instruction must hold str only")
        if sim.state_dim is None:
            self.ensure(obs.state is None, f"{what}.state must be None when state_dim is None")
            return
        st = obs.state
        self.ensure(isinstance(st, torch.Tensor), f"{what}.state must be a tensor (state_dim={sim.state_dim})")
        self.ensure(st.is_floating_point(), f"{what}.state must be float, got {st.dtype}")
        self.ensure(
            tuple(st.shape) == (n, sim.state_dim),
            f"{what}.state shape {tuple(st.shape)} != [N, state_dim] {(n, sim.state_dim)}",
        )
        self.ensure(self.on_device(st), f"{what}.state is on {st.device}, sim.device is {sim.device}")
        chk = st if rows is None else st[rows]
        self.ensure(torch.isfinite(chk).all(), f"{what}.state has NaN/inf")
        if rows is None:
            self.ensure(all(len(s) > 0 for s in ins), f"{what}.instruction has an empty string")

    def step_result(self, res: Any, what: str) -> None:
        problem = step_result_problem(res, self.sim.num_envs)  # the trainer's boundary check, shared
        self.ensure(problem is None, f"{what}: {problem}")
        self.ensure(torch.isfinite(res.reward).all(), f"{what}: reward has NaN/inf")
        for name in STEP_FIELDS:
            t = getattr(res, name)
            self.ensure(self.on_device(t), f"{what}: {name} is on {t.device}, sim.device is {self.sim.device}")
        self.obs(res.obs, f"{what}.obs")
        done = res.terminated | res.truncated
        if done.any():
            self.ensure(res.final_obs is not None, f"{what}: final_obs is None although envs {_rows(done)} are done")
            self.obs(res.final_obs, f"{what}.final_obs", rows=done)

    def compare(self, a: StepResult, b: StepResult) -> str | None:
        """First difference between two results of the same actions from the same state."""
        for name in ("terminated", "truncated", "success"):
            if not torch.equal(getattr(a, name), getattr(b, name)):
                return f"{name} differs: {getattr(a, name).tolist()} vs {getattr(b, name).tolist()}"
        if not torch.allclose(a.reward, b.reward, atol=1e-5, rtol=1e-5):
            return f"reward differs: {a.reward.tolist()} vs {b.reward.tolist()}"
        done = a.terminated | a.truncated
        for label, oa, ob, rows in (("obs", a.obs, b.obs, ~done), ("final_obs", a.final_obs, b.final_obs, done)):
            if not rows.any():
                continue
            diff = _obs_diff(oa, ob, rows)
            if diff:
                return f"{label} {diff}"
        return None

    # -------------------------------------------------------------- checks
    def run(self, num_steps: int | None) -> CheckResult:
        self.attributes()
        self.resets()
        self.steps()
        self.state_roundtrip()  # before the checks that rely on snapshots
        if self.single_turn:  # no chunks, no bounds: every decision is a whole episode
            self.single_turn_episodes()
            return self.result
        self.action_bounds()
        self.episode(num_steps)
        return self.result

    def single_turn_episodes(self) -> None:
        """Every decision ends its episode; a text simulator whose observations carry a
        conversation (``Observation.messages``: multi-turn, `simulators.tool_env`) instead ends
        every episode within ``max_episode_steps`` decisions."""
        sim, n = self.sim, self.sim.num_envs
        self.check = "single_turn"
        obs = sim.reset(self.seed + 3)
        turns = sim.action_type == "text" and getattr(obs, "messages", None) is not None
        self.ensure(
            turns or sim.max_episode_steps == 1,
            f"a {sim.action_type} simulator is single-turn: max_episode_steps must be 1, got {sim.max_episode_steps} "
            "(a multi-turn text simulator's observations carry the conversation: Observation.messages)",
        )
        for _ in range(2):
            ended = torch.zeros(n, dtype=torch.bool)
            for _ in range(sim.max_episode_steps):
                res = sim.step_chunk(self.actions(n))
                self.step_result(res, "step_chunk")
                if res.done.any():
                    self.obs(res.final_obs, "final_obs", res.done.cpu())
                ended |= res.done.cpu()
                if ended.all():
                    break
            self.ensure(
                bool(ended.all()),
                "every decision of a single-turn simulator must end its episode"
                if not turns
                else "every episode of a multi-turn simulator must end within max_episode_steps = "
                f"{sim.max_episode_steps} turns",
            )
        self.passed()

    def attributes(self) -> None:
        self.check = "attributes"
        sim = self.sim
        for name in ("num_envs", "action_dim", "max_episode_steps", "image_shape", "device"):
            self.ensure(hasattr(sim, name), f"missing attribute {name!r}")
        kind = getattr(sim, "action_type", "chunk")
        self.ensure(kind in ACTION_TYPES, f"action_type must be one of {list(ACTION_TYPES)}, got {kind!r}")
        for name in ("num_envs", "max_episode_steps") + (() if self.single_turn else ("action_dim",)):
            v = getattr(sim, name)
            self.ensure(
                isinstance(v, int) and not isinstance(v, bool) and v > 0, f"{name} must be a positive int, got {v!r}"
            )
        shape = tuple(sim.image_shape)
        self.ensure(
            len(shape) in (3, 4) and shape[-1] == 3 and all(isinstance(s, int) and s > 0 for s in shape),
            f"image_shape must be (H, W, 3) or (V, H, W, 3), got {sim.image_shape!r}",
        )
        sd = getattr(sim, "state_dim", None)
        self.ensure(
            sd is None or (isinstance(sd, int) and sd > 0), f"state_dim must be None or a positive int, got {sd!r}"
        )
        try:
            torch.device(sim.device)
        except (TypeError, RuntimeError) as exc:
            self.fail(f"device {sim.device!r} is not a torch device ({exc})")
        for name in ("reset", "step", "step_chunk"):
            self.ensure(callable(getattr(sim, name, None)), f"missing method {name}()")
        self.passed()

    def resets(self) -> None:
        sim, n, s = self.sim, self.sim.num_envs, self.seed
        self.check = "reset"
        o1 = sim.reset(s)
        self.obs(o1, "reset(seed)")
        self.passed()

        self.check = "reset_deterministic"
        o2 = sim.reset(s)
        self.obs(o2, "reset(seed)")
        diff = _obs_diff(o1, o2)
        self.ensure(diff is None, f"reset({s}) twice gave different observations: {diff}")
        o3 = sim.reset(s + 7919)
        if _obs_diff(o1, o3) is None:
            self.note("a different seed gave identical observations (is the seed used?)")
        self.passed()

        self.check = "reset_seed_list"
        ol = sim.reset([s + i for i in range(n)])
        self.obs(ol, "reset(list)")
        diff = _obs_diff(o1, ol)
        self.ensure(diff is None, f"reset({s}) != reset([{s}, {s}+1, ...]) (env i gets seed+i): {diff}")
        seeds = [s + 100 + i // 2 for i in range(n)]  # pairs share a seed
        op = sim.reset(seeds)
        self.obs(op, "reset(list)")
        for i in range(0, n - 1, 2):
            other = op.index(torch.tensor([i + 1]))
            diff = _obs_diff(op.index(torch.tensor([i])), other)
            self.ensure(diff is None, f"envs {i} and {i + 1} got the same seed {seeds[i]} but differ: {diff}")
        if n == 1:
            self.note("num_envs=1: repeated seeds cannot be compared across rows")
        self.passed()

    def steps(self) -> None:
        sim, n = self.sim, self.sim.num_envs
        self.check = "step"
        sim.reset(self.seed)
        for _ in range(2):
            self.step_result(sim.step(self.actions(n)), "step([N, A])")
        self.passed()

        self.check = "step_chunk"
        for _ in range(2):
            self.step_result(sim.step_chunk(self.actions(n, self.chunk_size)), "step_chunk([N, C, A])")
        self.passed()
        if self.single_turn:
            return
        self.check = "step_trace"
        if not self.traces:
            self.note(
                "step_chunk takes no trace=: an image reward on this simulator's frames (the reward "
                "stage's frame kind) cannot score it (mmrl.simulator.TRACE_KEYS)"
            )
            return
        for _ in range(2):
            x = self.actions(n, max(self.chunk_size, 3))
            res = sim.step_chunk(x, trace=True)
            self.step_result(res, "step_chunk(trace=True)")
            self.trace(res, x.shape[1])
        self.passed()

    def episode(self, num_steps: int | None) -> None:
        sim, n, t_max = self.sim, self.sim.num_envs, self.sim.max_episode_steps
        horizon = t_max if num_steps is None else min(num_steps, t_max)
        full = horizon >= t_max
        c = max(self.chunk_size, 3)

        self.check = "episode"
        sim.reset(self.seed)
        elapsed = torch.zeros(n, dtype=torch.long)
        has_snapshot = self.snapshot() is not None
        # with a snapshot the step-by-step replay of the chunk below covers the last two steps
        singles = horizon if not full else (t_max - 2 if has_snapshot else t_max)
        for _ in range(max(singles, 0)):
            res = sim.step(self.actions(n))
            self.step_result(res, "step")
            self.track(res, elapsed)
        self.passed()

        # a chunk that crosses the time limit of the envs still in their first episode
        self.check = "truncation"
        snap = self.snapshot()
        x = self.actions(n, c)
        replay = None
        if snap is not None:
            replay, el = [], elapsed.clone()
            for i in range(c):
                replay.append(sim.step(x[:, i]))
                self.step_result(replay[-1], "step (replaying a chunk)")
                self.track(replay[-1], el)
            sim.set_state(snap)
        res = sim.step_chunk(x)
        self.step_result(res, "step_chunk")
        done = (res.terminated | res.truncated).cpu()
        if full:
            must_end = elapsed + c >= t_max
            self.ensure(
                not (must_end & ~done).any(),
                f"envs {_rows(must_end & ~done)} were {elapsed[must_end & ~done].tolist()} steps into their episode "
                f"and ran a {c}-step chunk without ending (max_episode_steps={t_max})",
            )
            self.passed()
        else:
            self.note(f"skipped: num_steps={num_steps} < max_episode_steps={t_max}")

        self.check = "chunk_mid_episode_end"
        if replay is None:
            self.note("weak check only (no get_state): done rows carry final_obs")
            self.passed()
        else:
            self.chunk_vs_replay(res, replay, c)
        if replay is not None and self.traces:
            self.check = "step_trace"
            after = self.snapshot()
            sim.set_state(snap)
            traced = sim.step_chunk(x, trace=True)
            diff = self.compare(traced, res)
            self.ensure(diff is None, f"step_chunk(trace=True) differs from step_chunk: {diff}")
            frames = traced.info["trace"]["image"]
            for i, r in enumerate(replay[: frames.shape[1]]):
                want = r.obs.image.clone()
                if r.final_obs is not None:
                    ended = r.terminated | r.truncated
                    want[ended] = r.final_obs.image[ended]
                ran = traced.info["trace"]["active"][:, i]
                self.ensure(
                    torch.equal(frames[:, i][ran], want[ran]),
                    f"the trace's frame of step {i} differs from the one-step replay's (envs "
                    f"{_rows(ran & (frames[:, i] != want).flatten(1).any(1))})",
                )
            sim.set_state(after)
            self.passed()

        self.check = "auto_reset"
        ended = done.clone()
        if not ended.any() or t_max <= 2:
            self.note("no episode ended (or max_episode_steps <= 2); auto reset not exercised")
        else:
            for _ in range(2):
                res2 = sim.step(self.actions(n))
                self.step_result(res2, "step after done")
                again = res2.truncated.cpu() & ended
                self.ensure(
                    not again.any(),
                    f"envs {_rows(again)} were truncated right after their episode ended: "
                    "they were not reset (auto reset must start a fresh episode in the same call)",
                )
        self.passed()

    def track(self, res: StepResult, elapsed: torch.Tensor) -> None:
        """Advance per-env episode lengths by one step and check the time limit."""
        t_max = self.sim.max_episode_steps
        elapsed += 1
        done = (res.terminated | res.truncated).cpu()
        trunc = res.truncated.cpu()
        fresh = trunc & (elapsed == 1) & (t_max > 1)
        self.ensure(
            not fresh.any(),
            f"envs {_rows(fresh)} were truncated on the first step after their episode ended: they were "
            "not reset (auto reset must start a fresh episode in the same call)",
        )
        self.ensure(
            not (trunc & (elapsed != t_max)).any(),
            f"truncated envs {_rows(trunc & (elapsed != t_max))} after {elapsed[trunc].tolist()} steps; "
            f"truncation must happen at max_episode_steps={t_max}",
        )
        self.ensure(
            not ((elapsed >= t_max) & ~done).any(),
            f"envs {_rows((elapsed >= t_max) & ~done)} ran {t_max} steps without ending (max_episode_steps={t_max})",
        )
        elapsed[done] = 0

    def trace(self, res: StepResult, c: int) -> None:
        """``res.info["trace"]`` of a traced ``c``-step chunk: keys, shapes, and sums equal to ``res``."""
        from mmrl.simulator import TRACE_KEYS

        n = self.sim.num_envs
        tr = res.info.get("trace")
        if not isinstance(tr, dict):
            self.fail(
                "step_chunk(trace=True) must put a dict in info['trace'] "
                "(mmrl.simulator.TRACE_KEYS); a step_chunk override must take trace="
            )
        missing = [k for k in TRACE_KEYS if k not in tr]
        self.ensure(not missing, f"info['trace'] lacks {missing}")
        k = tr["active"].shape[1] if tr["active"].dim() == 2 else -1
        self.ensure(
            tr["active"].dtype == torch.bool and tuple(tr["active"].shape) == (n, k) and 1 <= k <= c,
            f"trace active must be bool [N, K] with 1 <= K <= {c}, got {tr['active'].dtype} "
            f"{tuple(tr['active'].shape)}",
        )
        self.ensure(
            tuple(tr["image"].shape) == (n, k, *self.sim.image_shape) and tr["image"].dtype == torch.uint8,
            f"trace image must be uint8 [N, K, *image_shape], got {tr['image'].dtype} {tuple(tr['image'].shape)}",
        )
        ran = tr["active"]
        self.ensure(
            torch.equal(ran.sum(1).to(res.info["num_steps"]), res.info["num_steps"]),
            f"trace active steps {ran.sum(1).tolist()} != info['num_steps'] {res.info['num_steps'].tolist()}",
        )
        reward = torch.zeros_like(res.reward)
        for i in range(k):
            reward += torch.where(ran[:, i], tr["reward"][:, i], torch.zeros_like(reward))
        self.ensure(
            torch.allclose(reward, res.reward, atol=1e-5, rtol=1e-5),
            f"trace rewards sum to {reward.tolist()}, the result's reward is {res.reward.tolist()}",
        )
        for name in ("success", "terminated", "truncated"):
            self.ensure(
                torch.equal((tr[name] & ran).any(1), getattr(res, name)),
                f"trace {name} does not add up to the result's {name}",
            )
        ended = ran & (tr["terminated"] | tr["truncated"])
        for row in _rows(ended.any(1)):
            assert res.final_obs is not None, "step_result checked it is there: the trace's flags are the result's"
            step = int(ended[row].nonzero()[0])
            self.ensure(
                torch.equal(tr["image"][row, step], res.final_obs.image[row]),
                f"env {row} ended at step {step} but the trace's frame there is not its final_obs image",
            )

    def chunk_vs_replay(self, res: StepResult, replay: list[StepResult], c: int) -> None:
        n = self.sim.num_envs
        alive = torch.ones(n, dtype=torch.bool, device=res.reward.device)
        reward = torch.zeros_like(res.reward)
        flags = {k: torch.zeros_like(alive) for k in ("terminated", "truncated", "success")}
        end_idx = torch.full((n,), -1, dtype=torch.long)
        final_rows: dict[int, tuple[Observation, int]] = {}
        for i, r in enumerate(replay):
            reward += torch.where(alive, r.reward, torch.zeros_like(r.reward))
            for k in flags:
                flags[k] |= alive & getattr(r, k)
            ended = alive & (r.terminated | r.truncated)
            for row in _rows(ended):
                assert r.final_obs is not None, "step_result checked every replayed step's final_obs"
                end_idx[row] = i
                final_rows[row] = (r.final_obs, row)
            alive &= ~ended
        for k, v in flags.items():
            self.ensure(
                torch.equal(v, getattr(res, k)),
                f"step_chunk {k} {getattr(res, k).tolist()} != one-step-at-a-time replay {v.tolist()} "
                "(envs must stop at the end of their episode and ignore the rest of the chunk)",
            )
        self.ensure(
            torch.allclose(reward, res.reward, atol=1e-5, rtol=1e-5),
            f"step_chunk reward {res.reward.tolist()} != replay reward summed up to each episode end "
            f"{reward.tolist()} (rewards after the end of an episode must not count)",
        )
        for row, (fo, _) in final_rows.items():
            assert res.final_obs is not None, "step_result checked it; these rows are done (the flags matched)"
            idx = torch.tensor([row])
            diff = _obs_diff(fo.index(idx), res.final_obs.index(idx))
            self.ensure(
                diff is None,
                f"env {row} ended at chunk step {int(end_idx[row])} but step_chunk's final_obs differs from "
                f"the replay's: {diff} (the rest of its chunk must be ignored)",
            )
        mid = (end_idx >= 0) & (end_idx < c - 1)
        if not mid.any():
            self.note("no env ended before the last step of the chunk; mid-chunk end not exercised")
        self.passed()

    def action_bounds(self) -> None:
        sim, n = self.sim, self.sim.num_envs
        self.check = "action_bounds"
        sim.reset(self.seed + 1)
        snap = self.snapshot()
        x = self.actions(n, scale=3.0)
        try:
            res = sim.step(x)
        except (ValueError, AssertionError, RuntimeError):
            self.result.action_bounds = "rejected"
            if snap is not None:
                sim.set_state(snap)
            self.passed()
            return
        self.step_result(res, "step(out-of-range actions)")
        if snap is None:
            self.note("out-of-range actions accepted; clipping not verifiable without get_state")
            self.passed()
            return
        sim.set_state(snap)
        ref = sim.step(x.clamp(-1, 1))
        diff = self.compare(res, ref)
        self.ensure(
            diff is None,
            f"actions outside [-1, 1] were neither rejected nor clipped: result differs from the clipped "
            f"actions' ({diff})",
        )
        self.result.action_bounds = "clipped"
        self.passed()

    def state_roundtrip(self) -> None:
        sim, n = self.sim, self.sim.num_envs
        self.check = "state_roundtrip"
        sim.reset(self.seed + 2)
        sim.step(self.actions(n))
        snap = self.snapshot()
        if snap is None:
            self.note("skipped: get_state/set_state not implemented")
            return
        kept = _clone_tree(snap)
        x = self.actions(n, self.chunk_size)
        r1 = sim.step_chunk(x)
        r1b = sim.step(self.first(x))
        self.ensure(_tree_equal(snap, kept), "get_state() returned views that stepping changed; return copies")
        sim.set_state(snap)
        r2 = sim.step_chunk(x)
        r2b = sim.step(self.first(x))
        diff = self.compare(r1, r2) or self.compare(r1b, r2b)
        self.ensure(diff is None, f"set_state(get_state()) did not reproduce the next steps: {diff}")
        self.passed()


def _rows(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


def _obs_diff(a: Observation | None, b: Observation | None, rows: torch.Tensor | None = None) -> str | None:
    if a is None or b is None:
        return None if a is b else "one observation is None"
    if rows is None:
        rows = torch.ones(a.image.shape[0], dtype=torch.bool)
    rows = rows.to(a.image.device)
    if a.image.shape != b.image.shape:
        return f"image shapes differ: {tuple(a.image.shape)} vs {tuple(b.image.shape)}"
    ia, ib = a.image[rows], b.image[rows.to(b.image.device)].to(a.image.device)
    if not torch.equal(ia, ib):
        bad = (a.image != b.image.to(a.image.device)).flatten(1).any(1) & rows
        return f"images differ (rows {_rows(bad)[:8]})"
    ri = _rows(rows)
    if [a.instruction[i] for i in ri] != [b.instruction[i] for i in ri]:
        return "instructions differ"
    if (a.state is None) != (b.state is None):
        return "state present in one observation only"
    if (
        a.state is not None
        and b.state is not None
        and not torch.allclose(a.state[rows], b.state[rows].to(a.state.device), atol=1e-5, rtol=1e-5)
    ):
        return "states differ"
    return None


def _clone_tree(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone_tree(v) for v in x)
    try:
        return copy.deepcopy(x)
    except Exception:  # opaque handles: compared by identity
        return x


def _tree_equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_tree_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_tree_equal(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return True


def check_simulator(
    sim_or_factory: Simulator | Callable[[], Simulator],
    num_steps: int | None = None,
    seed: int = 0,
    chunk_size: int = 3,
    verbose: bool = True,
) -> CheckResult:
    """Run the contract checks; return the passed check names or raise ``AssertionError``.

    ``sim_or_factory``: a simulator, or a zero-argument callable (a class included) that builds one
    (closed afterwards). ``num_steps``: cap on the random steps of the episode check; ``None`` runs to
    ``max_episode_steps`` so truncation is checked (a smaller cap skips that check with a note).
    """
    sim: Any  # a Simulator, or an object with its methods
    if isinstance(sim_or_factory, Simulator) or (
        not isinstance(sim_or_factory, type) and hasattr(sim_or_factory, "step") and hasattr(sim_or_factory, "reset")
    ):
        sim, owned = sim_or_factory, False
    elif callable(sim_or_factory):
        sim, owned = sim_or_factory(), True
    else:
        raise TypeError(f"expected a simulator or a factory, got {type(sim_or_factory).__name__}")
    try:
        return _Checker(sim, seed, chunk_size, verbose).run(num_steps)
    finally:
        if owned:
            sim.close()
