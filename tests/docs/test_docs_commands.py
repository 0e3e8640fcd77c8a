"""What the documentation tells users to type still works: every ``mmrl`` command in a bash block
parses and its config loads with its overrides (a renamed key fails here), every component it names
is registered, every ``python benchmarks/X.py --flag`` names a script and a flag it defines, every
config key quoted in prose exists, and every YAML fragment's keys exist. Covers docs/ and README.md.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.docs.pages import ROOT, Page, all_pages, inline_code

PAGES = all_pages()
SECTIONS = ("run", "sim", "reward", "policy", "warm_start", "algorithm", "trainer", "placement")
KEY_TOKEN = re.compile(rf"^(?:{'|'.join(SECTIONS)})\.[A-Za-z_][\w.]*(?:=.*)?$")
PLACEHOLDER = re.compile(r"\$|<[^>]*>|(?<![A-Za-z])[A-Z][A-Z0-9_]{2,}(?![a-z])")
SHELL_BLOCKS = ("bash", "sh", "shell", "console")


# ---- reading commands out of shell blocks -----------------------------------------------------------
def shell_commands(text: str) -> list[tuple[str, list[str]]]:
    """(source line, tokens) of every simple command of a shell block: continuation lines joined,
    comments dropped, split at ``&&``, ``||``, ``;`` and ``|``; lines ending in ``# docs-test: skip`` left out."""
    joined, out = text.replace("\\\n", " "), []
    for line in joined.splitlines():
        if line.rstrip().endswith("# docs-test: skip") or not line.strip() or line.lstrip().startswith("#"):
            continue
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lex.whitespace_split, lex.commenters = True, "#"
        tokens, current = list(lex), []
        for tok in [*tokens, ";"]:
            if tok and set(tok) <= set(";&|"):
                if current:
                    out.append((line.strip(), current))
                current = []
            else:
                current.append(tok)
    return out


def mmrl_args(tokens: list[str]) -> list[str] | None:
    """The arguments of an ``mmrl`` invocation in ``tokens`` (``mmrl``, ``.venv/bin/mmrl``, ``-m mmrl``), else None."""
    if any(t == "pip" or t.endswith("/pip") or t == "install" for t in tokens):
        return None
    for i, tok in enumerate(tokens):
        as_module = tok == "mmrl" and i > 0 and tokens[i - 1] == "-m"
        as_program = (tok == "mmrl" or tok.endswith("/bin/mmrl")) and all("=" in t for t in tokens[:i])
        if as_module or as_program:
            return tokens[i + 1 :]
    return None


def page_files(page: Page) -> dict[str, str]:
    return {b.marker[1]: b.text for b in page.blocks if b.marker and b.marker[0] == "file"}


# ---- checking one mmrl command ----------------------------------------------------------------------
def check_mmrl(args: list[str], page: Page, tmp: Path) -> None:
    from mmrl.cli import build_parser, dotted_overrides
    from mmrl.experiment import load_experiment
    from mmrl.registry import POLICIES, REWARDS, SIMULATORS

    args = dotted_overrides(args)
    try:
        ns = build_parser(args).parse_args(args)
    except SystemExit as exc:  # --help / --version exit 0 after printing
        if exc.code == 0:
            return
        raise AssertionError(f"does not parse (argparse exit {exc.code})") from None
    extending = "/extending/" in f"/{page.name}"  # those pages register their own components (test_extending.py)

    def config_path(path: str) -> Path:
        files = page_files(page)
        if path in files:
            target = tmp / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(files[path])
            for name, text in files.items():  # what the config may reference (a reward function file)
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_text(text)
            return target
        found = ROOT / path
        initialised = ROOT / "configs" / Path(path).name  # `mmrl init NAME` earlier on the page wrote it
        if not found.is_file() and initialised.is_file() and f"init {Path(path).stem}" in page.text:
            return initialised
        assert found.is_file(), f"config {path} does not exist (nor does the page write it)"
        return found

    if ns.command == "train" or (ns.command == "config" and ns.action == "show"):
        config = ns.config if ns.command == "train" else ns.rest[0]
        overrides = ns.overrides if ns.command == "train" else ns.rest[1:]
        if extending:
            return
        load_experiment(config_path(config), list(overrides))
    elif ns.command == "eval" and ns.config.endswith((".yaml", ".yml")):
        load_experiment(config_path(ns.config), [o for o in ns.overrides if not o.startswith("checkpoint=")])
    elif ns.command == "check" and not extending:
        assert ns.kind in ("simulator", "reward", "policy"), f"unknown check kind {ns.kind}"
        if ns.kind == "simulator":
            assert ns.name.partition(":")[0] in SIMULATORS, f"simulator '{ns.name}' is not registered"
        elif ns.kind == "reward" and ":" not in ns.name:
            assert ns.name in REWARDS, f"reward '{ns.name}' is not registered"
        elif ns.kind == "policy":
            assert ns.name in POLICIES, f"policy '{ns.name}' is not registered"
    elif ns.command == "init" and ns.name:
        assert (ROOT / "configs" / f"{ns.name}.yaml").is_file(), f"mmrl init {ns.name}: no configs/{ns.name}.yaml"
    elif ns.command == "config" and ns.action == "keys" and ns.rest:
        assert any(k.startswith(ns.rest[0]) for k in known_keys()[0]), f"no config key starts with {ns.rest[0]}"


