"""A pod stopping through its grace period, the pure parts: the grace period the kubelet grants
(deletionGracePeriodSeconds over the spec's), how preStop hooks spend it before SIGTERM and
SIGKILL, probes during termination (readiness only), the lifecycle fields' validation, and the
service model's fallback to serving terminating endpoints (KEP-1669)."""

from __future__ import annotations

import pytest

from lace.lab.kubelet import MIN_STOP_WINDOW, GraceClock, deletion_grace, pre_stop_hooks
from lace.lab.probing import LIVENESS, READINESS, STARTUP, SUCCESS, PodProbes
from lace.services.model import frontends
from lace.store.errors import ValidationError
from lace.store.validation import validate

NET = {"default": 1}


def svc(name, ips, ports, **spec):
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "status": {"id": 10}, "spec": {"clusterIPs": ips, "ports": ports, **spec}}


def ep(addr, *, node="w1", ready=True, serving=None, terminating=None):
    cond = {"ready": ready}
    if serving is not None:
        cond["serving"] = serving
    if terminating is not None:
        cond["terminating"] = terminating
    return {"addresses": [addr], "conditions": cond, "nodeName": node,
            "targetRef": {"kind": "Pod", "namespace": "default", "name": addr}}


def eps(service, endpoints, ports):
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{service}-ipv4", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "endpoints": endpoints, "ports": ports}


def pod(meta=None, **spec):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default", "uid": "u1", **(meta or {})},
            "spec": {"containers": [{"name": "c", "image": "lace/podserver"}], **spec}}


# ---- the grace period and how it is spent ----------------------------------------------------

def test_the_deletes_grace_period_overrides_the_pods_and_is_at_least_one_second():
    assert deletion_grace(pod({"deletionGracePeriodSeconds": 4}, terminationGracePeriodSeconds=60)) == 4
    assert deletion_grace(pod(terminationGracePeriodSeconds=7)) == 7
    assert deletion_grace(pod()) == 30                                  # Kubernetes' default
    assert deletion_grace(pod({"deletionGracePeriodSeconds": 0})) == 1  # never less than 1 s
    assert deletion_grace(pod(terminationGracePeriodSeconds=0)) == 1
    assert deletion_grace(None) == 1                                    # removed, nothing known


def test_without_hooks_sigkill_comes_at_the_end_of_the_grace_period():
    clock = GraceClock(5, now=100.0)
    assert clock.signal(100.0) == 105.0 and clock.sigterm_at == 100.0


def test_hooks_spend_the_grace_period_in_whole_seconds_and_leave_at_least_two():
    clock = GraceClock(10, now=100.0)
    assert clock.hooks_until == 110.0                  # a hook may take the whole period
    assert clock.signal(103.7) == 103.7 + 7            # 3 whole seconds spent of 10: 7 left
    used_up = GraceClock(3, now=100.0)
    assert used_up.signal(103.0) == 103.0 + MIN_STOP_WINDOW == 105.0   # nothing left: still 2 s
    short = GraceClock(1, now=100.0)                   # a 1 s period (a force delete)
    assert short.signal(100.0) == 102.0


def test_a_later_delete_shortens_the_period_never_lengthens_it():
    clock = GraceClock(30, now=100.0)
    assert not clock.shorten(60, 101.0) and not clock.shorten(30, 101.0)
    assert clock.shorten(5, 102.0) and clock.seconds == 5 and clock.hooks_until == 107.0
    clock = GraceClock(30, now=100.0)
    clock.signal(100.0)
    assert clock.shorten(1, 110.0) and clock.kill_at == 110.0 + MIN_STOP_WINDOW
    assert not clock.shorten(1, 111.0) and clock.kill_at == 112.0


def test_pre_stop_hooks_of_every_container():
    p = pod()
    p["spec"]["containers"] = [{"name": "a", "lifecycle": {"preStop": {"sleep": {"seconds": 1}}}},
                               {"name": "b"}, {"name": "c", "lifecycle": {"postStart": {"sleep": {"seconds": 1}}}},
                               {"name": "d", "lifecycle": {"preStop": {"exec": {"command": ["true"]}}}}]
    assert [(c["name"], sorted(h)) for c, h in pre_stop_hooks(p)] == [("a", ["sleep"]), ("d", ["exec"])]
    assert pre_stop_hooks(None) == []


# ---- probes while a pod terminates -----------------------------------------------------------

def probed(**probes):
    c = {"name": "c", "image": "lace/podserver", "ports": [{"name": "http", "containerPort": 80}], **probes}
    return pod(containers=[c])


HTTP = {"httpGet": {"port": "http", "path": "/healthz"}}


def test_a_terminating_pod_is_probed_for_readiness_only():
    pp = PodProbes.of(probed(livenessProbe=HTTP, readinessProbe=HTTP), 0.0, "2030-01-01T00:00:00Z")
    c = pp.containers[0]
    assert pp.terminate(0.0) == []
    assert c.workers[LIVENESS].on_hold and c.workers[LIVENESS].result == SUCCESS
    assert [w.kind for _, w in pp.due(0.0)] == [READINESS]


