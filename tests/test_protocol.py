"""bridge/llama/protocol.py: what a model needs of its backbone, which a Backbone and a BackboneView (a backbone
shared by several models) both give, each member by name, none by forwarding."""

from __future__ import annotations

import inspect

import pytest
from clef_bridge.bridge.llama.adapters import BackboneView
from clef_bridge.bridge.llama.backbone import Backbone
from clef_bridge.bridge.llama.protocol import BackboneProtocol

pytestmark = pytest.mark.unit

MEMBERS = sorted(set(BackboneProtocol.__annotations__) | {
    name for name, value in vars(BackboneProtocol).items()
    if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))})
# set in Backbone.__init__ (instance values, not the class's)
INSTANCE_VALUES = {"path", "options", "architecture", "n_embd", "n_embd_inp", "decode_budget", "prefix_cache"}


def test_the_protocol_lists_what_the_model_reads():
    assert {"tokenize", "prefill_cached", "decode_media", "on_gpu", "prefix_cache", "close"} <= set(MEMBERS)


def test_a_view_defines_every_member_and_forwards_nothing_else():
    assert "__getattr__" not in vars(BackboneView)
    missing = [name for name in MEMBERS if not hasattr(BackboneView, name)]
    assert not missing, f"BackboneView lacks {missing}"


def test_a_backbone_defines_every_member():
    source = inspect.getsource(Backbone.__init__)
    missing = [name for name in MEMBERS if not hasattr(Backbone, name)
               and not (name in INSTANCE_VALUES and f"self.{name} =" in source)]
    assert not missing, f"Backbone lacks {missing}"
