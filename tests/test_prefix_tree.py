"""bridge/llama/prefix_tree.py: the prefix cache's checkpoint tree, its byte budget and its KV-cell branches,
over a fake llama.cpp memory that records what it is asked to do."""

from __future__ import annotations

import numpy as np
import pytest
from clef_bridge.bridge.llama.prefix_tree import CheckpointTree, Segment

pytestmark = pytest.mark.unit


class Memory:
    """The calls a context would get: cell copies and dropped sequences."""

    def __init__(self):
        self.copies: list[tuple[int, int, int, int]] = []
        self.dropped: list[int] = []

    def copy_cells(self, src, dst, p0, p1):
        self.copies.append((src, dst, p0, p1))

    def drop_sequence(self, seq):
        self.dropped.append(seq)


def tree(cells=100, max_bytes=10_000, seqs=(8, 9)):
    return CheckpointTree(Memory(), list(seqs), cells, max_bytes)


def state(nbytes=100):
    return np.zeros(nbytes, np.uint8)


TOKENS = np.arange(1, 21, dtype=np.int32)


def test_a_prompt_matches_the_checkpoints_it_starts_with_leaving_one_token():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    b = t.add(a, 10, TOKENS, state(), ready=True, used=2)
    other = TOKENS.copy()
    other[7] = 99
    t.add(a, 12, other, state(), ready=True, used=3)  # branches off after a
    assert list(b.segment) == list(TOKENS[5:10]) and b.chain() == [a, b]
    assert {n.pos for n in t.matching(TOKENS, pending_ok=True)} == {5, 10}
    assert {n.pos for n in t.matching(TOKENS[:10], pending_ok=True)} == {5}  # one token must remain to decode
    assert {n.pos for n in t.matching(other, pending_ok=True)} == {5, 12}
    assert t.matching(TOKENS[1:], pending_ok=True) == []


def test_a_checkpoint_waiting_for_its_payload_matches_only_when_pending_is_ok():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(), ready=False, used=1)
    t.add(a, 10, TOKENS, state(), ready=True, used=2)
    assert t.matching(TOKENS, pending_ok=False) == []  # nor anything past it
    assert len(t.matching(TOKENS, pending_ok=True)) == 2
    t.set_payload(a, np.zeros(7, np.float32))
    assert len(t.matching(TOKENS, pending_ok=False)) == 2


def test_the_common_prefix_counts_into_a_segment():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    t.add(a, 10, TOKENS, state(), ready=True, used=1)
    probe = TOKENS.copy()
    probe[8] = 0
    assert t.common_prefix(probe) == 8 and t.common_prefix(TOKENS) == 10 and t.common_prefix(TOKENS[:3]) == 3
    assert t.common_prefix(np.array([7], np.int32)) == 0


def test_states_and_payloads_are_counted_in_bytes():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(100), ready=False, used=1)
    t.set_payload(a, np.zeros(10, np.float32))
    assert t.bytes == 140
    t.set_state(a, state(60))
    t.set_payload(a, np.zeros(5, np.float32))
    assert t.bytes == 80
    t.drop_state(a)
    assert t.bytes == 20 and t.evictions == 1


def test_over_budget_the_least_recently_used_states_go_and_bare_leaves_are_pruned():
    t = tree(max_bytes=250)
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    b = t.add(a, 10, TOKENS, state(), ready=True, used=5)
    c = t.add(t.root, 3, TOKENS + 50, state(), ready=True, used=3)
    t.evict_bytes()
    assert t.bytes == 200 and a.state is None and a.alive  # a keeps its place: b hangs below it
    assert b.state is not None and c.state is not None
    t.max_bytes = 100
    t.evict_bytes()
    assert not c.alive and b.state is not None and t.evictions == 2 and t.root.children == [a]


