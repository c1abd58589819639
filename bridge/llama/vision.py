"""Images through llama.cpp's multimodal projector (mtmd): the vision tower of Qwen3.5 or Qwen3-Omni, M-RoPE
positions; and Qwen3-Omni's audio rows (from bridge/media/audio_tower.py) placed in the same prompt.

A prompt is a list of pieces: token ids (int32 arrays), images (EncodedImage, from Projector.encode) and
audio clips (EncodedAudio). Every image sits between a piece ending in <|vision_start|> and one starting
with <|vision_end|>, every clip between <|audio_start|> and <|audio_end|>, as the reference's processor
writes them. The pieces are decoded into the backbone chunk after chunk (text, embeddings, text, ...) into
one sequence, and the hidden states of EVERY token, media tokens included, come back in prompt order.

Positions are mtmd's, which are the reference's (transformers' get_rope_index of Qwen3.5 and Qwen3-Omni): text
tokens count up on all three M-RoPE axes; an image of rows x cols tokens starting at p puts token (r, c) at
(t, h, w) = (p, p + r, p + c); the text after it resumes at p + max(rows, cols). An audio clip's tokens count
up like text (Qwen3-Omni's audio branch of get_rope_index).

Qwen3-Omni's image rows are n_embd x (1 + deepstack levels) wide, the backbone's input width n_embd_inp (the
main embedding, then one slice per layer that takes deepstack features); audio rows carry no deepstack slices
and are zero-padded to that width, as llama.cpp pads text tokens' embeddings.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ...head.encoder import AUDIO_END, AUDIO_PAD, AUDIO_START, IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START
from ...head.errors import Problem, RequestInvalid
from ..catalogue.architectures import QWEN35_IMAGE_TOKENS
from ..gguf.projector import ProjectorError, pairing_problems, projector_info
from ..media.images import ImageGeometry
from . import log as llama_log
from .omni_positions import OmniTokens
from .media_batch import MediaChunk
from .native import lc
from .native import mtmd as mt
from .protocol import BackboneProtocol


@dataclass(frozen=True)
class ProjectorOptions:
    min_tokens: int = QWEN35_IMAGE_TOKENS[0]  # Qwen3.5's preprocessor's (the catalogue's)
    max_tokens: int = QWEN35_IMAGE_TOKENS[1]
    n_threads: int = 0  # 0: every core
    verbose: bool = False


@dataclass(frozen=True)
class EncodedImage:
    """One image through the vision tower: its embeddings in llama.cpp's token order (row-major)."""

    embd: np.ndarray  # float32 [rows * cols, n_embd_inp]
    rows: int
    cols: int

    @property
    def n_tokens(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class EncodedAudio:
    """One audio clip through Qwen3-Omni's audio tower (bridge/media/audio_tower.py): a row per token."""

    embd: np.ndarray  # float32 [n, n_embd]

    @property
    def n_tokens(self) -> int:
        return len(self.embd)


Piece = np.ndarray | EncodedImage | EncodedAudio


class Projector:
    """An mmproj GGUF bound to one backbone (llama.cpp's mtmd context); used by the backbone's worker only."""

    def __init__(self, path: str | Path, backbone: BackboneProtocol, options: ProjectorOptions = ProjectorOptions()):
        """path: a vision projector mtmd loads (for Qwen3-Omni the vision half of its combined projector)."""
        self.path = Path(path)
        self.backbone = backbone
        if not self.path.is_file():
            raise ProjectorError(f"{self.path}: no such projector file; fix mmproj in models.toml")
        info = projector_info(self.path)
        problems = pairing_problems(info, backbone.n_embd, backbone.architecture)
        if info.combined:
            problems.append("it holds an audio encoder too, which mtmd refuses: load the vision half "
                            "(bridge.gguf.projector.ensure_vision_projector)")
        if info.n_embd * (1 + info.deepstack_layers) != backbone.n_embd_inp:
            problems.append(f"its rows are {info.n_embd * (1 + info.deepstack_layers)} wide ({info.deepstack_layers} "
                            f"deepstack levels) but the backbone takes {backbone.n_embd_inp}: load the backbone with "
                            f"the projector's deepstack count")
        if problems:
            raise ProjectorError(f"{self.path} does not fit {backbone.path.name}: " + "; ".join(problems))
        factor = info.patch_size * info.merge
        self.merge = info.merge  # patches per token side: the projector's spatial_merge_size
        self.geometry = ImageGeometry(factor, options.min_tokens * factor**2, options.max_tokens * factor**2)
        self._start, self._end, self.image_pad = (self._single_token(t) for t in (VISION_START, VISION_END, IMAGE_PAD))
        # Qwen3-Omni's audio markup, where the vocabulary has it (the rows come from the numpy audio tower)
        audio = [backbone.tokenize(t, True) for t in (AUDIO_START, AUDIO_END, AUDIO_PAD)]
        self._audio_marks = tuple(ids[0] for ids in audio) if all(len(ids) == 1 for ids in audio) else None
        video = backbone.tokenize(VIDEO_PAD, True)  # Qwen3-Omni's video markup, where the vocabulary has it
        self.video_pad = video[0] if len(video) == 1 else None
        llama_log.install_mtmd(options.verbose)
        params = mt.mtmd_context_params_default()
        params.use_gpu = backbone.on_gpu
        params.n_threads = options.n_threads or os.cpu_count() or 1
        params.print_timings = False
        params.warmup = False
        # Flash attention keeps the vision tower's attention out of an n_patches^2 matrix per head
        # (65,536 patches for a 16-megapixel image); it moves the embeddings by ~1e-5 relative on the CPU.
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.image_min_tokens = options.min_tokens
        params.image_max_tokens = options.max_tokens
        self._ctx = mt.mtmd_init_from_file(str(self.path).encode(), backbone.llama_model, params)
        if not self._ctx:
            raise ProjectorError(f"{self.path}: llama.cpp could not load this projector (see its log above)")
        if not mt.mtmd_decode_use_mrope(self._ctx) or mt.mtmd_decode_use_non_causal(self._ctx, None):
            self.close()
            raise ProjectorError(f"{self.path}: not a Qwen3.5 or Qwen3-Omni projector (no M-RoPE or non-causal image "
                                 "decoding)")

    @property
    def audio_pad(self) -> int | None:
        """<|audio_pad|>'s id where the vocabulary has Qwen3-Omni's audio markup."""
        return self._audio_marks[2] if self._audio_marks else None

    @property
    def omni_tokens(self) -> OmniTokens | None:
        """The markup ids M-RoPE positions depend on, from this model's vocabulary; None without Qwen3-Omni's audio
        and video markup."""
        if self._audio_marks is None or self.video_pad is None:
            return None
        return OmniTokens(vision_start=self._start, image=self.image_pad, video=self.video_pad,
                          audio_start=self._audio_marks[0], audio=self._audio_marks[2])

    def _single_token(self, text: str) -> int:
        ids = self.backbone.tokenize(text, True)
        if len(ids) != 1:
            raise ProjectorError(f"{self.backbone.path.name}: the vocabulary has no {text} token; not a vision "
                                 "model's backbone")
        return ids[0]

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            mt.mtmd_free(self._ctx)
            self._ctx = None

    def __enter__(self) -> "Projector":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def encode(self, pixels: np.ndarray) -> EncodedImage:
        """uint8 [h, w, 3] RGB at the processor's size (bridge.images.decode) -> the image's embeddings."""
        h, w, channels = pixels.shape
        if channels != 3 or h % self.geometry.factor or w % self.geometry.factor:
            raise ValueError(f"pixels of shape {pixels.shape}: need [h, w, 3] in multiples of {self.geometry.factor}")
        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
        bitmap = mt.mtmd_bitmap_init(w, h, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
        chunks = mt.mtmd_input_chunks_init()
        try:
            part = mt.mtmd_input_part(None, bitmap)
            parts = (ctypes.POINTER(mt.mtmd_input_part) * 1)(ctypes.pointer(part))
            if mt.mtmd_tokenize_from_parts(self._ctx, chunks, parts, 1, False) != 0:
                raise ProjectorError(f"mtmd could not preprocess a {w}x{h} image")
            chunk = _image_chunk(chunks)
            rows, cols = h // self.geometry.factor, w // self.geometry.factor
            n = mt.mtmd_input_chunk_get_n_tokens(chunk)
            if n != rows * cols or mt.mtmd_input_chunk_get_n_pos(chunk) != max(rows, cols):
                # llama.cpp resized it again: its sizing rule and ours disagree, so would the reference's
                raise ProjectorError(f"mtmd made {n} tokens of a {w}x{h} image; the processor makes {rows * cols}")
            if mt.mtmd_encode_chunk(self._ctx, chunk) != 0:
                raise ProjectorError(f"the vision tower failed on a {w}x{h} image (out of memory?)")
            embd = np.empty((n, self.backbone.n_embd_inp), dtype=np.float32)
            ctypes.memmove(embd.ctypes.data, mt.mtmd_get_output_embd(self._ctx), embd.nbytes)
            self._check_positions(mt.mtmd_input_chunk_get_tokens_image(chunk), rows, cols)
            return EncodedImage(embd, rows, cols)
        finally:
            mt.mtmd_input_chunks_free(chunks)
            mt.mtmd_bitmap_free(bitmap)

    def encode_frames(self, frames: np.ndarray) -> np.ndarray:
        """uint8 [n, h, w, 3] RGB frames at the processor's size, n even -> float32 [n / 2 * rows * cols, n_embd_inp]:
        each pair of frames is ONE temporal patch (Qwen2-VL's Conv3d over two frames: mtmd's qwen3vl graph puts the
        first through patch_embeddings_0 and the second through patch_embeddings_1 when two mergeable bitmaps of
        one size come together), deepstack slices included."""
        n, h, w, channels = frames.shape
        factor = self.geometry.factor
        if channels != 3 or n % 2 or h % factor or w % factor:
            raise ValueError(f"frames of shape {frames.shape}: need [2k, h, w, 3] in multiples of {factor}")
        rows, cols = h // factor, w // factor
        out = np.empty((n // 2 * rows * cols, self.backbone.n_embd_inp), dtype=np.float32)
        for k in range(n // 2):
            pair = [np.ascontiguousarray(frames[2 * k + i], dtype=np.uint8) for i in range(2)]
            bitmaps = [mt.mtmd_bitmap_init(w, h, f.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))) for f in pair]
            chunks = mt.mtmd_input_chunks_init()
            try:
                for bitmap in bitmaps:
                    mt.mtmd_bitmap_set_mergeable(bitmap, True)
                held = [mt.mtmd_input_part(None, b) for b in bitmaps]
                parts = (ctypes.POINTER(mt.mtmd_input_part) * 2)(*(ctypes.pointer(p) for p in held))
                if mt.mtmd_tokenize_from_parts(self._ctx, chunks, parts, 2, False) != 0:
                    raise ProjectorError(f"mtmd could not preprocess a pair of {w}x{h} frames")
                chunk = _image_chunk(chunks)  # one chunk: the two frames merged
                if mt.mtmd_input_chunk_get_n_tokens(chunk) != rows * cols:
                    raise ProjectorError(f"mtmd made {mt.mtmd_input_chunk_get_n_tokens(chunk)} tokens of a {w}x{h} "
                                         f"frame pair; the processor makes {rows * cols}")
                if mt.mtmd_encode_chunk(self._ctx, chunk) != 0:
                    raise ProjectorError(f"the vision tower failed on a pair of {w}x{h} frames (out of memory?)")
                dst = out[k * rows * cols:(k + 1) * rows * cols]
                ctypes.memmove(dst.ctypes.data, mt.mtmd_get_output_embd(self._ctx), dst.nbytes)
            finally:
                mt.mtmd_input_chunks_free(chunks)
                for bitmap in bitmaps:
                    mt.mtmd_bitmap_free(bitmap)
        return out

    @staticmethod
    def _check_positions(image_tokens, rows: int, cols: int) -> None:
        """mtmd's decoder positions must be the row-major grid that image_chunk() lays out."""
        got = np.empty((rows * cols, 4), dtype=np.uint32)  # mtmd_decoder_pos: t, x (column), y (row), z
        mt.mtmd_helper_image_get_decoder_pos(image_tokens, 0, got.ctypes.data_as(ctypes.POINTER(mt.mtmd_decoder_pos)))
        want = image_positions(rows, cols, 0)
        if not (np.array_equal(got[:, 0], want[0]) and np.array_equal(got[:, 2], want[1])
                and np.array_equal(got[:, 1], want[2]) and not got[:, 3].any()):
            raise ProjectorError("mtmd's image positions are not Qwen3.5's (t, row, column) grid")

    def chunks(self, pieces: list[Piece]) -> list[MediaChunk]:
        """The backbone chunks of a prompt, each at its M-RoPE positions."""
        out, pos = [], 0
        width = self.backbone.n_embd_inp
        for i, piece in enumerate(pieces):
            if isinstance(piece, (EncodedImage, EncodedAudio)):
                image = isinstance(piece, EncodedImage)
                start, end = (self._start, self._end) if image else (self._audio_marks or (None, None))[:2]
                names = (VISION_START, VISION_END) if image else (AUDIO_START, AUDIO_END)
                before = pieces[i - 1] if i else None
                after = pieces[i + 1] if i + 1 < len(pieces) else None
                if not (isinstance(before, np.ndarray) and len(before) and before[-1] == start
                        and isinstance(after, np.ndarray) and len(after) and after[0] == end):
                    raise ValueError(f"{'image' if image else 'audio'} piece {i} must follow {names[0]} and precede "
                                     f"{names[1]}")
                if image:
                    out.append(MediaChunk(pos=image_positions(piece.rows, piece.cols, pos), embd=piece.embd))
                    pos += max(piece.rows, piece.cols)
                else:
                    n, rows = piece.n_tokens, piece.embd
                    if rows.shape[1] < width:  # no deepstack slices: zeros, as llama.cpp pads text embeddings
                        rows = np.concatenate([rows, np.zeros((n, width - rows.shape[1]), np.float32)], axis=1)
                    out.append(MediaChunk(pos=sequential_positions(n, pos), embd=rows))
                    pos += n
            elif len(piece):
                ids = np.asarray(piece, dtype=np.int32)
                out.append(MediaChunk(pos=np.arange(pos, pos + len(ids), dtype=np.int32), tokens=ids))
                pos += len(ids)
        return out

    def pieces(self, input_ids: np.ndarray, images: list[EncodedImage],
               audio: Sequence[EncodedAudio] = ()) -> list[Piece]:
        """A prompt's pieces from its token ids, where each image stands as a run of <|image_pad|> ids and each
        audio clip as a run of <|audio_pad|> ids (as in the reference's input_ids), each kind's runs in the order
        of `images` and `audio`."""
        ids = np.asarray(input_ids, dtype=np.int32)
        placed = self._runs(ids, self.image_pad, images, IMAGE_PAD, "image")
        if audio or self._audio_marks is not None:
            if self._audio_marks is None:
                raise ProjectorError(f"{self.backbone.path.name}: the vocabulary has no {AUDIO_PAD} token; not "
                                     "Qwen3-Omni's backbone")
            placed += self._runs(ids, self._audio_marks[2], audio, AUDIO_PAD, "audio clip")
        out, at = [], 0
        for run, item in sorted(placed, key=lambda p: p[0][0]):
            out += [ids[at:run[0]], item]
            at = run[-1] + 1
        return out + [ids[at:]]

    @staticmethod
    def _runs(ids: np.ndarray, pad: int, items: Sequence, pad_text: str, what: str) -> list[tuple[np.ndarray, Any]]:
        found = np.flatnonzero(ids == pad)
        runs = np.split(found, np.flatnonzero(np.diff(found) != 1) + 1) if len(found) else []
        if [len(r) for r in runs] != [item.n_tokens for item in items]:
            # only user text tokenized with special tokens parsed can hold a stray pad token
            raise RequestInvalid([Problem(("body",), f"the prompt holds {pad_text} tokens that are no {what}'s "
                                          f"(runs of {[len(r) for r in runs]}, {what}s of "
                                          f"{[item.n_tokens for item in items]} tokens): remove {pad_text} from the "
                                          f"text", "value_error.media_token")])
        return list(zip(runs, items))

    def prefill(self, input_ids: np.ndarray, images: list[EncodedImage], audio: Sequence[EncodedAudio] = ()
                ) -> np.ndarray:
        """float32 [t, n_embd] hidden states of every token (text and media) of a prompt whose media stand as
        runs of pad ids (see pieces)."""
        return self.backbone.decode_media(self.chunks(self.pieces(input_ids, images, audio)))


def _image_chunk(chunks):
    """The one image chunk of a tokenized bitmap (mtmd wraps it in <|vision_start|> and <|vision_end|> text)."""
    found = [c for c in (mt.mtmd_input_chunks_get(chunks, i) for i in range(mt.mtmd_input_chunks_size(chunks)))
             if mt.mtmd_input_chunk_get_type(c) == mt.MTMD_INPUT_CHUNK_TYPE_IMAGE]
    if len(found) != 1:
        raise ProjectorError(f"mtmd made {len(found)} image chunks of one image (sliced?); Qwen3.5 makes one")
    return found[0]


def sequential_positions(n: int, start: int) -> np.ndarray:
    """int32 [4, n]: positions counting up on the three M-RoPE axes alike (audio tokens), plus the unused 4th."""
    p = np.arange(start, start + n, dtype=np.int32)
    return np.stack([p, p, p, np.zeros_like(p)])


def image_positions(rows: int, cols: int, start: int) -> np.ndarray:
    """int32 [4, rows * cols]: Qwen3.5's (t, h, w) positions of an image's tokens, plus llama.cpp's unused 4th."""
    r, c = np.divmod(np.arange(rows * cols, dtype=np.int32), cols)
    return np.stack([np.full_like(r, start), start + r, start + c, np.zeros_like(r)])