def check_script(tokens: list[str]) -> None:
    """``python benchmarks/X.py --flag ...`` / ``scripts/X.py``: the script exists, defines each flag."""
    for i, tok in enumerate(tokens):
        if tok.endswith(".py") and tok.startswith(("benchmarks/", "scripts/")):
            path = ROOT / tok
            assert path.is_file(), f"{tok} does not exist"
            source = path.read_text()
            for sibling in path.parent.glob("*.py"):  # flags a benchmark takes from the module it builds on
                if re.search(rf"^\s*(from|import) {sibling.stem}\b", source, re.M):
                    source += sibling.read_text()
            for arg in tokens[i + 1 :]:
                flag = arg.split("=", 1)[0]
                if flag.startswith("--") and len(flag) > 2:
                    assert f'"{flag}"' in source or f"'{flag}'" in source, f"{tok} defines no flag {flag}"


def page_commands(page: Page) -> list[tuple[int, str, list[str]]]:
    return [
        (b.line, src, toks)
        for b in page.blocks
        if b.lang in SHELL_BLOCKS and not (b.marker and b.marker[0] == "skip")
        for src, toks in shell_commands(b.text)
    ]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_commands_parse_and_their_configs_load(page: Page, tmp_path):
    from mmrl.registry import MissingDependencyError

    problems: list[str] = []
    unchecked: list[str] = []
    for line, src, tokens in page_commands(page):
        if PLACEHOLDER.search(" ".join(tokens)):
            continue
        try:
            args = mmrl_args(tokens)
            if args is not None:
                check_mmrl(args, page, tmp_path)
            check_script(tokens)
        except MissingDependencyError as exc:  # a LeRobot config outside .venv-lerobot: CI checks it there
            unchecked.append(f"{page.name}:{line}: {exc}")
        except Exception as exc:
            problems.append(f"{page.name}:{line}: `{src}`: {type(exc).__name__}: {exc}")
    assert not problems, "commands in the docs that no longer work:\n" + "\n".join(problems)
    # a LeRobot config's commands need .venv-lerobot: test_lerobot_commands_load checks them there


def lerobot_commands() -> list[tuple[Page, int, str, list[str]]]:
    """Every documented mmrl command whose config is a LeRobot policy's (`policy.type: lerobot`)."""
    out = []
    for page in PAGES:
        for line, src, tokens in page_commands(page):
            args = mmrl_args(tokens)
            config = next((a for a in (args or []) if a.endswith((".yaml", ".yml"))), None)
            path = ROOT / config if config else None
            if path is not None and path.is_file() and "type: lerobot" in path.read_text():
                out.append((page, line, src, tokens))
    return out


def test_lerobot_commands_load(tmp_path):
    """The LeRobot commands (skipped by the test above outside .venv-lerobot) parse and load there."""
    found = lerobot_commands()
    assert found, "no documented LeRobot command found (the guide lost them?)"
    pytest.importorskip("lerobot", reason="LeRobot's configs load in .venv-lerobot (CI checks them there)")
    problems = []
    for page, line, src, tokens in found:
        if PLACEHOLDER.search(" ".join(tokens)):
            continue
        try:
            check_mmrl(mmrl_args(tokens) or [], page, tmp_path)
        except Exception as exc:
            problems.append(f"{page.name}:{line}: `{src}`: {type(exc).__name__}: {exc}")
    assert not problems, "LeRobot commands in the docs that no longer work:\n" + "\n".join(problems)


