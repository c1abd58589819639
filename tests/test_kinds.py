"""bridge/media/kinds.py: the one table of media kinds, which every stage reads (finding, checking, decoding, the
decoder pool, x_timings, refusals, /openapi.json): each supported kind has exactly one row, consistent with the
vocabulary (head/media.py) and with what the stages expect of it."""

from __future__ import annotations

from dataclasses import fields

import pytest
from clef_bridge.bridge.config.registry import ServerSpec
from clef_bridge.bridge.media.decoders import ISOLATED
from clef_bridge.bridge.media.kinds import TABLE, combined
from clef_bridge.bridge.media.request import KINDS, References, refuse_unsupported
from clef_bridge.bridge.model.clef_model import Timings
from clef_bridge.head.errors import RequestInvalid
from clef_bridge.head.media import MEDIA_KINDS

pytestmark = pytest.mark.unit


def test_one_row_per_supported_kind_in_the_prompts_order():
    assert KINDS == tuple(TABLE) == ("image", "audio", "video")
    assert {k.name for k in MEDIA_KINDS.values() if k.supported} == set(TABLE)
    for name, row in TABLE.items():
        assert row.name == name and row.field == MEDIA_KINDS[name].field


def test_each_row_names_its_server_keys_and_limits():
    limits = ServerSpec().media_limits
    for name, row in TABLE.items():
        assert row.count_key.startswith("max_") and row.bytes_key.startswith("max_")
        assert limits[name].max_count > 0 and limits[name].max_bytes > 0  # what its checks read


def test_the_decoder_pool_isolates_the_rows_that_say_so():
    assert ISOLATED == {name for name, row in TABLE.items() if row.isolated} == {"audio", "video"}


def test_each_tower_stage_reads_a_timing_the_model_reports():
    timings = {f.name for f in fields(Timings)}
    for row in TABLE.values():
        assert set(row.towers.values()) <= timings, row.name


@pytest.mark.parametrize("name", list(TABLE))
def test_a_refusal_names_the_model_at_the_kinds_field_or_where_a_door_found_the_medium(name):
    with pytest.raises(RequestInvalid) as info:
        refuse_unsupported((name,), (), "clef-flash")
    [problem] = info.value.problems
    assert problem.loc == ("body", TABLE[name].field) and problem.type == MEDIA_KINDS[name].error_type
    assert "'clef-flash'" in problem.msg
    located = References({name: ((("body", "input", 3, "content", 1), "AAAA"),)})
    with pytest.raises(RequestInvalid) as info:
        refuse_unsupported((name,), (), "clef-flash", located)
    assert [p.loc for p in info.value.problems] == [("body", "input", 3, "content", 1)]


def test_problems_of_one_kind_combine_into_that_kinds_error_413_only_when_all_are_sizes():
    image = TABLE["image"]
    small, big = image.rejected(("body", "images", 0), "bad"), image.too_large(("body", "images", 1), "big")
    assert type(combined([small, big])) is image.rejected and len(combined([small, big]).problems) == 2
    assert type(combined([big, big])) is image.too_large
    mixed = combined([big, TABLE["audio"].too_large(("body", "audio", 0), "long")])
    assert not isinstance(mixed, (image.too_large, TABLE["audio"].too_large)) and mixed.problems[1].msg == "long"
