"""Incremental service passes: the service cache hands out each service's frontends once per
change, and the programmer's incremental pass leaves the maps exactly as a full pass would."""

from __future__ import annotations

import ipaddress
import random
import struct

from lace.datapath.services import BACKEND, MAGLEV_SIZE, SERVICE, SERVICE_KEY
from lace.services.cache import ServiceCache
from lace.services.program import ServiceProgrammer

from test_services_program import NET, ep, eps, svc

ADDR4 = ipaddress.ip_address("192.0.2.1")


def _rv(obj, rv):
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


def _service(i, rv, n_backends, node_port=None):
    ports = [{"name": "http", "port": 80, "protocol": "TCP"}]
    spec = {}
    if node_port:
        ports[0]["nodePort"] = node_port
        spec["type"] = "NodePort"
    s = _rv(svc(f"s{i}", [f"10.96.{i // 250}.{i % 250 + 1}"], ports, sid=i + 1, **spec), rv)
    sl = _rv(eps(f"s{i}", 4, [ep(f"10.244.{i % 200}.{j + 1}", pod=f"s{i}-{j}") for j in range(n_backends)],
                 [{"name": "http", "port": 8080, "protocol": "TCP"}]), rv)
    return s, sl


def _meaning(out, ids):
    """The maps' contents with backend IDs replaced by backend identities, so two programmers that
    handed out IDs in another order compare equal when they program the same thing."""
    services, backends, tables = out
    name = {}
    for k, v in backends.items():
        b = BACKEND.unpack(v)
        addr = ipaddress.ip_address(bytes(b["addr"][:4]) if b["family"] == 4 else bytes(b["addr"]))
        name[struct.unpack("<I", k)[0]] = (f'{b["network"]}/{addr}/{b["port"]}/{b["proto"]}', b["flags"])
    front, table_of = {}, {}
    for k, v in services.items():
        key, val = SERVICE_KEY.unpack(k), SERVICE.unpack(v)
        ident = (key["network"], bytes(key["addr"]), key["port"], key["proto"], key["slot"])
        val["backend_id"] = name.get(val["backend_id"]) if val["backend_id"] else None
        table_of[ident] = val.pop("maglev")
        front[ident] = tuple(sorted(val.items()))
    content = {}
    for ident, t in table_of.items():
        if t:
            blob = tables[struct.pack("<I", t)]
            content[ident] = tuple(name[x][0] for x in struct.unpack(f"<{MAGLEV_SIZE}I", blob))
    return front, sorted(name.values()), content


def test_cache_hands_out_the_same_frontends_until_something_changes():
    cache = ServiceCache("w1")
    s0, sl0 = _service(0, 10, 2)
    s1, sl1 = _service(1, 11, 1)
    cache.load([s0, s1], [sl0, sl1])
    cache.set_context(NET, {}, ADDR4, None)
    first = cache.frontends_of({"default/s0", "default/s1"})
    again = cache.frontends_of({"default/s0", "default/s1"})
    assert all(a is b for a, b in zip(first["default/s0"], again["default/s0"]))
    # a slice event names its service, and only that one is worked out again
    sl0b = _rv(eps("s0", 4, [ep("10.244.0.9", pod="x")], [{"name": "http", "port": 8080, "protocol": "TCP"}]), 12)
    assert cache.apply("MODIFIED", sl0b) == {"default/s0"}
    now = cache.frontends_of({"default/s0", "default/s1"})
    assert [str(b.addr) for b in now["default/s0"][0].active] == ["10.244.0.9"]
    assert now["default/s1"][0] is first["default/s1"][0]
    # a replayed older event changes nothing; a deletion empties the service
    cache.apply("MODIFIED", sl0)
    assert [str(b.addr) for b in cache.frontends_of({"default/s0"})["default/s0"][0].active] == ["10.244.0.9"]
    assert cache.apply("DELETED", _rv(s1, 13)) == {"default/s1"}
    assert cache.frontends_of({"default/s1"}) == {"default/s1": []}
    # a new context (node address) works every frontend out again
    cache.set_context(NET, {}, ipaddress.ip_address("192.0.2.2"), None)
    assert cache.frontends_of({"default/s0"})["default/s0"][0] is not now["default/s0"][0]


