"""Registry: lazy imports, missing-dependency hints, unknown names, clashes, entry points."""

import pytest

from mmrl.registry import MissingDependencyError, Registry, UnknownComponentError


def test_lazy_target_is_imported_on_first_use():
    reg = Registry("thing", "mmrl.test_things")
    reg.register("dumps", "json:dumps", description="json encoder")
    assert reg.describe() == [("dumps", "json encoder")]
    import json

    assert reg.get("dumps") is json.dumps
    reg.register("dumps", "json:dumps")  # re-registering the same spec (a module reload) is fine


def test_missing_dependency_names_the_extra():
    reg = Registry("simulator", "mmrl.test_things")
    reg.register("maniskill", "not_a_real_module_xyz:Env", extra="sim")
    with pytest.raises(MissingDependencyError, match=r"pip install 'mmrl\[sim\]'"):
        reg.get("maniskill")


def test_unknown_name_lists_registered_ones():
    reg = Registry("reward", "mmrl.test_things")
    reg.register("a", object())
    reg.register("b", object())
    with pytest.raises(UnknownComponentError, match="unknown reward 'c'. Registered: a, b"):
        reg.get("c")


def test_clash_is_an_error_and_decorator_form_works():
    reg = Registry("policy", "mmrl.test_things")

    @reg.register("p")
    class P:
        """A policy."""

    assert reg.get("p") is P and reg.describe() == [("p", "A policy.")]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("p", object())


def test_entry_points_are_discovered(monkeypatch):
    from importlib import metadata

    class EP:
        name, value = "plugin_sim", "json:loads"

    monkeypatch.setattr(metadata, "entry_points", lambda group: [EP()] if group == "mmrl.test_eps" else [])
    reg = Registry("simulator", "mmrl.test_eps")
    import json

    assert "plugin_sim" in reg.names() and reg.get("plugin_sim") is json.loads
