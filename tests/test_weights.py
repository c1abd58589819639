"""head/weights.py: the joint head's tensors, counted against the sizes Cloudflare publishes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from clef_bridge.head.config import CLEF_FLASH_HEAD
from clef_bridge.head.weights import expected_shapes

pytestmark = pytest.mark.unit


def parameters(cfg) -> int:
    return sum(math.prod(shape) for shape in expected_shapes(cfg).values())


def test_the_expected_tensors_add_up_to_the_published_head_sizes():
    assert parameters(CLEF_FLASH_HEAD) == 121_762_820  # Clef-flash's joint head, 243.5 MB in bf16
    assert round(parameters(replace(CLEF_FLASH_HEAD, hidden_size=5120)) * 2 / 1e6, 1) == 256.1  # Clef's
