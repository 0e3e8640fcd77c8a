"""The package version (pyproject.toml's; `mmrl --version`)."""

__version__ = "0.1.0"
