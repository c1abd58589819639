"""Prefix cache: a request restores the longest cached checkpoint of its prompt and prefills only the rest.

Modelled on llama.cpp's server (tools/server/server-context.cpp, "context checkpoints"). Qwen3.5's
linear-attention layers keep a recurrent + convolution state that cannot be rolled back
(llama_memory_seq_rm in the middle of a sequence fails), so a checkpoint is, as there, a host copy
of exactly that part of one sequence after tokens[:pos] (llama_state_seq_get_data_ext with
LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY), taken between two decodes that stop at pos. llama-server keeps
one prompt per slot and that prompt's KV cells in the slot; here the full-attention layers' KV
cells of cached prefixes stay in the context under spare sequence ids ("branches", see
prefix_tree.py), and a restore shares them with llama_memory_seq_cp (metadata only in a unified KV
cache) before it loads the recurrent part into the request's own sequence, whose positions then
continue from the checkpoint. One decode may mix hits and misses, and requests of one batch that
share a new prefix decode it once: a follower waits for its leader to reach their last shared
checkpoint and restores it from there, like a hit.

Where, inside a request's cache span (the state section of the prompt): at every multiple of
`every`; `margin` tokens before the span's end, so that the same state, or a state that grew at
its end, finds a checkpoint just before its new tokens; and where the prompt leaves the longest
token path cached so far, so that a state that changes in its middle (a JSON list that grows
before a later key) finds one a change behind.

Payloads: with options.payloads, a new checkpoint serves hits only once attach() gave it the
caller's payload for its segment tokens[start:end] (the head's memory rows); a hit returns the
payloads along its chain, which together cover tokens[:reused]. discard() drops them instead.
Budgets: host bytes (states + payloads) by max_mb, least recently used first; KV cells by the
context and sequence ids by options.sequences, least recently used branch first. Faults: a failed
decode or restore empties the cache (the context's memory is wiped); a request whose hidden states
are not finite keeps no checkpoint. Only the prefill thread touches llama.cpp; attach() and
discard() may run on another thread and only edit the tree.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .options import PrefixCacheOptions
from .prefix_tree import Branch, CheckpointTree, Node, Segment, SequenceMemory


@dataclass(frozen=True)
class PrefillRequest:
    tokens: np.ndarray  # [t] int32, the whole prompt
    cache_span: tuple[int, int] | None = None  # [start, end) where checkpoints may be made: the state
    # requests of different partitions never share KV cells, states or payloads (a fine-tune's adapter and head, a
    # client's prompt_cache_key)
    partition: tuple[str, ...] = ()


@dataclass(frozen=True)
class CachedPrefill:
    hidden: np.ndarray  # [t - reused, n_embd] float32: the rows of tokens[reused:]
    reused: int  # tokens restored from a checkpoint (0: a miss)
    prefix_payloads: tuple[Any, ...]  # with payloads on: the payloads covering tokens[:reused], in order
    new_segments: tuple[tuple[int, int], ...]  # [start, end) of each new checkpoint that waits for attach()
    ticket: int  # for attach() / discard(); 0 when nothing waits


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    tokens_reused: int  # not decoded: restored from a checkpoint, or shared with a request of the same batch
    tokens_prefilled: int  # decoded
    shared: int  # requests that shared a new prefix with another request of their batch
    checkpoints: int  # made so far
    evictions: int  # checkpoint states dropped for room (bytes, cells or sequence ids)
    faults: int  # failed decodes or restores (each emptied the cache) and non-finite requests (not cached)
    bytes: int  # states + payloads held now
    max_bytes: int
    cells: int  # KV cells held by cached prefixes now
    branches: int  # sequence ids holding them


@dataclass
class _Plan:
    request: PrefillRequest
    tokens: np.ndarray
    hit: Node | None = None
    state: np.ndarray | None = None  # the hit's recurrent state (attach() may evict it from the node meanwhile)
    source: Branch | None = None  # the branch whose cells the hit shares
    parts: list[tuple[Segment, int]] | None = None  # those cells: segments, and how far the request holds them
    payloads: tuple[Any, ...] = ()
    stops: tuple[int, ...] = ()  # checkpoint positions to make
    leader: int | None = None  # the request of the batch whose decode this one joins at `joins`
    joins: int = 0

    @property
    def reused(self) -> int:
        return self.hit.pos if self.hit else 0


class PrefixCache:
    """Checkpoints of prompt prefixes on one llama.cpp context; sequence ids below batch_seqs are the decode's."""

    def __init__(self, memory: SequenceMemory, options: PrefixCacheOptions, batch_seqs: int, cells: int):
        self.memory, self.options = memory, options
        seq_ids = list(range(batch_seqs + options.sequences - 1, batch_seqs - 1, -1))
        self._tree = CheckpointTree(memory, seq_ids, cells, int(options.max_mb * 2**20))
        self._lock = threading.Lock()
        self._pending: dict[int, list[Node]] = {}
        self._clock = self._tickets = 0
        self._counts = dict(hits=0, misses=0, tokens_reused=0, tokens_prefilled=0, shared=0, checkpoints=0, faults=0)

    def prefill(self, requests: list[PrefillRequest], reuse: bool = True) -> list[CachedPrefill]:
        """One batch: restore each request's longest cached prefix, decode the rest, checkpoint the spans.

        reuse=False decodes every token (no lookup, no checkpoint) and leaves the cache as it is.
        """
        with self._lock:
            plans = self._plan(requests, reuse)
        try:
            for i, plan in enumerate(plans):
                if plan.hit is not None and plan.leader is None:  # a follower restores when it joins
                    self.memory.copy_cells(plan.source.seq, i, 0, plan.reused)
                    self.memory.restore_state(i, plan.state)
            rows, states, decoded = self._decode(plans)
        except BaseException:
            with self._lock:
                self.memory.drop_all()
                self._forget()
                self._counts["faults"] += 1
            raise
        try:
            with self._lock:
                self._counts["tokens_prefilled"] += decoded
                self._counts["tokens_reused"] += sum(len(p.tokens) for p in plans) - decoded
                results = [self._commit(i, p, r, s) for i, (p, r, s) in enumerate(zip(plans, rows, states))]
                self._tree.evict_bytes()
                self._tree.drop_redundant_branches()
        finally:
            for i in range(len(plans)):
                self.memory.drop_sequence(i)
        return results

    def attach(self, ticket: int, payloads: list[Any]) -> None:
        """Give one CachedPrefill's new checkpoints their payloads, one per new segment: they serve hits now."""
        with self._lock:
            nodes = self._pending.pop(ticket, None)
            if nodes is None:
                return  # emptied by a fault meanwhile
            if len(payloads) != len(nodes):
                self._pending[ticket] = nodes
                raise ValueError(f"ticket {ticket} has {len(nodes)} new segments, got {len(payloads)} payloads")
            for node, payload in zip(nodes, payloads):
                if node.alive:
                    self._tree.set_payload(node, payload)
            self._tree.evict_bytes()

    def discard(self, ticket: int) -> None:
        """Drop one CachedPrefill's new checkpoints (their payloads will not come), with their descendants."""
        with self._lock:
            for node in self._pending.pop(ticket, ()):
                self._tree.remove_subtree(node)

    def clear(self) -> None:
        """Drop every checkpoint and free the cached KV cells (the prefill thread only)."""
        with self._lock:
            self._tree.clear()
            self._forget()

    def stats(self) -> CacheStats:
        with self._lock:
            tree = self._tree
            return CacheStats(**self._counts, evictions=tree.evictions, bytes=tree.bytes, max_bytes=tree.max_bytes,
                              cells=tree.cells_used(), branches=len(tree.branches))

    def _forget(self) -> None:
        self._tree.forget()
        self._pending.clear()

    def _plan(self, requests: list[PrefillRequest], reuse: bool) -> list[_Plan]:
        self._clock += 1
        plans = [_Plan(r, np.ascontiguousarray(r.tokens, dtype=np.int32)) for r in requests]
        if reuse:
            for p in plans:
                usable = [n for n in self._tree.matching(p.tokens, False, p.request.partition)
                          if n.state is not None and n.branches]
                p.hit = max(usable, key=lambda n: n.pos, default=None)
        keep = {b for p in plans if p.hit for b in p.hit.branches}
        if not self._tree.make_room(sum(len(p.tokens) - p.reused for p in plans), keep):
            self._tree.clear()  # the batch needs the cells the hits hold: run it without them
            for p in plans:
                p.hit = None
            self._tree.make_room(sum(len(p.tokens) for p in plans), set())
        for p in plans:
            if reuse:
                self._counts["hits" if p.hit else "misses"] += 1
                common = self._tree.common_prefix(p.tokens, p.request.partition)
                p.stops = self._stops(p.request, len(p.tokens), p.reused, common)
            if p.hit:
                p.state, p.hit.used = p.hit.state, self._clock
                p.source = max(p.hit.branches, key=lambda b: b.used)
                p.source.used = self._clock
                p.parts = [(s, min(end, p.reused)) for s, end in p.source.parts if s.start < p.reused]
                if self.options.payloads:
                    p.payloads = tuple(n.payload for n in p.hit.chain())
        if reuse:
            self._share(plans)
        return plans

    def _share(self, plans: list[_Plan]) -> None:
        """Let each request follow an earlier one of the batch up to their last common checkpoint, if any."""
        for j, p in enumerate(plans):
            best = 0
            for i, lead in enumerate(plans[:j]):
                if (lead.leader is not None or lead.hit is not p.hit
                        or lead.request.partition != p.request.partition):
                    continue
                n = min(len(lead.tokens), len(p.tokens))
                differ = np.flatnonzero(lead.tokens[:n] != p.tokens[:n])
                common = int(differ[0]) if len(differ) else n
                joins = max((c for c in lead.stops if c <= common and c < len(p.tokens)), default=0)
                if joins > max(best, p.reused):
                    best, p.leader, p.joins = joins, i, joins
            if p.leader is not None:
                p.stops = tuple(c for c in p.stops if c > p.joins)
                self._counts["shared"] += 1

    def _stops(self, req: PrefillRequest, n_tokens: int, start: int, diverge: int) -> tuple[int, ...]:
        """Checkpoint positions in the span past start: multiples of `every`, where the prompt leaves the
        cached paths (diverge), and `margin` before the span's end."""
        if req.cache_span is None:
            return ()
        begin, end = req.cache_span
        last = min(end - self.options.margin, n_tokens - 1)
        low = max(begin, start)
        every = self.options.every
        stops = set(range((low // every + 1) * every, last, every))
        stops |= {p for p in (diverge, last) if low < p <= last}
        return tuple(sorted(stops))

    def _decode(self, plans: list[_Plan]) -> tuple[list[np.ndarray], list[list[tuple[int, np.ndarray]]], int]:
        """Decode every request's new tokens, stopping at its checkpoints to save the recurrent state there.

        Returns each request's rows of tokens[reused:], its saved states, and the tokens decoded.
        """
        cursor = [p.reused for p in plans]
        rows: list[list[np.ndarray]] = [[] for _ in plans]
        states: list[list[tuple[int, np.ndarray]]] = [[] for _ in plans]
        waiting = [j for j, p in enumerate(plans) if p.leader is not None]
        decoded = 0
        while True:
            for j in [j for j in waiting if cursor[plans[j].leader] >= plans[j].joins]:
                self._join(j, plans[j], rows, states)
                cursor[j] = plans[j].joins
                waiting.remove(j)
            chunks = []
            for i, p in enumerate(plans):
                if cursor[i] < len(p.tokens) and i not in waiting:
                    stop = next((c for c in p.stops if c > cursor[i]), len(p.tokens))
                    chunks.append((i, cursor[i], p.tokens[cursor[i]:stop]))
            if not chunks:
                return [r[0] if len(r) == 1 else np.concatenate(r) for r in rows], states, decoded
            out = self.memory.decode_chunks(chunks)  # [sum of chunk lengths, n_embd]
            at = 0
            for i, start, ids in chunks:
                rows[i].append(out[at:at + len(ids)])
                at += len(ids)
                cursor[i] = start + len(ids)
                if cursor[i] < len(plans[i].tokens):
                    states[i].append((cursor[i], self.memory.save_state(i)))
            decoded += at

    def _join(self, seq: int, plan: _Plan, rows: list[list[np.ndarray]], states: list) -> None:
        """A follower takes its leader's cells and state at plan.joins, and its rows from plan.reused on."""
        lead = plan.leader
        self.memory.copy_cells(lead, seq, 0, plan.joins)
        self.memory.restore_state(seq, next(state for pos, state in states[lead] if pos == plan.joins))
        rows[seq].append(np.concatenate(rows[lead])[:plan.joins - plan.reused])

    def _commit(self, seq: int, plan: _Plan, hidden: np.ndarray, states: list[tuple[int, np.ndarray]]
                ) -> CachedPrefill:
        """Turn one decoded request's saved states into checkpoints, and keep the KV cells they need."""
        if states and not np.isfinite(hidden).all():  # never keep a state that led to NaN or inf
            self._counts["faults"] += 1
            states = []
        partition = plan.request.partition
        path = {n.pos: n for n in self._tree.matching(plan.tokens, True, partition)} if states else {}
        created, stated, previous = [], [], None
        for pos, state in states:
            node = path.get(pos)
            if node is None:
                # after the previous stop, so that one request's checkpoints form one chain
                parent = previous or max((n for n in path.values() if n.pos < pos), key=lambda n: n.pos,
                                         default=self._tree.root_for(partition))
                node = path[pos] = self._tree.add(parent, pos, plan.tokens, state, not self.options.payloads,
                                                  self._clock)
                created.append(node)
                stated.append(node)
            elif node.state is None:
                self._tree.set_state(node, state)  # a stateless ancestor gets its state back
                stated.append(node)
            previous, node.used = node, self._clock
        self._counts["checkpoints"] += len(created)
        uncovered = [n for n in stated if not n.branches]
        if uncovered:
            top = max(uncovered, key=lambda n: n.pos)
            branch = self._tree.keep_cells(seq, plan.hit, plan.parts or [], top, self._clock)
            for node in path.values():
                if node.pos <= top.pos:
                    branch.cover(node)
        if not (created and self.options.payloads):
            return CachedPrefill(hidden, plan.reused, plan.payloads, (), 0)
        self._tickets += 1
        self._pending[self._tickets] = created
        return CachedPrefill(hidden, plan.reused, plan.payloads, tuple((n.parent.pos, n.pos) for n in created),
                             self._tickets)