def test_incremental_passes_program_what_a_full_pass_would():
    rnd = random.Random(7)
    cache = ServiceCache("w1")
    objs = {i: _service(i, 1, rnd.randint(0, 4), node_port=30000 + i if i % 5 == 0 else None) for i in range(40)}
    cache.load([s for s, _ in objs.values()], [sl for _, sl in objs.values()])
    cache.set_context(NET, {}, ADDR4, None)
    p = ServiceProgrammer()
    kernel = [dict(x) for x in p.entries(cache.frontends())]
    revnat = p.revnat_entries()
    rv = 2
    for _ in range(60):
        keys = set()
        for i in rnd.sample(range(50), rnd.randint(1, 4)):
            rv += 1
            s, sl = _service(i, rv, rnd.randint(0, 4))
            if i in objs and rnd.random() < 0.25:
                keys |= cache.apply("DELETED", s) | cache.apply("DELETED", sl)
                objs.pop(i)
            else:
                keys |= cache.apply("ADDED", s) | cache.apply("ADDED", sl)
                objs[i] = (s, sl)
        changes = p.update(cache.frontends_of(keys))
        assert changes is not None
        for m, (name, (updates, deletes)) in zip([*kernel, revnat], changes.items()):
            m.update(updates)
            for k in deletes:
                del m[k]
        # revnat: what the programmer wants (retired frontends included: a fresh pass has none)
        assert revnat == p.revnat_entries()
        # what the maps now hold is what the programmer wants, and what a fresh full pass wants
        assert tuple(kernel) == p._out
        fresh = ServiceProgrammer()
        assert _meaning(kernel, None) == _meaning(fresh.entries(cache.frontends()), None)
        # and a full pass of this programmer finds nothing to change
        assert p.entries(cache.frontends()) == tuple(kernel)


def test_incremental_pass_defers_to_a_full_one_when_the_map_would_overflow():
    cache = ServiceCache("w1")
    s0, sl0 = _service(0, 1, 2)
    cache.load([s0], [sl0])
    cache.set_context(NET, {}, ADDR4, None)
    p = ServiceProgrammer(capacity=4)
    p.entries(cache.frontends())
    s1, sl1 = _service(1, 2, 2)
    keys = cache.apply("ADDED", s1) | cache.apply("ADDED", sl1)
    before = tuple(dict(x) for x in p._out)
    assert p.update(cache.frontends_of(keys)) is None
    assert p._out == before                                    # nothing half done
    p.entries(cache.frontends())
    assert p.pressure.reason == "services map full"
    assert p.update(cache.frontends_of(keys)) is None          # under pressure: full passes only


def test_a_frontend_without_a_table_gets_one_when_one_is_free():
    cache = ServiceCache("w1")
    objs = [_service(i, 1, 2) for i in range(2)]
    cache.load([s for s, _ in objs], [sl for _, sl in objs])
    cache.set_context(NET, {}, ADDR4, None)
    p = ServiceProgrammer(maglev_entries=MAGLEV_SIZE * 2)   # one usable table
    services, _, tables = p.entries(cache.frontends())
    assert len(tables) == 1 and p.pressure.without_table == 1
    keys = cache.apply("DELETED", _rv(objs[0][0], 2)) | cache.apply("DELETED", _rv(objs[0][1], 2))
    assert keys == {"default/s0"}
    services, _, tables = p.entries(cache.frontends())
    assert len(tables) == 1 and p.pressure.without_table == 0 and p.pressure.reason is None
    head = [SERVICE.unpack(v) for k, v in services.items() if SERVICE_KEY.unpack(k)["slot"] == 0]
    assert [h["maglev"] for h in head] == [struct.unpack("<I", next(iter(tables)))[0]]


