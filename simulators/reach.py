"""ReachSim: an embedded, pure-torch, batched "reach the named target" task.

A 2-D arena ``[-1, 1]^2`` holds an end effector (the gripper, drawn as a white cross) and
``num_objects`` coloured discs with distinct colours. Each environment gets an instruction such as
"reach the red target"; the colour word names the goal disc. The action ``[N, 2]`` in ``[-1, 1]``
is the desired gripper displacement in units of ``max_speed`` (out-of-range actions are clipped,
non-finite ones raise ``ValueError``); the gripper is clipped to the arena.

Reward: 1 on the step the gripper comes within ``success_radius`` of the named disc, which ends the
episode (terminated, success). Being within ``success_radius`` of another disc costs
``wrong_penalty`` per step (default 0) and ends the episode as a failure if ``wrong_terminates``.
Episodes are truncated after ``max_episode_steps`` steps. ``dense_reward=True`` adds the decrease
of the distance to the goal at every step.

Observations: ``image`` uint8 ``[N, H, W, 3]`` rendered in torch (row 0 is the top, ``y = +1``;
the point ``(x, y)`` falls in pixel ``row = (1 - y) / 2 * H``, ``col = (x + 1) / 2 * W``),
``state`` float ``[N, 2]`` gripper xy (``state_mode="full"`` appends the disc positions and a
one-hot of the goal: ``[N, 2 + 3K]``) and ``instruction`` list of N strings.

Initial states come from a counter-based hash of the per-environment seed, so generation is
batched, runs on any device, and equal seeds give bit-identical initial states regardless of the
batch they are drawn in. The scripted expert (`expert_action`, `expert_chunk`) is privileged: it
moves straight to the named disc and succeeds from every initial state within ~8 steps on average.
"""

from __future__ import annotations

import math

import torch

from mmrl.simulator import Observation, Simulator, StepResult

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (240, 220, 40),
    "purple": (160, 60, 210),
    "cyan": (40, 210, 220),
    "orange": (250, 140, 20),
    "pink": (250, 130, 190),
}
TEMPLATES = (
    "reach the {} target",
    "move to the {} object",
    "go to the {} disc",
    "touch the {} target",
)
BACKGROUND = (40, 40, 40)
GRIPPER = (255, 255, 255)

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)`` without int64 overflow."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash (C. Wellons) on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_uniform(seeds: torch.Tensor, count: int) -> torch.Tensor:
    """Deterministic uniforms ``[n, count]`` in ``[0, 1)`` from int64 seeds ``[n]`` (any device)."""
    lo = seeds & _M32
    hi = (seeds >> 32) & _M32
    key = _hash32(lo ^ _hash32(hi ^ 0x5BD1E995))
    j = torch.arange(count, device=seeds.device, dtype=torch.int64)
    x = _hash32((key[:, None] + _mul32(j, 0x9E3779B9)[None]) & _M32)
    x = _hash32(x ^ key[:, None])
    return (x >> 8).to(torch.float32) * (1.0 / (1 << 24))


#: the start-distance bands of the evaluation report (world units; the arena is [-1, 1]^2 and discs
#: spawn at least ``min_separation`` 0.4 from the gripper): upper edges of all but the last band
DISTANCE_BANDS = (0.8, 1.2, 1.6)


def goal_cell(x: float, y: float, extent: float) -> str:
    """The goal's cell of a 3 x 3 grid over the spawn area ``[-extent, extent]^2``, e.g. ``top-left``
    (``y`` up, as rendered)."""
    third = extent / 3
    row = "top" if y > third else "bottom" if y < -third else "middle"
    col = "left" if x < -third else "right" if x > third else "centre"
    return f"{row}-{col}"


def distance_band(d: float) -> str:
    """The band of `DISTANCE_BANDS` the gripper's start distance to the goal falls in, e.g. ``0.8-1.2``."""
    low = 0.0
    for high in DISTANCE_BANDS:
        if d < high:
            return f"{low:.1f}-{high:.1f}"
        low = high
    return f">={low:.1f}"


