"""mkdocs hook (mkdocs.yml ``hooks:``): draw the plots before the pages are collected, so the site
always shows what ``benchmarks/results/`` holds now."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_BUILD = Path(__file__).resolve().parent / "build.py"


def on_pre_build(config, **kwargs) -> None:
    spec = importlib.util.spec_from_file_location("mmrl_docs_plots_build", _BUILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(Path(config["docs_dir"]) / "assets" / "plots")