def test_a_scratch_copy_changes_nothing_of_the_programmer_it_copies():
    cache = ServiceCache("w1")
    objs = [_service(i, 1, 2) for i in range(3)]
    cache.load([s for s, _ in objs], [sl for _, sl in objs])
    cache.set_context(NET, {}, ADDR4, None)
    p = ServiceProgrammer()
    p.entries(cache.frontends())
    out, pressure = tuple(dict(x) for x in p._out), p.pressure.as_dict()
    cache.apply("DELETED", _rv(objs[0][0], 2))
    s3, sl3 = _service(3, 3, 4)
    cache.apply("ADDED", s3)
    cache.apply("ADDED", sl3)
    audit = p.scratch()
    audit.entries(cache.frontends())                        # what an audit computes
    assert p._out == out and p.pressure.as_dict() == pressure
    assert len(audit._memo) == 3 and len(p._memo) == 3


def _backend_ids(p):
    return sorted(struct.unpack("<I", k)[0] for k in p._out[1])


def test_a_frontend_waiting_for_a_table_keeps_its_backend_ids_pass_after_pass():
    cache = ServiceCache("w1")
    objs = [_service(i, 1, 2) for i in range(3)]
    cache.load([s for s, _ in objs], [sl for _, sl in objs])
    cache.set_context(NET, {}, ADDR4, None)
    p = ServiceProgrammer(maglev_entries=MAGLEV_SIZE * 2)   # one usable table for three services
    p.entries(cache.frontends())
    ids = _backend_ids(p)
    for _ in range(3):   # full passes with nothing changed: nothing renumbered, nothing rewritten
        assert p.entries(cache.frontends()) == tuple(p._out) and _backend_ids(p) == ids
    assert p.pressure.without_table == 2


def test_an_incremental_pass_declines_when_the_tables_it_needs_are_not_free():
    cache = ServiceCache("w1")
    s0, sl0 = _service(0, 1, 2)
    cache.load([s0], [sl0])
    cache.set_context(NET, {}, ADDR4, None)
    p = ServiceProgrammer(maglev_entries=MAGLEV_SIZE * 2)   # one usable table, taken by s0
    p.entries(cache.frontends())
    s1, sl1 = _service(1, 2, 2)
    keys = cache.apply("ADDED", s1) | cache.apply("ADDED", sl1)
    before = tuple(dict(x) for x in p._out)
    assert p.update(cache.frontends_of(keys)) is None and p._out == before


def test_two_frontends_claiming_one_key_leave_it_to_the_other_when_one_goes():
    import dataclasses

    cache = ServiceCache("w1")
    s0, sl0 = _service(0, 1, 1)
    cache.load([s0], [sl0])
    cache.set_context(NET, {}, ADDR4, None)
    (a,) = cache.frontends()
    b = dataclasses.replace(a, service="other/dup", service_id=99)   # the same VIP, port and network
    p = ServiceProgrammer()
    p.entries([a, b])
    p.entries([a])
    head = [SERVICE.unpack(v) for k, v in p._out[0].items() if SERVICE_KEY.unpack(k)["slot"] == 0]
    assert [h["service_id"] for h in head] == [a.service_id]


def test_cache_keeps_records_and_follows_a_slice_moved_to_another_service():
    """The cache holds records, never the stored objects, and a slice whose service-name label
    changes leaves its old service and joins its new one (both are worked out again)."""
    cache = ServiceCache("w1")
    s0, sl = _service(0, 10, 2)
    s1, _ = _service(1, 11, 0)
    cache.load([s0, s1], [sl])
    cache.set_context(NET, {}, ADDR4, None)
    assert [len(f[0].active) for f in cache.frontends_of({"default/s0", "default/s1"}).values()] in ([2, 0], [0, 2])
    moved = _rv(eps("s1", 4, sl["endpoints"], sl["ports"], name=sl["metadata"]["name"]), 12)
    assert cache.apply("MODIFIED", moved) == {"default/s0", "default/s1"}
    now = cache.frontends_of({"default/s0", "default/s1"})
    assert now["default/s0"][0].active == ()
    assert [str(b.addr) for b in now["default/s1"][0].active] == ["10.244.0.1", "10.244.0.2"]
    kept = [o for kind in cache._objects.objects.values() for o in kind.values()]
    assert kept and not any(isinstance(o, dict) for o in kept)
