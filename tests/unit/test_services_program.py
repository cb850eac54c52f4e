"""Service frontends from Service + EndpointSlice objects, and the service programmer's entries."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from lace.datapath.common import Proto
from lace.datapath.services import (BACKEND, MAGLEV_SIZE, SERVICE, SERVICE_KEY, BackendFlag, ServiceFlag,
                                    revnat_key, service_key)
from lace.services.model import frontends, imports_by_service
from lace.services.program import ServiceProgrammer, table_key

NET = {"default": 1, "red": 7}


def svc(name, ips, ports, *, ns="default", sid=10, network=None, **spec):
    meta = {"name": name, "namespace": ns}
    if network:
        meta["annotations"] = {"lace.dev/network": network}
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "status": {"id": sid},
            "spec": {"clusterIPs": ips, "ports": ports, **spec}}


def ep(addr, *, node="w1", pod="p", ready=True, serving=None, terminating=None):
    cond = {"ready": ready}
    if serving is not None:
        cond["serving"] = serving
    if terminating is not None:
        cond["terminating"] = terminating
    return {"addresses": [addr], "conditions": cond, "nodeName": node,
            "targetRef": {"kind": "Pod", "namespace": "default", "name": pod}}


def eps(service, family, endpoints, ports, ns="default", name=None):
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name or f"{service}-{family}", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4" if family == 4 else "IPv6", "endpoints": endpoints, "ports": ports}


def test_frontends_dual_stack_named_ports_and_conditions():
    s = svc("web", ["10.96.0.10", "fd00:10:96::10"],
            [{"name": "http", "port": 80, "targetPort": "web"}, {"name": "dns", "port": 53, "protocol": "UDP"}])
    slices = [
        eps("web", 4, [ep("10.244.1.5", pod="a"), ep("10.244.2.6", pod="b", ready=False),
                       ep("10.244.2.7", pod="c", ready=False, serving=True, terminating=True),
                       ep("10.244.2.8", pod="d", ready=False, serving=False, terminating=True)],
            [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
        eps("web", 6, [ep("fd00:10:244::5", pod="a")], [{"name": "http", "port": 8080}]),
        eps("other", 4, [ep("10.244.9.9")], [{"name": "http", "port": 1}]),
    ]
    fronts = {(str(f.addr), f.port, f.proto): f for f in frontends([s], slices, NET, {}, "w1")}
    assert set(fronts) == {("10.96.0.10", 80, Proto.TCP), ("10.96.0.10", 53, Proto.UDP),
                           ("fd00:10:96::10", 80, Proto.TCP), ("fd00:10:96::10", 53, Proto.UDP)}
    http4 = fronts[("10.96.0.10", 80, Proto.TCP)]
    assert [(str(b.addr), b.port) for b in http4.active] == [("10.244.1.5", 8080)]
    assert [(str(b.addr), b.port, b.pod) for b in http4.terminating] == [("10.244.2.7", 8080, "default/c")]
    assert http4.networks == (1,) and http4.service_id == 10 and http4.flags == 0
    assert [b.port for b in fronts[("10.96.0.10", 53, Proto.UDP)].active] == [5353]
    assert [str(b.addr) for b in fronts[("fd00:10:96::10", 80, Proto.TCP)].active] == ["fd00:10:244::5"]
    assert fronts[("fd00:10:96::10", 53, Proto.UDP)].active == ()   # the v6 slice has no dns port


def test_frontends_affinity_local_imports_headless_and_unnumbered():
    local = svc("dns", ["10.96.0.10"], [{"port": 53, "protocol": "UDP"}], ns="kube-system", sid=3,
                sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}},
                internalTrafficPolicy="Local")
    headless = svc("db", ["None"], [{"port": 5432}], sid=4)
    unnumbered = svc("new", ["10.96.0.11"], [{"port": 80}])
    del unnumbered["status"]
    red = svc("web", ["10.96.0.10"], [{"port": 80}], sid=5, network="red")
    slices = [eps("dns", 4, [ep("10.244.1.2", node="w1"), ep("10.244.2.2", node="w2")],
                  [{"port": 53, "protocol": "UDP"}], ns="kube-system")]
    networks = [{"metadata": {"name": "red"}, "spec": {"importServices": ["kube-system/dns"]}}]
    fronts = frontends([local, headless, unnumbered, red], slices, NET, imports_by_service(networks, NET), "w1")
    by_sid = {f.service_id: f for f in fronts}
    assert set(by_sid) == {3, 5}
    dns = by_sid[3]
    assert dns.networks == (1, 7)
    assert dns.flags == ServiceFlag.AFFINITY | ServiceFlag.LOCAL and dns.affinity_timeout == 60
    assert [str(b.addr) for b in dns.active] == ["10.244.1.2"]   # Local: this node's endpoints only
    assert by_sid[5].networks == (7,)


def _decode(services):
    out = {}
    for k, v in services.items():
        key, val = SERVICE_KEY.unpack(k), SERVICE.unpack(v)
        out[(key["network"], bytes(key["addr"][:4]), key["port"], key["slot"])] = val
    return out


def _fronts(n_backends, *, sid=10, vip="10.96.0.10", networks=(1,)):
    s = svc("web", [vip], [{"port": 80}], sid=sid)
    slices = [eps("web", 4, [ep(f"10.244.1.{i + 1}", pod=f"p{i}") for i in range(n_backends)], [{"port": 8080}])]
    fs = frontends([s], slices, NET, {}, "w1")
    return [f.__class__(**{**f.__dict__, "networks": networks}) for f in fs]


def test_programmer_slots_backends_and_maglev_table():
    p = ServiceProgrammer()
    services, backends, tables = p.entries(_fronts(3, networks=(1, 7)))
    dec = _decode(services)
    vip = ipaddress.ip_address("10.96.0.10").packed
    for net in (1, 7):
        head = dec[(net, vip, 80, 0)]
        assert head["service_id"] == 10 and head["backend_count"] == 3 and head["active_count"] == 3
        assert head["maglev"] >= 1
        slots = [dec[(net, vip, 80, i)]["backend_id"] for i in (1, 2, 3)]
        assert sorted(slots) == sorted(struct.unpack("<I", k)[0] for k in backends)
    assert len(backends) == 3
    for v in backends.values():
        b = BACKEND.unpack(v)
        assert b["port"] == 8080 and b["network"] == 1 and b["flags"] == BackendFlag.ACTIVE
    (tkey, blob), = tables.items()
    assert tkey == table_key(head["maglev"]) and len(blob) == 4 * MAGLEV_SIZE
    ids = set(struct.unpack(f"<{MAGLEV_SIZE}I", blob))
    assert ids == {struct.unpack("<I", k)[0] for k in backends}   # every backend owns a share


def test_programmer_single_backend_has_no_table_and_ids_are_stable():
    p = ServiceProgrammer()
    services, backends, tables = p.entries(_fronts(1))
    assert tables == {} and _decode(services)[(1, bytes([10, 96, 0, 10]), 80, 0)]["maglev"] == 0
    again = p.entries(_fronts(1))
    assert again == (services, backends, tables)


def test_programmer_backend_change_gets_a_new_table_and_keeps_ids():
    p = ServiceProgrammer()
    _, b3, t3 = p.entries(_fronts(3))
    _, b4, t4 = p.entries(_fronts(4))
    assert set(b3) < set(b4)                           # the three keep their IDs
    assert set(t3).isdisjoint(t4)                      # a new table number: made before broken
    _, _, t4b = p.entries(_fronts(4))
    assert t4b == t4


def test_programmer_adopts_what_a_previous_agent_wrote(monkeypatch):
    first = ServiceProgrammer()
    services, backends, tables = first.entries(_fronts(3))
    second = ServiceProgrammer()
    second.adopt(services, backends)
    assert second.entries(_fronts(3)) == (services, backends, tables)
    # with the tables read back too, a restart computes no Maglev table again
    third = ServiceProgrammer()
    third.adopt(services, backends, tables)
    monkeypatch.setattr("lace.services.program.maglev_table", lambda *a: pytest.fail("table recomputed"))
    assert third.entries(_fronts(3)) == (services, backends, tables)


def test_unchanged_frontends_are_not_rebuilt(monkeypatch):
    p = ServiceProgrammer()
    first = p.entries(_fronts(3))
    monkeypatch.setattr(p, "_build", lambda f: pytest.fail(f"{f.service} rebuilt"))
    assert p.entries(_fronts(3)) == first


def test_programmer_pressure_when_maps_are_full():
    p = ServiceProgrammer(capacity=5, maglev_entries=MAGLEV_SIZE * 1)   # no usable table
    services, _, tables = p.entries(_fronts(3) + _fronts(2, sid=11, vip="10.96.0.11"))
    assert len(services) == 4 and tables == {}
    pr = p.pressure
    assert pr.programmed == 1 and pr.frontends == 2 and pr.reason == "services map full"
    assert pr.left_out == ["default/web:80"]
    assert pr.without_table == 1


# -- revnat: the frontends each backend's replies leave from -----------------------------------------

def _revnat(entries):
    """revnat entries as {(backend network, backend, port): [(network, frontend, port), ...]}."""
    from lace.datapath import registry
    mdef = registry.get("revnat")
    out = {}
    for k, v in entries.items():
        key = mdef.key_dict(k)
        out[(key["network"], key["backend"], key["port"])] = [
            (f["network"], f["addr"], f["port"]) for f in mdef.value_dict(v, k)["frontends"]]
    return out


def test_revnat_names_every_frontend_of_each_backend_in_each_network():
    p = ServiceProgrammer()
    web = _fronts(2, networks=(1, 7))                       # offered to network 7 too
    dns = _fronts(1, sid=11, vip="10.96.0.53")              # another service, the same pod port
    p.entries(web + dns)
    assert {k: sorted(v) for k, v in _revnat(p.revnat_entries()).items()} == {
        (1, "10.244.1.1", 8080): [(1, "10.96.0.10", 80), (1, "10.96.0.53", 80), (7, "10.96.0.10", 80)],
        (1, "10.244.1.2", 8080): [(1, "10.96.0.10", 80), (7, "10.96.0.10", 80)],
    }


def test_revnat_keeps_a_removed_frontend_until_conntrack_no_longer_names_it():
    """A backend taken out of a service keeps its frontend in its revnat entry (its established
    flows' replies need it) until release_revnat sees no live flow through it."""
    p = ServiceProgrammer()
    p.entries(_fronts(2))
    assert not p.revnat_retired, "nothing retired: the agent's resync reads no conntrack for it"
    changes = p.update({"default/web": _fronts(1)})        # 10.244.1.2 leaves the service
    assert changes is not None and changes["revnat"] == ({}, []), "nothing written: the frontend is retired"
    assert p.revnat_retired
    backend2, key2 = (1, "10.244.1.2", 8080), revnat_key(1, "10.244.1.2", 8080, Proto.TCP)
    assert _revnat(p.revnat_entries())[backend2] == [(1, "10.96.0.10", 80)]
    # a live flow still goes there: it stays
    assert p.release_revnat({(key2, (1, "10.96.0.10", 80))}) == ({}, [])
    assert backend2 in _revnat(p.revnat_entries())
    # no flow any more: it goes; the backend still in the service keeps its frontend
    assert p.release_revnat(set()) == ({}, [key2])
    assert not p.revnat_retired
    assert list(_revnat(p.revnat_entries())) == [(1, "10.244.1.1", 8080)]
    # the audit's scratch copy agrees with what was written
    assert p.scratch().revnat_entries() == p.revnat_entries()


def test_revnat_adopted_after_a_restart_is_retired_not_deleted():
    first = ServiceProgrammer()
    first.entries(_fronts(2))
    kernel = first.revnat_entries()
    second = ServiceProgrammer()
    second.adopt({}, {}, {}, kernel)
    second.entries(_fronts(1))                              # 10.244.1.2 went while no agent ran
    assert second.revnat_entries() == kernel, "both backends keep their frontend until conntrack says"
    second.release_revnat(set())
    assert list(_revnat(second.revnat_entries())) == [(1, "10.244.1.1", 8080)]


def test_revnat_holds_at_most_its_capacity_and_counts_the_rest():
    from lace.datapath.services import REVNAT_FRONTENDS
    p = ServiceProgrammer()
    fronts = [f for i in range(REVNAT_FRONTENDS + 2) for f in _fronts(1, sid=20 + i, vip=f"10.96.1.{i + 1}")]
    p.entries(fronts)
    (only,) = _revnat(p.revnat_entries()).values()
    assert len(only) == REVNAT_FRONTENDS
    assert p.pressure is not None and p.pressure.revnat_left_out == 2
    assert p.pressure.as_dict()["revnatLeftOut"] == 2


def test_a_full_revnat_entry_keeps_its_frontends_when_another_comes():
    """A backend's entry full, a new frontend that sorts before all of them is left out (and
    counted): none of those already there, whose flows' replies need them, is pushed out."""
    from lace.datapath.services import REVNAT_FRONTENDS
    p = ServiceProgrammer()
    fronts = [f for i in range(REVNAT_FRONTENDS) for f in _fronts(1, sid=30 + i, vip=f"10.96.2.{i + 10}")]
    p.entries(fronts)
    (before,) = _revnat(p.revnat_entries()).values()
    early = _fronts(1, sid=29, vip="10.96.2.1")             # sorts first of all
    p.entries(fronts + early)
    (after,) = _revnat(p.revnat_entries()).values()
    assert after == before and (1, "10.96.2.1", 80) not in after
    assert p.pressure is not None and p.pressure.revnat_left_out == 1
    # one of the eight goes (and its flows with it): the newcomer gets the free slot
    p.entries(fronts[1:] + early)
    assert p.release_revnat(set()) is not None
    (last,) = _revnat(p.revnat_entries()).values()
    assert (1, "10.96.2.1", 80) in last and (1, "10.96.2.10", 80) not in last


def _udp_fronts(endpoints, *, vip="10.96.0.10"):
    s = svc("dns", [vip], [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "tcp", "port": 53}])
    slices = [eps("dns", 4, endpoints, [{"name": "dns", "port": 5353, "protocol": "UDP"},
                                        {"name": "tcp", "port": 5353}])]
    return frontends([s], slices, NET, {}, "w1")