def test_a_terminating_pod_not_yet_started_is_started_and_probed_for_readiness():
    pp = PodProbes.of(probed(startupProbe=HTTP, readinessProbe=HTTP), 0.0, "2030-01-01T00:00:00Z")
    c = pp.containers[0]
    assert not c.started and [w.kind for _, w in pp.due(0.0)] == [STARTUP]
    rescheduled = pp.terminate(1.0)   # the kubelet's quiet shutdown: the startup probe a success
    assert c.started and not c.ready and [w.kind for _, w in rescheduled] == [READINESS]
    assert [w.kind for _, w in pp.due(1.0)] == [READINESS]


# ---- the lifecycle fields --------------------------------------------------------------------

class NoLookup:
    def get_object(self, kind, name, namespace=None):
        return {"kind": kind, "metadata": {"name": name}}

    def list_objects(self, kind, namespace=None):
        return []


@pytest.mark.parametrize("lifecycle, grace, field, words", [
    ({"preStop": {}}, None, "spec.containers[0].lifecycle.preStop", "exec, httpGet, tcpSocket or sleep"),
    ({"preStop": {"exec": {"command": []}}}, None, "spec.containers[0].lifecycle.preStop.exec.command", "empty"),
    ({"preStop": {"sleep": {"seconds": 5}}}, 3, "spec.containers[0].lifecycle.preStop.sleep.seconds",
     "terminationGracePeriodSeconds (3)"),
    ({"preStop": {"sleep": {"seconds": "5"}}}, None, "spec.containers[0].lifecycle.preStop.sleep.seconds",
     "must be integer"),
    ({"preStop": {"sleep": {"seconds": 1}, "exec": {"command": ["true"]}}}, None,
     "spec.containers[0].lifecycle.preStop.sleep", "one handler"),
    ({"preStop": {"httpGet": {"port": 80, "path": "quit"}}}, None,
     "spec.containers[0].lifecycle.preStop.httpGet.path", 'write it as "/quit"'),
    ({"postStart": {"httpGet": {"port": 0}}}, None, "spec.containers[0].lifecycle.postStart.httpGet.port",
     "out of range"),
    ("sleep 5", None, "spec.containers[0].lifecycle", "must be object"),
    (None, -1, "spec.terminationGracePeriodSeconds", "negative"),
])
def test_bad_lifecycle_fields_are_named(lifecycle, grace, field, words):
    p = pod()
    if lifecycle is not None:
        p["spec"]["containers"][0]["lifecycle"] = lifecycle
    if grace is not None:
        p["spec"]["terminationGracePeriodSeconds"] = grace
    with pytest.raises(ValidationError) as info:
        validate(p, NoLookup())
    assert info.value.field == field and words in str(info.value), str(info.value)


def test_good_lifecycle_fields_pass_with_defaults_filled_in():
    p = pod(terminationGracePeriodSeconds=5)
    p["spec"]["containers"][0]["lifecycle"] = {"preStop": {"httpGet": {"port": 80}},
                                               "postStart": {"sleep": {"seconds": 5}}}
    out = validate(p, NoLookup())
    assert out["spec"]["containers"][0]["lifecycle"]["preStop"]["httpGet"] == {"port": 80, "path": "/",
                                                                               "scheme": "HTTP"}


# ---- services: the fallback to serving terminating endpoints ---------------------------------

PORTS = [{"name": "http", "port": 8080, "protocol": "TCP"}]


def http_front(endpoints, **spec):
    s = svc("web", ["10.96.0.10"], [{"name": "http", "port": 80}], **spec)
    (f,) = frontends([s], [eps("web", endpoints, PORTS)], NET, {}, "w1")
    return [str(b.addr) for b in f.active], [str(b.addr) for b in f.terminating]


def test_terminating_endpoints_keep_flows_while_a_ready_one_takes_new_ones():
    assert http_front([ep("10.244.1.5"), ep("10.244.2.7", ready=False, serving=True, terminating=True)]) == \
        (["10.244.1.5"], ["10.244.2.7"])


def test_with_no_ready_endpoint_the_serving_terminating_ones_take_new_flows():
    assert http_front([ep("10.244.2.7", ready=False, serving=True, terminating=True),
                       ep("10.244.2.8", ready=False, serving=False, terminating=True),
                       ep("10.244.2.9", ready=False)]) == (["10.244.2.7"], [])
    # nothing serving: nothing to fall back to (the frontend refuses new flows)
    assert http_front([ep("10.244.2.8", ready=False, serving=False, terminating=True)]) == ([], [])


def test_the_fallback_is_per_node_with_a_local_policy():
    endpoints = [ep("10.244.1.5", node="w2"), ep("10.244.2.7", node="w1", ready=False, serving=True, terminating=True)]
    assert http_front(endpoints) == (["10.244.1.5"], ["10.244.2.7"])
    assert http_front(endpoints, internalTrafficPolicy="Local") == (["10.244.2.7"], [])