def test_a_request_keeps_its_cells_in_a_new_branch_then_grows_it():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    first = t.keep_cells(0, None, [], a, used=1)
    first.cover(a)
    assert first.seq == 9 and t.memory.copies == [(0, 9, 0, 5)] and t.cells_used() == 5
    b = t.add(a, 12, TOKENS, state(), ready=True, used=2)
    grown = t.keep_cells(1, a, [], b, used=2)  # a hit at a: the branch whose tip is a grows
    assert grown is first and first.tip is b and t.memory.copies[-1] == (1, 9, 5, 12)
    assert t.cells_used() == 12 and len(t.branches) == 1


def test_shared_cells_are_counted_once():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    shared = Segment(0)
    one = t.keep_cells(0, None, [(shared, 5)], a, used=1)
    b = t.add(a, 9, TOKENS, state(), ready=True, used=2)
    two = t.keep_cells(1, None, [(shared, 5)], b, used=2)
    assert one is not two and shared.ends == {one: 5, two: 5}
    # shared: 5 cells; one's own segment 0..5; two's own 0..9
    assert t.cells_used() == 5 + 5 + 9


def test_without_a_free_sequence_the_least_recently_used_branch_is_evicted():
    t = tree(seqs=(8,))
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    old = t.keep_cells(0, None, [], a, used=1)
    old.cover(a)
    c = t.add(t.root, 4, TOKENS + 50, state(), ready=True, used=2)
    new = t.keep_cells(1, None, [], c, used=2)
    assert t.memory.dropped == [8] and t.branches == [new] and new.seq == 8
    assert a.state is None and not a.alive  # its cells went with the branch, then the bare leaf


def test_make_room_frees_branches_outside_keep_until_the_cells_fit():
    t = tree(cells=20)
    a = t.add(t.root, 8, TOKENS, state(), ready=True, used=1)
    first = t.keep_cells(0, None, [], a, used=1)
    c = t.add(t.root, 9, TOKENS + 50, state(), ready=True, used=2)
    second = t.keep_cells(1, None, [], c, used=2)
    assert t.cells_used() == 17
    assert t.make_room(5, keep={first, second}) is False
    assert t.make_room(5, keep={second}) is True and t.branches == [second] and t.cells_used() == 9
    assert t.make_room(25, keep=set()) is False and t.branches == [] and t.cells_used() == 0


def test_a_branch_whose_states_another_covers_is_redundant():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    b = t.add(a, 10, TOKENS, state(), ready=True, used=2)
    short = t.keep_cells(0, None, [], a, used=1)
    short.cover(a)
    long = t.keep_cells(1, None, [], b, used=2)
    long.cover(a)
    long.cover(b)
    t.drop_redundant_branches()
    assert t.branches == [long] and a.state is not None and a.branches == {long}


def test_clear_frees_every_branch_and_forgets_every_checkpoint():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    t.keep_cells(0, None, [], a, used=1).cover(a)
    t.clear()
    assert t.memory.dropped == [9] and t.root.children == [] and t.branches == [] and t.bytes == 0
    assert not a.alive and sorted(t.free_seqs) == [8, 9] and t.matching(TOKENS, pending_ok=True) == []


def test_partitions_have_roots_of_their_own_and_an_emptied_one_goes():
    t = tree()
    a = t.add(t.root, 5, TOKENS, state(), ready=True, used=1)
    b = t.add(t.root_for(("alice",)), 5, TOKENS, state(), ready=True, used=2)
    assert t.matching(TOKENS, pending_ok=True) == [a]
    assert t.matching(TOKENS, pending_ok=True, partition=("alice",)) == [b]
    assert t.matching(TOKENS, pending_ok=True, partition=("bob",)) == [] and ("bob",) not in t.roots
    assert t.common_prefix(TOKENS, ("bob",)) == 0 and t.common_prefix(TOKENS, ("alice",)) == 5
    assert sorted(t.all_nodes(), key=id) == sorted([a, b], key=id)
    t.drop_state(b)
    t.prune(b)
    assert set(t.roots) == {()}  # alice's root went with her last checkpoint
