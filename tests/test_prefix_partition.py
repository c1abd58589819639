"""PrefillRequest.partition: paths of different partitions never meet in the checkpoint tree (a LoRA adapter's
KV cells and states are not the base's), and a partition's root goes when its last path does."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.llama.prefix_cache import PrefillRequest
from clef_bridge.bridge.llama.prefix_tree import CheckpointTree

from .test_prefix_tree import Memory, state

pytestmark = pytest.mark.unit

TOKENS = np.arange(1, 21, dtype=np.int32)


def test_the_default_partition_is_empty():
    assert PrefillRequest(TOKENS).partition == ()


def test_a_partition_never_matches_another_partitions_checkpoints():
    t = CheckpointTree(Memory(), [8, 9], 100, 10_000)
    a = t.add(t.root_for(("lora:claims",)), 10, TOKENS, state(), ready=True, used=1)
    assert t.matching(TOKENS, True, ("lora:claims",)) == [a]
    assert t.matching(TOKENS, True) == [] and t.matching(TOKENS, True, ("lora:routing",)) == []
    assert t.common_prefix(TOKENS) == 0 and t.common_prefix(TOKENS, ("lora:claims",)) == 10
    assert ("lora:routing",) not in t.roots  # a lookup makes no root
    assert a in t.all_nodes()


def test_a_partitions_root_goes_with_its_last_checkpoint():
    t = CheckpointTree(Memory(), [8, 9], 100, 10_000)
    a = t.add(t.root_for(("x",)), 10, TOKENS, state(), ready=True, used=1)
    t.remove_subtree(a)
    assert ("x",) not in t.roots and () in t.roots
    t.add(t.root_for(("y",)), 5, TOKENS, state(), ready=True, used=1)
    t.forget()
    assert list(t.roots) == [()] and t.all_nodes() == []