def test_the_command_reader_sees_what_users_type():
    """The reader finds the mmrl commands of a typical block (chains, continuations, env vars, -m)
    and leaves out pip and skipped lines, so a check over it cannot pass by seeing nothing."""
    block = (
        "bash scripts/setup.sh && .venv/bin/mmrl train configs/quickstart.yaml \\\n  trainer.lr=1e-4\n"
        "RAY_ADDRESS=x python -m mmrl eval runs/quickstart  # a comment\n"
        "pip install mmrl\nmmrl list  # docs-test: skip\ntorchrun --nproc-per-node 2 -m mmrl train c.yaml\n"
    )
    found = [mmrl_args(t) for _, t in shell_commands(block)]
    assert [a for a in found if a is not None] == [
        ["train", "configs/quickstart.yaml", "trainer.lr=1e-4"],
        ["eval", "runs/quickstart"],
        ["train", "c.yaml"],
    ]


def test_a_renamed_key_in_a_command_fails(tmp_path):
    page = Page(ROOT / "docs" / "x.md", "")
    check_mmrl(["train", "configs/quickstart.yaml", "trainer.lr=1e-4"], page, tmp_path)
    with pytest.raises(Exception, match="learning_rate"):
        check_mmrl(["train", "configs/quickstart.yaml", "trainer.learning_rate=1e-4"], page, tmp_path)
    with pytest.raises(AssertionError, match="no flag --no-such-flag"):
        check_script(["python", "benchmarks/quickstart.py", "--no-such-flag"])


# ---- config keys in prose and in YAML fragments -----------------------------------------------------
_KEYS: tuple[set, set, set] | None = None


def known_keys() -> tuple[set[str], set[str], set[str]]:
    """(every key, every section prefix, every free-form mapping key such as ``sim.kwargs``)."""
    global _KEYS
    if _KEYS is None:
        from typing import get_origin

        from mmrl.config import _walk
        from mmrl.experiment import ExperimentConfig

        keys, prefixes, mappings = set(), set(), set()
        for key, hint, _default, _note, _owner in _walk(ExperimentConfig, "", 0, None):
            keys.add(key)
            parts = key.split(".")
            prefixes.update(".".join(parts[:i]) for i in range(1, len(parts)))
            if hint is dict or get_origin(hint) is dict or "dict" in str(hint):
                mappings.add(key)
        _KEYS = (keys, prefixes, mappings)
    return _KEYS


def key_exists(token: str) -> bool:
    keys, prefixes, mappings = known_keys()
    key = token.split("=", 1)[0]
    return key in keys or key in prefixes or any(key.startswith(m + ".") for m in mappings)


def prose_keys(page: Page) -> list[str]:
    return [
        t
        for t in inline_code(page.prose())
        if KEY_TOKEN.match(t) and not t.split("=", 1)[0].endswith((".py", ".yaml", ".md", ".json"))
    ]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_config_keys_named_in_the_docs_exist(page: Page):
    bad = sorted({t for t in prose_keys(page) if not key_exists(t)})
    for block in page.blocks:
        if block.lang not in ("yaml", "yml") or (block.marker and block.marker[0] == "skip"):
            continue
        data = yaml.safe_load(block.text)
        if not isinstance(data, dict) or not set(data) & set(SECTIONS):
            continue
        bad += [f"{k} (yaml block at line {block.line})" for k in flatten(data) if not key_exists(k)]
    assert not bad, (
        f"{page.name} names config keys that do not exist (renamed or misspelled; `mmrl config keys` lists "
        f"them; write a code attribute as `Policy.rollout`, not `policy.rollout`): {bad}"
    )


def flatten(data: dict, prefix: str = "") -> list[str]:
    keys, _, mappings = known_keys()
    out = []
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and key not in keys and key not in mappings:
            out += flatten(v, key)
        else:
            out.append(key)
    return out


def test_a_misspelled_key_in_prose_is_caught():
    page = Page(ROOT / "docs" / "x.md", "", body="Set `trainer.lr=1e-4` and `warm_start.candidate=3`, `sim.kwargs.x`.")
    assert [t for t in prose_keys(page) if not key_exists(t)] == ["warm_start.candidate=3"]
