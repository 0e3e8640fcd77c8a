"""Issue 31: a pip user has the example configs: ``mmrl init NAME`` writes one (scripts/check_wheel.sh
runs it from the installed wheel, outside any checkout, and trains what it wrote)."""

from __future__ import annotations

from mmrl.cli import main
from mmrl.examples import configs_dir, example_names


def test_init_writes_an_example_and_keeps_an_existing_file(tmp_path, capsys):
    assert {"quickstart", "vlm_quickstart"} <= set(example_names())
    assert main(["init", "quickstart", "--to", str(tmp_path)]) == 0
    written = tmp_path / "quickstart.yaml"
    assert written.read_text() == (configs_dir() / "quickstart.yaml").read_text()
    assert f"mmrl train {written}" in capsys.readouterr().out
    written.write_text("mine")
    assert main(["init", "quickstart", "--to", str(tmp_path)]) == 2
    assert "exists" in capsys.readouterr().err and written.read_text() == "mine"
    assert main(["init", "quickstart", "--to", str(tmp_path), "--force"]) == 0
    assert main(["init", "quikstart"]) == 2
    assert "did you mean 'quickstart'" in capsys.readouterr().err
    assert main(["init"]) == 0 and "vlm_quickstart" in capsys.readouterr().out