def test_a_udp_backend_that_leaves_its_service_is_handed_out_once_for_its_flows_to_go():
    """UDP flows have no end to see: a backend taken out of a UDP frontend is handed out (once) so
    the agent deletes its flows; a terminating one keeps them; a TCP frontend's backend is not."""
    p = ServiceProgrammer()
    a, b = ep("10.244.1.1", pod="a"), ep("10.244.1.2", pod="b")
    p.entries(_udp_fronts([a, b]))
    assert p.take_departed() == []
    # b terminating: still the service's, its flows go on
    p.update({"default/dns": _udp_fronts([a, ep("10.244.1.2", pod="b", ready=False, serving=True,
                                                terminating=True)])})
    assert p.take_departed() == []
    # b gone: its UDP flows through the frontend are to go, and only once
    p.update({"default/dns": _udp_fronts([a])})
    assert p.take_departed() == [(revnat_key(1, "10.244.1.2", 5353, Proto.UDP), (1, "10.96.0.10", 53))]
    assert p.take_departed() == []
    # back, and gone again: handed out again
    p.update({"default/dns": _udp_fronts([a, b])})
    p.update({"default/dns": _udp_fronts([a])})
    assert [k for k, _ in p.take_departed()] == [revnat_key(1, "10.244.1.2", 5353, Proto.UDP)]
    # the same through a full pass
    p.entries(_udp_fronts([b]))
    assert p.take_departed() == [(revnat_key(1, "10.244.1.1", 5353, Proto.UDP), (1, "10.96.0.10", 53))]


