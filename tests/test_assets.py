"""Finding a request's images (bridge/media/request.py, bridge/server/multipart.py) without a model: placement in order
of first reference, the markers that replace placeholders, every refusal with its location, and the
SDK's own multipart bodies parsed back."""

from __future__ import annotations

import base64
import tomllib

import pytest
from clef_bridge.bridge.config.registry import RegistryError, parse_registry
from clef_bridge.bridge.media.images import ImageLimits, ImageRejected, ImageTooLarge
from clef_bridge.bridge.media.request import IMAGE, MARKER, FormPart, UnsupportedMediaType, extract
from clef_bridge.bridge.server.assets import body_limit
from clef_bridge.bridge.server.multipart import is_form, parse_body, parse_form
from clef_bridge.head.errors import RequestInvalid

from .fixturegen_vision import data_url, encoded, picture

pytestmark = pytest.mark.unit

PNG = {name: encoded(picture(40 + 8 * i, 32, seed=i), "PNG") for i, name in enumerate("ABCD")}
LIMITS = ImageLimits()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def asset(name: str) -> dict:
    return {"type": "image", "format": "png", "data_base64": b64(PNG[name])}


def body(state, questions=None, **extra) -> dict:
    return {"model": "m", "state": state, "questions": questions or {"q": {"type": "noul"}}, **extra}


def images_of(media) -> list[bytes]:
    return [image.data for image in media.images]


def test_images_follow_the_prompt_order_and_placeholders_become_markers():
    questions = {
        "z": {"type": "choice", "instructions": "Compare {b} with {a}",
              "criteria": {"same": "{b} equals {c}", "differ": "{d} differs"}},
        "n": {"type": "noul", "criteria": {"false": "not {a}", "true": "{d}!"}},
    }
    raw = body({"later": "{c}", "first": ["{b}", 3, None]}, questions,
               assets={"{a}": asset("A"), "{b}": asset("B"), "{c}": asset("C"), "{d}": asset("D")})
    found = extract(raw, None, {IMAGE: LIMITS})
    # the state renders with sorted keys: "first" ({b}) before "later" ({c}); then question z's instructions
    # ({a}); its options sorted by code point: "differ" ({d}) before "same"
    assert images_of(found.media) == [PNG["B"], PNG["C"], PNG["A"], PNG["D"]]
    assert [image.loc for image in found.media.images] == [("body", "assets", n) for n in ("{b}", "{c}", "{a}", "{d}")]
    assert found.body["state"] == {"later": "[image 2]", "first": ["[image 1]", 3, None]}
    assert found.body["questions"]["z"] == {"type": "choice", "instructions": "Compare [image 1] with [image 3]",
                                            "criteria": {"same": "[image 1] equals [image 2]",
                                                         "differ": "[image 4] differs"}}
    assert found.body["questions"]["n"]["criteria"] == {"false": "not [image 3]", "true": "[image 4]!"}
    assert "assets" not in found.body and raw["state"]["later"] == "{c}"  # the caller's body is left alone
    assert MARKER.format(1) == "[image 1]"


def test_noul_options_are_read_true_first():
    raw = body("s", {"n": {"type": "noul", "criteria": {"false": "{x}", "true": "{y}"}}},
               assets={"{x}": asset("A"), "{y}": asset("B")})
    assert images_of(extract(raw, None, {IMAGE: LIMITS}).media) == [PNG["B"], PNG["A"]]


def test_longest_placeholder_wins_and_unreferenced_assets_come_last():
    raw = body("img12 then img1", assets={"img1": asset("A"), "unused": asset("C"), "img12": asset("B")})
    found = extract(raw, None, {IMAGE: LIMITS})
    assert found.body["state"] == "[image 1] then [image 2]"
    assert images_of(found.media) == [PNG["B"], PNG["A"], PNG["C"]]


def test_markers_do_not_depend_on_the_placeholder():
    one = extract(body("see <image:1f>", assets={"<image:1f>": asset("A")}), None, {IMAGE: LIMITS})
    two = extract(body("see <image:9e>", assets={"<image:9e>": asset("A")}), None, {IMAGE: LIMITS})
    assert one.body == two.body and one.media.digests == two.media.digests


def test_ids_and_option_names_are_not_rewritten():
    raw = body("s", {"{a}": {"type": "choice", "criteria": {"{a}": "x", "b": "y"}}}, assets={"{a}": asset("A")})
    found = extract(raw, None, {IMAGE: LIMITS})
    assert found.body["questions"] == raw["questions"] and len(found.media.images) == 1


def test_images_list_takes_data_urls_and_base64_in_order():
    raw = body("s", images=[data_url(PNG["C"]), b64(PNG["A"]), "\n".join([b64(PNG["B"])[:40], b64(PNG["B"])[40:]])])
    found = extract(raw, None, {IMAGE: LIMITS})
    assert images_of(found.media) == [PNG["C"], PNG["A"], PNG["B"]]
    assert "images" not in found.body and found.body["state"] == "s"
    assert found.inline_chars == sum(len(s) for s in raw["images"])


