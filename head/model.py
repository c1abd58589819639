"""JointSchemaHead's forward pass as pure functions over arrays (numpy, or CuPy on a GPU).

One function per torch module of the reference, named after it; parameters arrive by ``**``
unpacking of the nested state dict (see weights.unflatten), so names are the torch names.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

LOG_100 = math.log(100.0)


def array_module(x: Any) -> Any:
    """The array module x belongs to: numpy, CuPy, or any module whose arrays name it.

    The array API's __array_namespace__ hook names it (numpy >= 2, CuPy >= 14, the tests' stand-in);
    older numpy and CuPy lack the hook, and their arrays' types live in their own package.
    """
    hook = getattr(x, "__array_namespace__", None)
    if hook is not None:
        return hook()
    return sys.modules[type(x).__module__.partition(".")[0]]


@dataclass(frozen=True)
class Layout:
    """Where the questions and options sit in the token sequence (host-side integer arrays)."""

    question_spans: np.ndarray  # [n_q, 2] token [start, end), sorted, disjoint, non-empty
    option_spans: np.ndarray  # [n_o, 2] token [start, end), sorted, disjoint, non-empty
    option_offsets: np.ndarray  # [n_q] index of each question's first option
    types: np.ndarray  # [n_q] 0 noul, 1 choice, 2 score

    @property
    def option_question(self) -> np.ndarray:
        counts = np.diff(np.append(self.option_offsets, len(self.option_spans)))  # [n_q]
        return np.repeat(np.arange(len(counts)), counts)  # [n_o]

    def shifted(self, tokens: int) -> "Layout":
        """The same layout with the first `tokens` tokens of the prompt cut off (they precede every span)."""
        return replace(self, question_spans=self.question_spans - tokens, option_spans=self.option_spans - tokens)


def erf(x):
    # Numerical Recipes' erfc (fractional error < 1.2e-7): numpy has no erf, and GELU is exact in torch.
    xp = array_module(x)
    z = xp.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    erfc = t * xp.exp(poly)
    return xp.where(x >= 0, 1.0 - erfc, erfc - 1.0).astype(x.dtype)


def gelu(x):
    return 0.5 * x * (1.0 + erf(x * np.float32(1 / math.sqrt(2))))


def softmax(x, axis=-1):
    xp = array_module(x)
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, weight, bias, eps=1e-5):
    xc = x - x.mean(axis=-1, keepdims=True)
    xc *= 1.0 / array_module(x).sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xc *= weight  # in place: the hidden norm runs over [t, H], where every pass counts
    xc += bias
    return xc


def linear(x, weight, bias=None):
    weight = weight.astype(x.dtype, copy=False)  # float16-stored matrices compute in float32
    # Few rows: BLAS streams the weight twice as fast as the left operand of a gemm.
    y = (weight @ x.T).T if x.ndim == 2 and x.shape[0] <= 32 else x @ weight.T  # [..., in] -> [..., out]
    return y if bias is None else y + bias


def normalize(x, eps=1e-12):
    xp = array_module(x)
    return x / xp.maximum(xp.linalg.norm(x, axis=-1, keepdims=True), eps)


def cosine_similarity(a, b, eps=1e-8):
    xp = array_module(a)
    na = (a * a).sum(-1)
    nb = (b * b).sum(-1)
    return (a * b).sum(-1) / xp.sqrt(xp.maximum(na * nb, eps * eps))


def sequential(x, first, last):
    """nn.Sequential(Linear, GELU, Dropout, Linear[, Dropout]) at inference."""
    return linear(gelu(linear(x, **first)), **last)


def multi_head_attention(x, memory, in_proj_weight, in_proj_bias, out_proj, n_head, bounds=None):
    """nn.MultiheadAttention(x, memory, memory), picking the cheaper of two exact forms.

    bounds: (x's, memory's) row offsets [R + 1] of R records stacked, each attending its own memory
    rows only; the projections run over every record's rows at once. None: one record.
    With few queries over a long memory, the key projection moves onto the queries
    (q Wk mem^T) and the value projection after the weighted sum ((p mem) Wv^T + bv);
    the key bias adds one constant to each query's scores, which the softmax ignores.
    """
    xp = array_module(x)
    nq, w = x.shape
    t = memory.shape[0]
    hd = w // n_head
    xb, mb = bounds if bounds is not None else ((0, nq), (0, t))
    pairs = [(slice(a, b), slice(c, d)) for a, b, c, d in zip(xb, xb[1:], mb, mb[1:])]
    wq, wk, wv = in_proj_weight.astype(x.dtype, copy=False).reshape(3, w, w)
    bq, bk, bv = in_proj_bias.reshape(3, w)
    q = (linear(x, wq, bq) * np.float32(1 / math.sqrt(hd))).reshape(nq, n_head, hd)  # [nq, h, hd]
    q = q.transpose(1, 0, 2)  # [h, nq, hd]
    if sum((r.stop - r.start) * (w + (n_head - 1) * (m.stop - m.start)) for r, m in pairs) < t * w:
        qk = q @ wk.reshape(n_head, hd, w)  # [h, nq, w]
        parts = []  # a loop, not a comprehension: on Python 3.11 its closure would keep qk past a CuPy OOM's frames
        for r, m in pairs:
            parts.append(attend(qk[:, r], memory[m]))  # [h, nq_r, w]
        pm = xp.concatenate(parts, axis=1)  # [h, nq, w]
        o = pm @ wv.reshape(n_head, hd, w).transpose(0, 2, 1) + bv.reshape(n_head, 1, hd)  # [h, nq, hd]
    else:
        k = linear(memory, wk, bk).reshape(t, n_head, hd).transpose(1, 0, 2)  # [h, t, hd]
        v = linear(memory, wv, bv).reshape(t, n_head, hd).transpose(1, 0, 2)  # [h, t, hd]
        parts = []
        for r, m in pairs:
            parts.append(softmax(q[:, r] @ k[:, m].transpose(0, 2, 1)) @ v[:, m])  # [h, nq_r, hd]
        o = xp.concatenate(parts, axis=1)  # [h, nq, hd]
    o = xp.ascontiguousarray(o.transpose(1, 0, 2)).reshape(nq, w)  # [nq, w]
    return linear(o, **out_proj)


def attend(qk, memory):
    """Each head's weighted sum of memory rows, scored by queries already through the key projection:
    [h, nq, w], [t, w] -> [h, nq, w]."""
    n_head, nq, w = qk.shape
    t = memory.shape[0]
    p = softmax((qk.reshape(n_head * nq, w) @ memory.T).reshape(n_head, nq, t))  # [h, nq, t]
    return (p.reshape(n_head * nq, t) @ memory).reshape(n_head, nq, w)  # [h, nq, w]


def evidence_routing_layer(queries, memory, query_norm, memory_norm, attention, feedforward_norm,
                           feedforward, n_head, bounds=None):
    m = layer_norm(memory, **memory_norm)  # [t, w]
    queries = queries + multi_head_attention(layer_norm(queries, **query_norm), m, **attention, n_head=n_head,
                                             bounds=bounds)
    return queries + sequential(layer_norm(queries, **feedforward_norm), feedforward["0"], feedforward["3"])


def transformer_decoder_layer(x, memory, self_attn, multihead_attn, linear1, linear2, norm1, norm2, norm3,
                              n_head, bounds=None):
    """nn.TransformerDecoderLayer(norm_first=True, activation='gelu'), no masks; bounds as in
    multi_head_attention (a record's rows attend each other only)."""
    xb = bounds[0] if bounds is not None else None
    h = layer_norm(x, **norm1)
    x = x + multi_head_attention(h, h, **self_attn, n_head=n_head, bounds=None if xb is None else (xb, xb))
    x = x + multi_head_attention(layer_norm(x, **norm2), memory, **multihead_attn, n_head=n_head, bounds=bounds)
    return x + sequential(layer_norm(x, **norm3), linear1, linear2)


def span_means(x, spans):
    """Means of x over non-empty [start, end) row spans, in any order: [n, 2] -> [n, d].

    One pooling matrix over the rows the spans cover (llama.cpp's Clef graph pools the same way):
    one matmul, where a loop over spans would launch a reduction per span on a GPU.
    """
    xp = array_module(x)
    lo, hi = int(spans[:, 0].min()), int(spans[:, 1].max())
    s = xp.asarray(spans - lo)  # [n, 2] on x's device
    rows = xp.arange(hi - lo)  # [r]
    inside = ((rows >= s[:, :1]) & (rows < s[:, 1:])).astype(x.dtype)  # [n, r]
    return (inside @ x[lo:hi]) / (s[:, 1:] - s[:, :1]).astype(x.dtype)  # [n, d]


def option_summaries(options, base, option_question):
    """Per question, its options weighted by the softmax of their routing scores: [n_o, w] -> [n_q, w].

    All questions at once: each row of the [n_q, n_o] score matrix masks other questions' options out.
    """
    xp = array_module(options)
    scores = (base @ options.T) / np.float32(math.sqrt(options.shape[-1]))  # [n_q, n_o]
    mine = xp.arange(base.shape[0])[:, None] == option_question  # [n_q, n_o]
    return softmax(xp.where(mine, scores, scores.dtype.type(-math.inf))) @ options  # [n_q, w]


def joint_schema_head(hidden, option_rows, layout: Layout, n_head: int, *, hidden_norm, memory_projection,
                      **decision):
    """One record's option logits, flat in layout order.

    hidden: [t, H] last hidden states; option_rows: [s, H] output-embedding rows of every
    option-span token, in order (the spans concatenated).
    """
    h, memory = hidden_memory(hidden, hidden_norm, memory_projection)  # [t, H], [t, w]
    return option_logits([h], [memory], [option_rows], [layout], n_head, **decision)[0]


def hidden_memory(hidden, hidden_norm, memory_projection):
    """The normed hidden states and the memory the attention layers read: [t, H] -> [t, H], [t, w].

    Row by row, so a cached prompt prefix's memory rows can be kept and only new rows computed.
    """
    h = layer_norm(hidden, **hidden_norm)  # [t, H]
    return h, linear(h, **memory_projection)  # [t, H], [t, w]


def offsets(counts) -> np.ndarray:
    """Row offsets of records stacked one after another: [R] counts -> [R + 1]."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # [R + 1]


def option_logits(hs, memories, option_rows, layouts, n_head: int, *, question_projection,
                  option_question_projection, global_projection, option_context_projection,
                  option_lexical_projection, type_embedding, evidence_layers, option_summary_norm, layers,
                  field_norm, option_norm, residual_scorer, prior_logit_scale, joint_logit_scale, residual_gate):
    """The head after hidden_memory for R records at once: each record's option logits, flat in its layout order.

    hs[i]: [t'_i, H] the normed states of record i's last t'_i tokens (its layout's spans and its last token
    lie there); memories[i]: [t_i, w] the memory rows of its whole prompt (t_i >= t'_i); option_rows[i] as in
    joint_schema_head. The records' question and option rows are stacked, so every linear layer reads its
    weights once for all of them; pooling and attention stay within each record.
    """
    xp = array_module(hs[0])
    n_q = [len(layout.types) for layout in layouts]
    qb, ob = offsets(n_q), offsets([len(layout.option_spans) for layout in layouts])  # [R + 1] each
    mb = offsets([len(m) for m in memories])  # [R + 1]
    memory = xp.concatenate(memories) if len(memories) > 1 else memories[0]  # [t, w]
    oq = xp.asarray(np.concatenate([layout.option_question + b for layout, b in zip(layouts, qb)]))  # [n_o]
    qr = xp.asarray(np.repeat(np.arange(len(layouts)), n_q))  # [n_q] the record of each question
    types = xp.asarray(np.concatenate([layout.types for layout in layouts]))  # [n_q]

    pooled = [span_means(h, np.concatenate([layout.question_spans, layout.option_spans]))
              for h, layout in zip(hs, layouts)]  # [n_q_i + n_o_i, H] each
    question = xp.concatenate([p[:k] for p, k in zip(pooled, n_q)])  # [n_q, H]
    context = xp.concatenate([p[k:] for p, k in zip(pooled, n_q)])  # [n_o, H]
    lexical = xp.concatenate([span_means(rows, row_spans(layout)) for rows, layout in zip(option_rows, layouts)])
    g = xp.stack([h[-1] for h in hs])  # [R, H]

    options = (linear(context, **option_context_projection) + linear(lexical, **option_lexical_projection)
               + linear(question, **option_question_projection)[oq])  # [n_o, w]
    for layer in evidence_layers:
        options = evidence_routing_layer(options, memory, **layer, n_head=n_head, bounds=(ob, mb))

    base = linear(question, **question_projection)  # [n_q, w]
    summaries = option_summaries(options, base, oq)  # [n_q, w]
    fields = (base + layer_norm(summaries, **option_summary_norm) + linear(g, **global_projection)[qr]
              + type_embedding["weight"][types])  # [n_q, w]
    for layer in layers:
        fields = transformer_decoder_layer(fields, memory, **layer, n_head=n_head, bounds=(qb, mb))
    fields = layer_norm(fields, **field_norm)  # [n_q, w]

    anchor = normalize(question + g[qr])  # [n_q, H]
    prior_scale = xp.exp(xp.minimum(prior_logit_scale, LOG_100))
    prior = prior_scale * (normalize(lexical) * anchor[oq]).sum(-1)  # [n_o]
    opts = layer_norm(options, **option_norm)  # [n_o, w]
    f = fields[oq]  # [n_o, w]
    features = xp.concatenate([f, opts, f * opts, xp.abs(f - opts)], axis=-1)  # [n_o, 4w]
    residual = sequential(features, residual_scorer["0"], residual_scorer["3"])[:, 0]  # [n_o]
    joint = xp.exp(xp.minimum(joint_logit_scale, LOG_100)) * cosine_similarity(f, opts) + residual  # [n_o]
    gate = 1.0 / (1.0 + xp.exp(-residual_gate))
    logits = prior + gate * joint  # [n_o]
    return [logits[a:b] for a, b in zip(ob, ob[1:])]


def row_spans(layout: Layout) -> np.ndarray:
    """Each option's [start, end) in its option rows (the option spans' tokens concatenated): [n_o, 2]."""
    lengths = layout.option_spans[:, 1] - layout.option_spans[:, 0]  # [n_o]
    return np.stack([np.cumsum(lengths) - lengths, np.cumsum(lengths)], axis=1)  # [n_o, 2]
