"""The registry builds an engine by the loaded model's type, never its class name."""

from __future__ import annotations

import dataclasses

import pytest

from unsee.impl.engines.hf.engine import KVEngine
from unsee.impl.engines.hf.models import LoadedModel
from unsee.impl.engines.registry import get_engine_class, make_engine


def test_a_subclass_of_a_model_type_gets_its_engine(lm):
    class MyModel(LoadedModel):  # a name the registry never heard of
        pass

    mine = MyModel(**{f.name: getattr(lm, f.name) for f in dataclasses.fields(lm) if f.init})
    assert isinstance(make_engine(mine), KVEngine)


def test_a_look_alike_name_is_refused():
    VllmModel = type("VllmModel", (), {})
    with pytest.raises(TypeError, match="no engine for a model of type"):
        get_engine_class(VllmModel())
