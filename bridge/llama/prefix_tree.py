"""The prefix cache's bookkeeping: checkpoints in a token tree, and the sequences that hold their KV cells.

A Node is the state after tokens[:pos]; its segment is tokens[parent.pos:pos], so the nodes whose
segments a prompt starts with, walked down from the root, are exactly its cached prefixes. A
Branch is a spare llama.cpp sequence id whose KV cells hold tokens[:tip.pos] of one token path: it
covers every node on that path up to its tip, and a node is restorable while it has its recurrent
state and at least one branch. A Segment is the KV cells one request decoded; branches share them
(llama_memory_seq_cp), so the cells in use are counted per segment, not per branch. Each partition (a
request's PrefillRequest.partition: a fine-tune's adapter, a client's prompt_cache_key) has a root of its own,
so requests of different partitions never find each other's checkpoints; an emptied root goes away.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class SequenceMemory(Protocol):
    """What the cache needs from a llama.cpp context (Backbone implements it)."""

    def decode_chunks(self, chunks: list[tuple[int, int, np.ndarray]]) -> np.ndarray: ...
    def save_state(self, seq: int) -> np.ndarray: ...
    def restore_state(self, seq: int, state: np.ndarray) -> None: ...
    def copy_cells(self, src: int, dst: int, p0: int, p1: int) -> None: ...
    def drop_sequence(self, seq: int) -> None: ...
    def drop_all(self) -> None: ...


class Node:
    __slots__ = ("pos", "parent", "segment", "children", "state", "payload", "payload_bytes", "ready", "used",
                 "branches", "alive")

    def __init__(self, pos: int, parent: "Node | None", segment: np.ndarray, state: np.ndarray | None,
                 ready: bool, used: int):
        self.pos, self.parent, self.segment, self.state = pos, parent, segment, state
        self.children: list[Node] = []
        self.payload: Any = None
        self.payload_bytes, self.ready, self.used = 0, ready, used
        self.branches: set[Branch] = set()
        self.alive = True

    def chain(self) -> list["Node"]:
        """This node and its ancestors, root excluded, oldest first."""
        out, node = [], self
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


class Segment:
    """KV cells one request decoded from position `start` on; ends: how far each branch holding them keeps them."""

    __slots__ = ("start", "ends")

    def __init__(self, start: int):
        self.start = start
        self.ends: dict[Branch, int] = {}

    def cells(self) -> int:
        return max(self.ends.values()) - self.start if self.ends else 0


class Branch:
    __slots__ = ("seq", "tip", "nodes", "parts", "used")

    def __init__(self, seq: int, tip: Node, parts: list[tuple[Segment, int]], used: int):
        self.seq, self.tip, self.used, self.parts = seq, tip, used, parts
        self.nodes: set[Node] = set()
        for segment, end in parts:
            segment.ends[self] = end

    def cover(self, node: Node) -> None:
        self.nodes.add(node)
        node.branches.add(self)


class CheckpointTree:
    """Nodes, branches and their budgets; the caller serializes access (PrefixCache holds a lock)."""

    def __init__(self, memory: SequenceMemory, seq_ids: list[int], cells: int, max_bytes: int):
        self.memory, self.seq_ids, self.cells, self.max_bytes = memory, seq_ids, cells, max_bytes
        self.root = Node(0, None, np.zeros(0, np.int32), None, True, 0)
        # one root per partition (PrefillRequest.partition): paths under different roots never meet
        self.roots: dict[tuple[str, ...], Node] = {(): self.root}
        self.branches: list[Branch] = []
        self.free_seqs = list(seq_ids)
        self.bytes = 0
        self.evictions = 0

    def root_for(self, partition: tuple[str, ...]) -> Node:
        """The root of a partition's paths (made on first use)."""
        return self.roots.setdefault(partition, Node(0, None, np.zeros(0, np.int32), None, True, 0))

    def matching(self, tokens: np.ndarray, pending_ok: bool, partition: tuple[str, ...] = ()) -> list[Node]:
        """Every node of the partition whose tokens[:pos] the prompt starts with, pos < len(tokens) (one token must
        remain).

        pending_ok=False does not look past nodes that still wait for their payload.
        """
        root = self.roots.get(partition)
        out, stack = [], [root] if root is not None else []
        while stack:
            node = stack.pop()
            for child in node.children:
                if (child.pos < len(tokens) and (pending_ok or child.ready)
                        and np.array_equal(child.segment, tokens[node.pos:child.pos])):
                    out.append(child)
                    stack.append(child)
        return out

    def common_prefix(self, tokens: np.ndarray, partition: tuple[str, ...] = ()) -> int:
        """How many leading tokens the prompt shares with the longest token path of its partition."""
        root = self.roots.get(partition)
        best, stack = 0, [root] if root is not None else []
        while stack:
            node = stack.pop()
            for child in node.children:
                n = min(len(child.segment), len(tokens) - node.pos)
                differ = np.flatnonzero(child.segment[:n] != tokens[node.pos:node.pos + n])
                same = int(differ[0]) if len(differ) else n
                best = max(best, node.pos + same)
                if same == len(child.segment):
                    stack.append(child)
        return best

    def add(self, parent: Node, pos: int, tokens: np.ndarray, state: np.ndarray, ready: bool, used: int) -> Node:
        node = Node(pos, parent, tokens[parent.pos:pos].copy(), None, ready, used)
        parent.children.append(node)
        self.set_state(node, state)
        return node

    def set_state(self, node: Node, state: np.ndarray) -> None:
        self.bytes += state.nbytes - (node.state.nbytes if node.state is not None else 0)
        node.state = state

    def set_payload(self, node: Node, payload: Any) -> None:
        node.payload, node.ready = payload, True
        self.bytes -= node.payload_bytes
        node.payload_bytes = int(getattr(payload, "nbytes", 0))
        self.bytes += node.payload_bytes

    def all_nodes(self) -> list[Node]:
        out, stack = [], list(self.roots.values())
        while stack:
            node = stack.pop()
            out.extend(node.children)
            stack.extend(node.children)
        return out

    def drop_state(self, node: Node, evicted: bool = True) -> None:
        if node.state is not None:
            self.bytes -= node.state.nbytes
            node.state = None
            self.evictions += evicted

    def prune(self, node: Node) -> None:
        """Remove stateless leaves, walking up while that frees their parents.

        Such a node serves nothing: no state to restore, no descendant whose payload chain needs it.
        A branch that covered it keeps its cells until drop_redundant_branches frees them.
        """
        while node.alive and node.parent is not None and node.state is None and not node.children:
            node.parent.children.remove(node)
            node.alive = False
            self.bytes -= node.payload_bytes
            for branch in node.branches:
                branch.nodes.discard(node)
            node.branches = set()
            node = node.parent
        if node.parent is None and node is not self.root and not node.children:  # a partition's last path went
            self.roots = {k: r for k, r in self.roots.items() if r is not node}

    def remove_subtree(self, node: Node) -> None:
        if not node.alive:
            return
        for child in list(node.children):
            self.remove_subtree(child)
        self.drop_state(node, evicted=False)
        self.prune(node)

    def evict_bytes(self) -> None:
        """Drop the least recently used states until states and payloads fit max_bytes.

        Payloads of stateless ancestors stay while a descendant needs them; the branches that no
        longer cover a state are freed by drop_redundant_branches (in the prefill thread).
        """
        while self.bytes > self.max_bytes:
            holders = [n for n in self.all_nodes() if n.state is not None]
            if not holders:
                return
            victim = min(holders, key=lambda n: n.used)
            self.drop_state(victim)
            self.prune(victim)

    def cells_used(self) -> int:
        segments = {id(s): s for b in self.branches for s, _ in b.parts}
        return sum(s.cells() for s in segments.values())

    def make_room(self, needed: int, keep: set[Branch]) -> bool:
        """Free cached KV cells (least recently used branches first) until `needed` more fit the context."""
        while self.cells_used() + needed > self.cells:
            victims = [b for b in self.branches if b not in keep]
            if not victims:
                return False
            self.evict_branch(min(victims, key=lambda b: b.used))
        return True

    def keep_cells(self, seq: int, hit: Node | None, parts: list[tuple[Segment, int]], top: Node, used: int
                   ) -> Branch:
        """Keep a request's KV cells below top.pos in a branch: the one whose tip is the hit grows, or a new one.

        parts: the cells below the hit that the request shares, as segments and how far it holds them.
        """
        start = hit.pos if hit else 0
        fresh = Segment(start)
        grow = next((b for b in self.branches if hit is not None and b.tip is hit), None)
        if grow is not None:
            self.memory.copy_cells(seq, grow.seq, start, top.pos)
            fresh.ends[grow] = top.pos
            grow.parts.append((fresh, top.pos))
            grow.tip, grow.used = top, used
            return grow
        if not self.free_seqs:  # spare the branches that hold the hit: the new one covers it too
            others = [b for b in self.branches if hit is None or b not in hit.branches] or self.branches
            self.evict_branch(min(others, key=lambda b: b.used))
        branch_seq = self.free_seqs.pop()
        self.memory.copy_cells(seq, branch_seq, 0, top.pos)
        branch = Branch(branch_seq, top, parts + [(fresh, top.pos)], used)
        self.branches.append(branch)
        return branch

    def evict_branch(self, branch: Branch) -> None:
        self.memory.drop_sequence(branch.seq)
        self.branches.remove(branch)
        self.free_seqs.append(branch.seq)
        for segment, _ in branch.parts:
            segment.ends.pop(branch, None)
        for node in branch.nodes:
            node.branches.discard(branch)
            if not node.branches:
                self.drop_state(node)  # its KV cells are gone
        for node in sorted(branch.nodes, key=lambda n: -n.pos):
            self.prune(node)

    def drop_redundant_branches(self) -> None:
        """Free the branches whose every remaining state another branch also covers."""
        for branch in list(self.branches):
            if not any(n.state is not None and n.branches == {branch} for n in branch.nodes):
                self.evict_branch(branch)

    def clear(self) -> None:
        """Drop every checkpoint and free the cached KV cells."""
        for branch in list(self.branches):
            self.evict_branch(branch)
        self.forget()

    def forget(self) -> None:
        """Forget every checkpoint and branch (after the context's memory was wiped)."""
        for node in self.all_nodes():
            node.alive = False
        self.root.children.clear()
        self.roots = {(): self.root}
        self.branches.clear()
        self.free_seqs = list(self.seq_ids)
        self.bytes = 0
