"""Issue 68, settings and off-policy data: every case of cases_settings.py is one `error:` line (exit
2) naming the problem and the fix, before any work; the mapping form of TRL's weights trains; a
resume of a run that has already trained as long as asked says so."""

from __future__ import annotations

import pytest

from mmrl.cli import main
from mmrl.config import ConfigError
from mmrl.experiment import load_experiment
from tests.reliability import cases_settings
from tests.reliability.test_bad_inputs import (
    QUICK,
    assert_one_clear_line,
    trained,  # noqa: F401  (the shared trained-run fixture)
)

pytest.importorskip("gymnasium")

TABLE_TITLE = "Issue 68: settings and off-policy data"
CLI_CASES = cases_settings.CASES
prepare = cases_settings.prepare


@pytest.mark.parametrize("case,argv,words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_setting_is_one_clear_line(case, argv, words, trained, tmp_path, capsys):  # noqa: F811
    prepare(tmp_path, trained)
    assert_one_clear_line(argv, words, trained, tmp_path, capsys)


def test_the_mapping_form_of_trl_weights_is_taken_in_the_order_of_type():
    cfg = load_experiment(cases_settings.VLM, [cases_settings.TWO, "reward.weights={short_answer: 2, format: 1}"])
    assert cfg.reward.weights == {"format": 1.0, "short_answer": 2.0} and cfg.reward.type is None
    with pytest.raises(ConfigError, match="no weight for"):
        load_experiment(cases_settings.VLM, [cases_settings.TWO, "reward.weights={format: 1}"])


def test_resuming_a_finished_run_with_fewer_iterations_says_so(tmp_path, capsys):
    args = ["train", *QUICK, f"run.output_dir={tmp_path}", "run.name=t", "trainer.eval_every=0"]
    assert main([*args, "trainer.iterations=2"]) == 0
    capsys.readouterr()
    rc = main([*args, "trainer.iterations=1"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    said = out.out + out.err
    assert "notice: the checkpoint resumed is at iteration 2, past trainer.iterations=1" in said, said
    assert "nothing is trained" in said
