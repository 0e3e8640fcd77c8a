"""CI runs what the README tells a fresh machine to run: `.ci/run`'s steps, in order, are the parts
of the README's test command (the ``&&``-joined command in the block after "Set up and run the
tests"), each on its own timed line; CI may add steps after them (the wheel check)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_test_command() -> list[str]:
    text = (ROOT / "README.md").read_text()
    after = text[text.index("Set up and run the tests") :]
    block = re.search(r"```bash\n(.*?)\n```", after, re.S)
    assert block, "no ```bash block after 'Set up and run the tests' in README.md"
    return [" ".join(shlex.split(part)) for part in block.group(1).strip().split(" && ")]


def ci_steps() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [" ".join(shlex.split(ln[len("step ") :])) for ln in lines if ln.startswith("step ")]


def test_ci_steps_are_the_readme_test_command():
    readme, ci = readme_test_command(), ci_steps()
    assert len(readme) >= 5 and any("pytest" in p for p in readme)
    assert ci[: len(readme)] == readme, (readme, ci)


def test_the_check_compares_what_it_claims():
    """The parser sees every part: a README command that differs in one argument is told apart."""
    readme = readme_test_command()
    changed = [p.replace("pytest -q", "pytest -q -x") for p in readme]
    assert changed != readme and ci_steps()[: len(readme)] != changed


def test_xdist_groups_keep_files_whole_and_the_multi_rank_tests_together():
    """The README's `-n 2 --dist loadgroup`: a test file is one group (its module fixtures built once),
    tests/distributed (the session fixture `runs`) and the Ray backend's tests one group between
    them, and the benchmark smokes no group (shared out one by one)."""
    from tests.conftest import SPLIT_ACROSS_WORKERS, worker_group

    assert worker_group("tests/policies/test_vlm.py") == "tests/policies/test_vlm.py"
    assert worker_group("tests/distributed/test_ddp.py") == worker_group("tests/distributed/test_fsdp.py")
    assert worker_group("tests/distributed/test_ddp.py") == worker_group("tests/placement/test_ray_backend.py")
    assert worker_group("tests/placement/test_pipeline.py") != worker_group("tests/placement/test_ray_backend.py")
    assert worker_group("tests/distributedx/test_a.py") == "tests/distributedx/test_a.py"  # a prefix, not a folder
    assert "test_benchmarks_smoke.py" in SPLIT_ACROSS_WORKERS
