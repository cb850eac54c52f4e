"""An agent of this version over pins a version with one policy trie wrote: before any program of
its own attaches, the markers (and every entry the hash holds) are in ``policy-exact``, so a new
flow to a selected pod is never allowed for want of a marker; the first reconcile then leaves only
port blocks in the trie."""

from __future__ import annotations

import pytest

from lace.agent.datapath import NodeDatapath
from lace.agent.diff import diff
from lace.datapath.common import Direction
from lace.datapath.policy import EXACT_MAP, TRIE_MAP, PolicyFlag, policy_entry, policy_keys, policy_maps, selected_key

pytestmark = pytest.mark.privileged


def one_trie_entries() -> dict[bytes, bytes]:
    out = {selected_key(300, Direction.INGRESS): policy_entry(4, 0xFFFF, PolicyFlag.SELECTED),
           selected_key(301, Direction.EGRESS): policy_entry(5, 0xFFFF, PolicyFlag.SELECTED | PolicyFlag.AUDIT)}
    for k in policy_keys(300, 302, Direction.INGRESS, 6, 80):
        out[k] = policy_entry(4, 1)
    for k in policy_keys(300, 0, Direction.INGRESS, 17, 1000, 1100):
        out[k] = policy_entry(4, 2)
    for k in policy_keys(301, 0, Direction.EGRESS, None):
        out[k] = policy_entry(5, 1)
    return out


def test_hash_seeded_from_the_one_trie_layout_before_programs_attach(pin_root):
    old = one_trie_entries()
    first = NodeDatapath(pin_root)
    first.load()
    try:
        for k, v in old.items():    # what the previous version's agent left: everything in the trie
            first.map(TRIE_MAP).update(k, v)
    finally:
        first.close()

    dp = NodeDatapath(pin_root)
    dp.load()
    try:
        want = policy_maps(old)
        assert dp.read_kernel(EXACT_MAP) == want[EXACT_MAP]
        marker = dp.read_kernel(EXACT_MAP)[selected_key(300, Direction.INGRESS)]
        assert int.from_bytes(marker[6:8], "little") == (PolicyFlag.SELECTED | PolicyFlag.PORTS
                                                         | PolicyFlag.ANY_PEER_BLOCKS | PolicyFlag.ANY_PEER_PORTS)
        assert dp.read_kernel(TRIE_MAP) == old, "the trie is left to the reconcile"
        # the reconcile's diff: nothing to add to the hash, the trie down to its port blocks
        changes = {name: diff(name, want[name], dp.read(name)) for name in (TRIE_MAP, EXACT_MAP)}
        assert not changes[EXACT_MAP]
        dp.apply(changes, (TRIE_MAP, EXACT_MAP))
        assert dp.read_kernel(TRIE_MAP) == want[TRIE_MAP] and want[TRIE_MAP]
    finally:
        dp.close()

    # a hash in use is never seeded again, whatever the trie holds
    again = NodeDatapath(pin_root)
    again.load()
    try:
        stray = selected_key(999, Direction.INGRESS)
        again.map(TRIE_MAP).update(stray, policy_entry(9, 0xFFFF, PolicyFlag.SELECTED))
    finally:
        again.close()
    last = NodeDatapath(pin_root)
    last.load()
    try:
        assert last.read_kernel(EXACT_MAP) == want[EXACT_MAP]
    finally:
        last.close()


def test_nothing_seeded_without_markers_in_the_trie(pin_root):
    dp = NodeDatapath(pin_root)
    dp.load()
    try:
        assert dp.read_kernel(EXACT_MAP) == {} and dp.read_kernel(TRIE_MAP) == {}
    finally:
        dp.close()