class ReachSim(Simulator):
    """Embedded pure-torch batched reach-the-named-target task (RGB + instruction)."""

    action_dim = 2

    def __init__(
        self,
        num_envs: int = 64,
        image_size: int = 32,
        num_objects: int = 3,
        max_episode_steps: int = 40,
        success_radius: float = 0.1,
        max_speed: float = 0.1,
        device: str | torch.device = "cpu",
        seed: int = 0,
        num_colors: int = 6,
        instruction_templates: int = 1,
        object_radius: float = 0.15,
        min_separation: float = 0.4,
        spawn_extent: float = 0.8,
        dense_reward: bool = False,
        wrong_penalty: float = 0.0,
        wrong_terminates: bool = False,
        state_mode: str = "proprio",
        init_candidates: int = 16,
    ):
        if not 1 <= num_objects <= num_colors <= len(PALETTE):
            raise ValueError(f"need 1 <= num_objects ({num_objects}) <= num_colors ({num_colors}) <= {len(PALETTE)}")
        if not 1 <= instruction_templates <= len(TEMPLATES):
            raise ValueError(f"instruction_templates must be in [1, {len(TEMPLATES)}]")
        if state_mode not in ("proprio", "full"):
            raise ValueError(f"state_mode must be 'proprio' or 'full', got {state_mode!r}")
        if num_envs < 1 or image_size < 4 or max_episode_steps < 1:
            raise ValueError("num_envs >= 1, image_size >= 4 and max_episode_steps >= 1 required")
        self.num_envs = int(num_envs)
        self.image_size = int(image_size)
        self.image_shape = (self.image_size, self.image_size, 3)
        self.num_objects = int(num_objects)
        self.num_colors = int(num_colors)
        self.max_episode_steps = int(max_episode_steps)
        self.success_radius = float(success_radius)
        self.max_speed = float(max_speed)
        self.device = torch.device(device)
        self.instruction_templates = int(instruction_templates)
        self.object_radius = float(object_radius)
        self.min_separation = float(min_separation)
        self.spawn_extent = float(spawn_extent)
        self.dense_reward = bool(dense_reward)
        self.wrong_penalty = float(wrong_penalty)
        self.wrong_terminates = bool(wrong_terminates)
        self.state_mode = state_mode
        self.init_candidates = int(init_candidates)
        k = self.num_objects
        self.state_dim = 2 if state_mode == "proprio" else 2 + 3 * k

        self.color_names = list(PALETTE)[: self.num_colors]
        self._palette = torch.tensor([PALETTE[c] for c in self.color_names], dtype=torch.uint8, device=self.device)
        self._bg = torch.tensor(BACKGROUND, dtype=torch.uint8, device=self.device)
        self._grip_rgb = torch.tensor(GRIPPER, dtype=torch.uint8, device=self.device)
        self._instr_table = [
            [TEMPLATES[t].format(c) for c in self.color_names] for t in range(self.instruction_templates)
        ]
        self._disc_stamp = self._stamp(self.object_radius, "disc")
        self._cross_stamp = self._stamp(self._arm, "cross")

        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(int(seed))
        self._expert_gen = torch.Generator(device=self.device)
        self._expert_gen.manual_seed(int(seed) + 1)
        n = self.num_envs
        self.gripper = torch.zeros(n, 2, device=self.device)
        self.objects = torch.zeros(n, k, 2, device=self.device)
        self.colors = torch.zeros(n, k, dtype=torch.long, device=self.device)
        self.target = torch.zeros(n, dtype=torch.long, device=self.device)
        self.template = torch.zeros(n, dtype=torch.long, device=self.device)
        self.elapsed = torch.zeros(n, dtype=torch.long, device=self.device)
        self._instructions = [""] * n
        self._breakdown: list[dict[str, str]] = [{} for _ in range(n)]  # per env: its episode's labels
        self._reset_rows(torch.arange(n, device=self.device), self._draw_seeds(n))
        self._arange = torch.arange(n, device=self.device)

    # ------------------------------------------------------------------ initial states
    def _draw_seeds(self, n: int) -> torch.Tensor:
        return torch.randint(0, 2**62, (n,), generator=self._gen, device=self.device)

    def _sample_init(self, seeds: torch.Tensor) -> dict[str, torch.Tensor]:
        n, k, p, c = seeds.shape[0], self.num_objects, self.num_colors, self.init_candidates
        u = hash_uniform(seeds, p + 2 + (k + 1) * c * 2)
        colors = u[:, :p].argsort(dim=1)[:, :k]
        target = (u[:, p] * k).long().clamp(max=k - 1)
        template = (u[:, p + 1] * self.instruction_templates).long().clamp(max=self.instruction_templates - 1)
        ext = self.spawn_extent
        cand = (u[:, p + 2 :].view(n, k + 1, c, 2) * 2.0 - 1.0) * ext
        rows = torch.arange(n, device=seeds.device)
        placed: list[torch.Tensor] = []
        for i in range(k + 1):  # discs first, the gripper last (away from every disc)
            ci = cand[:, i]  # [n, C, 2]
            if placed:
                prev = torch.stack(placed, 1)  # [n, P, 2]
                dmin = torch.cdist(ci, prev).amin(-1)  # [n, C]
                valid = dmin >= self.min_separation
                first = valid.to(torch.int8).argmax(1)
                best = dmin.argmax(1)
                choice = torch.where(valid.any(1), first, best)
            else:
                choice = torch.zeros(n, dtype=torch.long, device=seeds.device)
            placed.append(ci[rows, choice])
        return {
            "objects": torch.stack(placed[:k], 1),
            "gripper": placed[k],
            "colors": colors,
            "target": target,
            "template": template,
        }

    def _reset_rows(self, rows: torch.Tensor, seeds: torch.Tensor) -> None:
        init = self._sample_init(seeds)
        self.gripper[rows] = init["gripper"]
        self.objects[rows] = init["objects"]
        self.colors[rows] = init["colors"]
        self.target[rows] = init["target"]
        self.template[rows] = init["template"]
        self.elapsed[rows] = 0
        goal_color = init["colors"].gather(1, init["target"][:, None])[:, 0]
        for r, t, g in zip(rows.tolist(), init["template"].tolist(), goal_color.tolist()):
            self._instructions[r] = self._instr_table[t][g]
        goal = init["objects"][torch.arange(len(rows), device=self.device), init["target"]]
        distance = (goal - init["gripper"]).norm(dim=1)
        for r, g, xy, d in zip(rows.tolist(), goal_color.tolist(), goal.tolist(), distance.tolist()):
            self._breakdown[r] = {
                "goal": self.color_names[g],
                "goal_cell": goal_cell(xy[0], xy[1], self.spawn_extent),
                "start_distance": distance_band(d),
            }

    def reset(self, seed: int | list[int] | None = None) -> Observation:
        n = self.num_envs
        if seed is None:
            seeds = self._draw_seeds(n)
        else:
            if isinstance(seed, int):
                seed_list = [seed + i for i in range(n)]
            else:
                seed_list = [int(s) for s in seed]
                if len(seed_list) != n:
                    raise ValueError(f"reset got {len(seed_list)} seeds for {n} envs")
            seeds = torch.tensor(seed_list, dtype=torch.int64, device=self.device)
            h = 0xCBF29CE484222325  # FNV-1a over the seeds: later auto resets are reproducible too
            for s in seed_list:
                h = ((h ^ (s & _M64)) * 0x100000001B3) & _M64
            self._gen.manual_seed(h & (2**63 - 1))
        self._reset_rows(self._arange, seeds)
        return self._observe()

    # ------------------------------------------------------------------ rendering
    def _stamp(self, half: float, shape: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixel offsets (rows, cols) of a shape of world half-size ``half`` around its pixel."""
        h = self.image_size
        w = int(math.ceil(half * h / 2)) + 1
        o = torch.arange(-w, w + 1, device=self.device)
        dr, dc = torch.meshgrid(o, o, indexing="ij")
        x, y = dc * (2.0 / h), dr * (2.0 / h)
        if shape == "disc":
            inside = x * x + y * y <= half * half
        else:  # cross
            thick = max(self._thick, 1e-6)
            inside = ((x.abs() <= half) & (y.abs() <= thick)) | ((x.abs() <= thick) & (y.abs() <= half))
        return dr[inside], dc[inside]

    _arm, _thick = 0.13, 0.0  # gripper cross: half arm length, half thickness (0: one pixel)

    def render(self, gripper: torch.Tensor, objects: torch.Tensor, colors: torch.Tensor) -> torch.Tensor:
        """uint8 ``[n, H, W, 3]`` images of ``n`` scenes (gripper ``[n,2]``, discs ``[n,K,2]``,
        colour ids ``[n,K]``). Shapes are pixel stamps centred on the pixel holding their
        position (see `pixel_of`), painted disc by disc, then the gripper on top."""
        n, k = objects.shape[:2]
        h = self.image_size
        flat = self._bg.expand(n * h * h + 1, 3).clone()  # last row: sink for off-image pixels
        base = torch.arange(n, device=self.device)[:, None] * (h * h)
        rgb = self._palette[colors]  # [n, K, 3]
        for i in range(k):
            self._paint(flat, base, objects[:, i], rgb[:, i], self._disc_stamp)
        self._paint(flat, base, gripper, self._grip_rgb.expand(n, 3), self._cross_stamp)
        return flat[:-1].view(n, h, h, 3)

    def _paint(self, flat, base, center, rgb, stamp) -> None:
        h = self.image_size
        row, col = self.pixel_of(center)
        rr = row[:, None] + stamp[0]
        cc = col[:, None] + stamp[1]
        ok = (rr >= 0) & (rr < h) & (cc >= 0) & (cc < h)
        idx = torch.where(ok, base + rr * h + cc, flat.shape[0] - 1)
        flat.index_put_((idx.view(-1),), rgb[:, None, :].expand(-1, stamp[0].numel(), 3).reshape(-1, 3))

    def pixel_of(self, xy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, col) long indices of the pixel holding world point(s) ``xy [..., 2]``."""
        h = self.image_size
        col = ((xy[..., 0] + 1) * (h / 2)).floor().long().clamp(0, h - 1)
        row = ((1 - xy[..., 1]) * (h / 2)).floor().long().clamp(0, h - 1)
        return row, col

    def _state(self) -> torch.Tensor:
        if self.state_mode == "proprio":
            return self.gripper.clone()
        onehot = torch.nn.functional.one_hot(self.target, self.num_objects).float()
        return torch.cat([self.gripper, self.objects.flatten(1), onehot], 1)

    def _observe(self) -> Observation:
        image = self.render(self.gripper, self.objects, self.colors)
        return Observation(image, list(self._instructions), self._state(), meta=self._meta())

    def _meta(self) -> list[dict]:
        """Per env, the labels the evaluation report breaks success down by (``breakdown``)."""
        return [{"breakdown": b} for b in self._breakdown]

    # ------------------------------------------------------------------ stepping
    def goal_position(self) -> torch.Tensor:
        """``[N, 2]`` position of each env's named disc."""
        return self.objects[self._arange, self.target]

    def _run(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        """Execute ``[N, C, 2]`` for the ``active`` envs; envs finishing mid-chunk skip the rest."""
        if actions.dim() != 3 or actions.shape[0] != self.num_envs or actions.shape[2] != 2:
            raise ValueError(f"actions must be [{self.num_envs}, C, 2], got {tuple(actions.shape)}")
        a = actions.to(self.device, torch.float32)
        if not torch.isfinite(a).all():
            raise ValueError("actions contain NaN or inf")
        a = a.clamp(-1.0, 1.0) * self.max_speed
        n, c = a.shape[:2]
        dev = self.device
        reward = torch.zeros(n, device=dev)
        terminated = torch.zeros(n, dtype=torch.bool, device=dev)
        truncated = torch.zeros_like(terminated)
        success = torch.zeros_like(terminated)
        executed = torch.zeros(n, dtype=torch.long, device=dev)
        alive = active.to(dev, torch.bool).clone()
        goal = self.goal_position()
        g = self.gripper
        d = (g - goal).norm(dim=-1)
        check_wrong = self.wrong_penalty != 0.0 or self.wrong_terminates
        if check_wrong:
            not_goal = torch.ones(n, self.num_objects, dtype=torch.bool, device=dev)
            not_goal[self._arange, self.target] = False
        for i in range(c):
            if i > 0 and not bool(alive.any()):
                break
            g = torch.where(alive[:, None], (g + a[:, i]).clamp(-1.0, 1.0), g)
            d_new = (g - goal).norm(dim=-1)
            hit = alive & (d_new <= self.success_radius)
            r = hit.float()
            if self.dense_reward:
                r = r + (d - d_new)
            fail = torch.zeros_like(hit)
            if check_wrong:
                near = (g[:, None] - self.objects).norm(dim=-1) <= self.success_radius
                wrong = alive & ~hit & (near & not_goal).any(1)
                r = r - self.wrong_penalty * wrong.float()
                if self.wrong_terminates:
                    fail = wrong
            d = d_new
            reward += torch.where(alive, r, torch.zeros_like(r))
            self.elapsed += alive.long()
            executed += alive.long()
            term = hit | fail
            trunc = alive & ~term & (self.elapsed >= self.max_episode_steps)
            terminated |= term
            truncated |= trunc
            success |= hit
            alive = alive & ~term & ~trunc
        self.gripper = g
        done = terminated | truncated
        image = self.render(self.gripper, self.objects, self.colors)
        state = self._state()
        final_obs = None
        if bool(done.any()):
            # rows of envs that did not finish hold their current observation
            final_obs = Observation(image, list(self._instructions), state, meta=self._meta())
            rows = done.nonzero().flatten()
            self._reset_rows(rows, self._draw_seeds(rows.numel()))
            image = image.clone()
            image[rows] = self.render(self.gripper[rows], self.objects[rows], self.colors[rows])
            state = self._state()
        obs = Observation(image, list(self._instructions), state, meta=self._meta())
        return StepResult(obs, reward, terminated, truncated, success, final_obs, {"num_steps": executed})

    # ------------------------------------------------------------------ snapshot / restore
    def get_state(self) -> dict:
        return {
            "gripper": self.gripper.clone(),
            "objects": self.objects.clone(),
            "colors": self.colors.clone(),
            "target": self.target.clone(),
            "template": self.template.clone(),
            "elapsed": self.elapsed.clone(),
            "instructions": list(self._instructions),
            "breakdown": [dict(b) for b in self._breakdown],
            "rng": self._gen.get_state().clone(),
            "expert_rng": self._expert_gen.get_state().clone(),
        }

    def set_state(self, state: dict) -> None:
        for key in ("gripper", "objects", "colors", "target", "template", "elapsed"):
            setattr(self, key, state[key].to(self.device).clone())
        self._instructions = list(state["instructions"])
        # a snapshot from before the labels existed: no breakdown until the next resets
        self._breakdown = [dict(b) for b in state.get("breakdown", [{} for _ in range(self.num_envs)])]
        self._gen.set_state(state["rng"].clone())
        self._expert_gen.set_state(state["expert_rng"].clone())

    # ------------------------------------------------------------------ helpers
    def instruction_vocab(self) -> list[str]:
        """Every word that can appear in an instruction (for tiny word-level tokenizers)."""
        words = {w for t in TEMPLATES[: self.instruction_templates] for w in t.split() if w != "{}"}
        return sorted(words | set(self.color_names))

    # ------------------------------------------------------------------ scripted expert
    def _expert_from(
        self,
        g: torch.Tensor,
        goal: torch.Tensor,
        noise: float,
        generator: torch.Generator | None,
        speed: float = 1.0,
    ) -> torch.Tensor:
        a = (goal - g) / (self.max_speed * speed)
        a = a / a.abs().amax(-1, keepdim=True).clamp(min=1.0) * speed  # keep the direction when clipping
        if noise > 0:
            eps = torch.randn(a.shape, generator=generator or self._expert_gen, device=self.device)
            a = (a + noise * eps).clamp(-1.0, 1.0)
        return a

    def expert_action(
        self, noise: float = 0.0, generator: torch.Generator | None = None, speed: float = 1.0
    ) -> torch.Tensor:
        """Privileged straight-line controller: ``[N, 2]`` actions towards the named disc, at
        ``speed`` times the top speed (a slower, more cautious demonstrator for ``speed < 1``)."""
        return self._expert_from(self.gripper, self.goal_position(), noise, generator, speed)

    def expert_chunk(
        self,
        chunk_size: int,
        noise: float = 0.0,
        generator: torch.Generator | None = None,
        speed: float = 1.0,
    ) -> torch.Tensor:
        """``[N, C, 2]`` expert chunk planned by rolling the controller forward; zeros after the
        planned gripper reaches the goal (the env ends there and ignores the rest anyway)."""
        goal = self.goal_position()
        g = self.gripper.clone()
        reached = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        out = []
        for _ in range(chunk_size):
            a = self._expert_from(g, goal, noise, generator, speed)
            a = torch.where(reached[:, None], torch.zeros_like(a), a)
            out.append(a)
            g = (g + a * self.max_speed).clamp(-1.0, 1.0)
            reached |= (g - goal).norm(dim=-1) <= self.success_radius
        return torch.stack(out, 1)