def problems(raw, parts=None, limits=LIMITS) -> list[tuple[str, str, str]]:
    with pytest.raises(RequestInvalid) as info:
        extract(raw, parts, {IMAGE: limits})
    return [(".".join(map(str, p.loc)), p.type, p.msg) for p in info.value.problems]


BAD = [  # (name, body, expected (loc, type) pairs)
    ("video list", body("s", videos=["x"]), [("body.videos.0", "value_error.video.base64")]),
    ("video asset", body("s", assets={"v": {"type": "video", "data_base64": "AAAA"}}),
     [("body.assets.v.format", "value_error")]),
    ("both fields", body("s", images=[b64(PNG["A"])], assets={"a": asset("A")}), [("body", "value_error")]),
    ("images not a list", body("s", images=b64(PNG["A"])), [("body.images", "type_error")]),
    ("assets not an object", body("s", assets=[asset("A")]), [("body.assets", "type_error")]),
    ("five images", body("s", images=[b64(PNG["A"])] * 5), [("body.images", "too_many_images")]),
    ("asset not an object", body("s", assets={"a": "data"}), [("body.assets.a", "type_error")]),
    ("asset without data", body("s", assets={"a": {"type": "image", "format": "png"}}),
     [("body.assets.a.data_base64", "missing")]),
    ("asset without format", body("s", assets={"a": {"data_base64": b64(PNG["A"])}}),
     [("body.assets.a.format", "value_error")]),
    ("asset of type text", body("s", assets={"a": {**asset("A"), "type": "text"}}),
     [("body.assets.a.type", "value_error")]),
    ("part in a JSON body", body("s", assets={"a": {"type": "image", "part": "asset-0"}}),
     [("body.assets.a.part", "value_error")]),
    ("empty placeholder", body("s", assets={"": asset("A")}), [("body.assets.", "value_error")]),
    ("bad base64", body("s", images=["not base64!"]), [("body.images.0", "value_error.image.base64")]),
    ("URL", body("s", images=["https://example.com/a.png"]), [("body.images.0", "value_error.image.url")]),
    ("data URL, not base64", body("s", images=["data:image/png,abc"]),
     [("body.images.0", "value_error.image.data_url")]),
    ("number", body("s", images=[3]), [("body.images.0", "type_error")]),
    ("not an image", body("s", images=[b64(b"GIF89a" + bytes(40))]), [("body.images.0", "value_error.image.format")]),
    ("truncated PNG header", body("s", assets={"r": {**asset("A"), "data_base64": b64(PNG["A"][:20])}}),
     [("body.assets.r", "value_error.image.corrupt")]),
    ("two bad, all named", body("s", images=[b64(b"nope"), b64(PNG["A"]), "%%%"]),
     [("body.images.0", "value_error.image.format"), ("body.images.2", "value_error.image.base64")]),
]


@pytest.mark.parametrize("name, raw, expected", BAD, ids=[b[0] for b in BAD])
def test_bad_media_names_its_location(name, raw, expected):
    found = problems(raw)
    assert sorted((loc, kind) for loc, kind, _ in found) == sorted(expected), found
    assert all(msg for _, _, msg in found)


def test_sizes_are_refused_before_decoding_as_too_large():
    small = ImageLimits(max_bytes=len(PNG["A"]) - 1)
    with pytest.raises(ImageTooLarge) as info:
        extract(body("s", images=[b64(PNG["A"])]), None, {IMAGE: small})
    assert info.value.problems[0].loc == ("body", "images", 0) and "bytes per image" in str(info.value)
    huge = "A" * (4 * LIMITS.max_bytes)  # judged from its length: never decoded
    with pytest.raises(ImageTooLarge, match="max_image_bytes"):
        extract(body("s", images=[huge]), None, {IMAGE: LIMITS})
    total = ImageLimits(max_total_bytes=len(PNG["A"]) + len(PNG["B"]) - 1)
    with pytest.raises(ImageTooLarge, match="max_image_total_bytes") as info:
        extract(body("s", images=[b64(PNG["A"]), b64(PNG["B"])]), None, {IMAGE: total})
    assert info.value.problems[0].loc == ("body", "images")
    few_pixels = ImageLimits(max_pixels=40 * 32 - 1)
    with pytest.raises(ImageTooLarge, match="pixels"):
        extract(body("s", images=[b64(PNG["A"])]), None, {IMAGE: few_pixels})


def test_a_size_problem_with_a_format_problem_is_a_422():
    with pytest.raises(ImageRejected) as info:
        extract(body("s", images=[b64(PNG["A"]), b64(b"nope")]), None, {IMAGE: ImageLimits(max_bytes=100)})
    assert not isinstance(info.value, ImageTooLarge) and len(info.value.problems) == 2


def form(*parts: tuple[str, str, bytes], boundary: str = "XyZ") -> tuple[str, bytes]:
    chunks = [f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\nContent-Type: {ctype}\r\n\r\n"
              .encode() + data + b"\r\n" for name, ctype, data in parts]
    return f"multipart/form-data; boundary={boundary}", b"".join(chunks) + f"--{boundary}--\r\n".encode()