def _flags(p):
    """Each backend's flags in the programmer's backends entries, by address."""
    out = {}
    for v in p._out[1].values():
        b = BACKEND.unpack(v)
        out[str(ipaddress.ip_address(b["addr"][:4]))] = b["flags"]
    return out


def test_a_backend_behind_more_frontends_than_a_revnat_entry_names_is_flagged_reply_entry():
    """Nine frontends on one backend port: the revnat entry names eight, the backend is flagged
    REPLY_ENTRY (its new flows keep a backend entry); back to eight, the flag goes and the ninth,
    still in use, takes the free slot — in a full pass and an incremental one alike."""
    from lace.datapath.services import REVNAT_FRONTENDS
    p = ServiceProgrammer()
    fronts = [f for i in range(REVNAT_FRONTENDS + 1) for f in _fronts(1, sid=40 + i, vip=f"10.96.4.{i + 1}")]
    _, backends, _ = p.entries(fronts[:REVNAT_FRONTENDS])
    assert _flags(p) == {"10.244.1.1": BackendFlag.ACTIVE}
    assert p.pressure.reply_entry_backends == 0
    _, backends, _ = p.entries(fronts)
    assert _flags(p) == {"10.244.1.1": BackendFlag.ACTIVE | BackendFlag.REPLY_ENTRY}
    assert BACKEND.unpack(next(iter(backends.values())))["flags"] & BackendFlag.REPLY_ENTRY
    assert p.pressure.reply_entry_backends == 1 and p.pressure.as_dict()["replyEntryBackends"] == 1
    # an incremental pass that replaces them all by another: the nine are retired (their flows
    # may live on) and still count, so the flag stays and nothing is rewritten
    more = _fronts(1, sid=60, vip="10.96.4.60")
    changes = p.update({more[0].service: more})
    assert changes is not None and not changes["backends"][0], "the flag was already there"
    assert _flags(p)["10.244.1.1"] & BackendFlag.REPLY_ENTRY
    p.update({more[0].service: []})
    # the first frontend goes (and its flows): nine are left, still flagged; then one more goes
    p.entries(fronts[1:])
    p.release_revnat(set())
    p.entries(fronts[2:])
    p.release_revnat(set())
    p.entries(fronts[2:])
    assert _flags(p) == {"10.244.1.1": BackendFlag.ACTIVE}
    (names,) = _revnat(p.revnat_entries()).values()
    assert len(names) == REVNAT_FRONTENDS - 1 and (1, "10.96.4.9", 80) in names
    assert p.pressure.reply_entry_backends == 0


def test_a_backend_the_revnat_map_has_no_room_for_is_flagged_reply_entry():
    p = ServiceProgrammer(revnat_entries=1)
    p.entries(_fronts(2))
    assert len(p.revnat_entries()) == 1
    flags = _flags(p)
    assert sorted(bool(f & BackendFlag.REPLY_ENTRY) for f in flags.values()) == [False, True]
    assert p.pressure.reply_entry_backends == 1
