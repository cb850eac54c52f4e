"""lace.datapath.node against the real kernel: both lace objects loaded sharing their pinned maps,
the same maps read back through a node's pins, and the typed errors for a node with nothing loaded
or a map that is not pinned."""

from __future__ import annotations

import os

import pytest

from lace.datapath import registry
from lace.datapath.config import config_key, config_value
from lace.datapath.node import (DatapathError, MapNotPinned, MapUnavailable, NodeNotLoaded, PinnedMaps,
                                load_objects)
from lace.datapath.segment import segment_key, segment_value

pytestmark = pytest.mark.privileged


def test_loaded_objects_share_their_pinned_maps(pin_root):
    with load_objects(pin_root, max_entries={"ct-tcp-v4": 4096}) as dp:
        assert list(dp.objects) == list(registry.OBJECTS)
        assert dp.migrations == []
        assert {m.pin_name for m in registry.MAPS.values()} <= set(os.listdir(pin_root))
        assert dp.capacity("ct-tcp-v4") == 4096
        assert dp.capacity("policy") == registry.get("policy").max_entries
        seg = dp.map("segment")
        # the other object's fd for the same pin is the same kernel map
        assert dp.objects["uplink"].maps[seg.name].id == seg.id
        assert dp.program("lace_from_pod").name == "lace_from_pod"
        assert dp.program("lace_from_uplink").name == "lace_from_uplink"
        with pytest.raises(KeyError):
            dp.program("nope")
        with pytest.raises(KeyError):
            dp.map("nope")

        want = {segment_key(1, f"10.1.1.{i}"): segment_value(256 + i, local=True) for i in range(1, 40)}
        for k, v in want.items():
            seg.update(k, v)
        dp.map("config").update(config_key(), config_value(locator="2001:db8:1::/48",
                                                           underlay_addr="2001:db8:f::1", node_id=1,
                                                           uplink_ifindex=1, mtu=1460))
        assert dp.entries("segment") == want

        maps = PinnedMaps(pin_root, node="n1")
        assert maps.entries("segment") == want
        assert maps.capacity("ct-tcp-v4") == 4096
        assert maps.path("policy") == os.path.join(pin_root, "lace_policy")
        with maps.open("config") as m:
            assert m.id == dp.map("config").id
        assert m.closed
        assert maps.entries("config") == dp.entries("config")

    # the maps outlive the loader; a second load reuses them (no migration, entries kept)
    assert PinnedMaps(pin_root).entries("segment") == want
    with load_objects(pin_root, max_entries={"ct-tcp-v4": 4096}) as again:
        assert again.migrations == [] and again.entries("segment") == want
    # a changed capacity migrates the pinned map and carries its entries over
    with load_objects(pin_root, max_entries={"ct-tcp-v4": 8192}) as grown:
        assert [m.map for m in grown.migrations] == ["lace_ct_tcp4"]
        assert grown.capacity("ct-tcp-v4") == 8192


def test_unknown_capacity_override_is_refused_before_loading(pin_root):
    with pytest.raises(KeyError):
        load_objects(pin_root, max_entries={"no-such-map": 1})
    assert os.listdir(pin_root) == []


def test_pinned_map_errors_name_the_node_map_and_path(pin_root):
    missing = os.path.join(pin_root, "never-loaded")
    with pytest.raises(NodeNotLoaded) as exc:
        PinnedMaps(missing, node="n7").open("policy")
    assert isinstance(exc.value, DatapathError)
    assert (exc.value.pin_root, exc.value.node, exc.value.cli_name) == (missing, "n7", "policy")
    assert "n7" in str(exc.value) and missing in str(exc.value)

    maps = PinnedMaps(pin_root, node="n7")
    assert maps.require_loaded() == pin_root
    with pytest.raises(MapNotPinned) as nop:
        maps.entries("segment")
    assert isinstance(nop.value, DatapathError)
    assert (nop.value.cli_name, nop.value.node, nop.value.path) == ("segment", "n7",
                                                                    os.path.join(pin_root, "lace_segment"))
    with pytest.raises(KeyError):
        maps.open("no-such-map")

    # a directory where the pin should be: there, but not a map
    os.mkdir(os.path.join(pin_root, "lace_policy"))
    with pytest.raises(MapUnavailable) as bad:
        maps.capacity("policy")
    assert bad.value.cli_name == "policy" and bad.value.errno and bad.value.cause is not None