def request_part(raw: dict) -> tuple[str, str, bytes]:
    import json

    return "request", "application/json", json.dumps(raw).encode()


def test_the_sdks_multipart_body_round_trips():
    from typesafe_sdk._core.multipart import Part, encode_multipart

    raw = body("look: <ref>", assets={"<ref>": {"type": "image", "part": "asset-0"}})
    ctype, data = encode_multipart([Part("request", "application/json", request_part(raw)[2]),
                                    Part("asset-0", "image/png", PNG["A"], "asset-0")])
    parsed = parse_body(data, ctype)
    assert parsed.data == raw and list(parsed.parts) == ["asset-0"] and parsed.json_bytes == len(request_part(raw)[2])
    found = extract(parsed.data, parsed.parts, {IMAGE: LIMITS})
    assert images_of(found.media) == [PNG["A"]] and found.body["state"] == "look: [image 1]"


MULTIPART_BAD = [
    ("no request part", form(("asset-0", "image/png", PNG["A"])), ("body.request", "missing")),
    ("request part not JSON", form(("request", "image/png", b"{}")), ("body.request", "type_error")),
    ("request part not valid JSON", form(("request", "application/json", b"{nope")), ("body", "json_invalid")),
    ("duplicate part", form(request_part(body("s")), ("a", "image/png", PNG["A"]), ("a", "image/png", PNG["B"])),
     ("body.a", "multipart_invalid")),
    ("truncated", (form(request_part(body("s")))[0], form(request_part(body("s")))[1][:-12]),
     ("body", "multipart_invalid")),
    ("no boundary", ("multipart/form-data", form(request_part(body("s")))[1]), ("body", "multipart_invalid")),
    ("wrong boundary", ("multipart/form-data; boundary=other", form(request_part(body("s")))[1]),
     ("body", "multipart_invalid")),
    ("no name", ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--"),
     ("body", "multipart_invalid")),
    ("base64 transfer encoding", ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; "
                                  b"name=\"a\"\r\nContent-Transfer-Encoding: base64\r\n\r\nx\r\n--b--"),
     ("body.a", "multipart_invalid")),
]


@pytest.mark.parametrize("name, content, expected", MULTIPART_BAD, ids=[m[0] for m in MULTIPART_BAD])
def test_malformed_multipart_is_a_422(name, content, expected):
    ctype, data = content
    with pytest.raises(RequestInvalid) as info:
        parse_body(data, ctype)
    [problem] = info.value.problems
    assert (".".join(map(str, problem.loc)), problem.type) == expected and problem.msg


def parts_of(*parts: tuple[str, str, bytes]) -> dict[str, FormPart]:
    return parse_form(*reversed(form(*parts)))


def test_every_part_is_claimed_exactly_once():
    two = {"a": {"type": "image", "part": "p"}, "b": {"type": "image", "part": "p"}}
    found = problems(body("a b", assets=two), parts_of(("p", "image/png", PNG["A"])))
    assert ("body.assets.b.part", "value_error") in [(loc, kind) for loc, kind, _ in found]
    found = problems(body("a", assets={"a": {"type": "image", "part": "p"}}),
                     parts_of(("p", "image/png", PNG["A"]), ("extra", "image/png", PNG["B"])))
    assert [(loc, kind) for loc, kind, _ in found] == [("body.extra", "value_error")]
    found = problems(body("a", assets={"a": {"type": "image", "part": "gone"}}), parts_of(("p", "image/png", PNG["A"])))
    assert ("body.assets.a.part", "missing") in [(loc, kind) for loc, kind, _ in found]


def test_multipart_without_images_and_other_multipart_types_are_415():
    with pytest.raises(UnsupportedMediaType):
        extract(body("s"), {}, {IMAGE: LIMITS})
    with pytest.raises(UnsupportedMediaType, match="multipart/mixed"):
        is_form("multipart/mixed")
    assert is_form("multipart/form-data") and not is_form("application/json")


def test_limits_are_configurable_in_server(tmp_path):
    raw = tomllib.loads('[models.m]\ngguf = "m.gguf"\n[server]\nmax_images = 2\nmax_image_bytes = 1000\n'
                        'max_image_pixels = 4096\nmax_image_total_bytes = 1500\nmax_body_bytes = 100\n')
    registry = parse_registry(raw, tmp_path / "models.toml")
    assert registry.server.images == ImageLimits(max_images=2, max_bytes=1000, max_total_bytes=1500, max_pixels=4096)
    # the body may hold the text's max_body_bytes plus the images, base64-inflated
    assert body_limit(registry.server, ["image"]) == 100 + 2000 + 2 * 4096
    assert body_limit(registry.server, []) == 100  # no model with a projector
    with pytest.raises(RegistryError, match="max_images: must be positive"):
        parse_registry({**raw, "server": {"max_images": 0}}, tmp_path / "models.toml")
    spec = parse_registry({"models": {"m": {"gguf": "m.gguf", "mmproj": "v/mmproj.gguf"}}}, tmp_path / "models.toml")
    assert spec.models["m"].mmproj == tmp_path / "v" / "mmproj.gguf"  # relative to models.toml
