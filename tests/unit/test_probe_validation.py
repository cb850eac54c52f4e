"""Pod probes on write: checked as Kubernetes checks them, rejected with one line naming the field and
the fix, stored with Kubernetes' defaults; status.probeIPs checked like podIPs."""

from __future__ import annotations

import copy

import pytest

from lace.store import SqliteStore, ValidationError
from lace.store.validation import validate

from test_validation import DictLookup


def probe_pod(*, ports=None, status=None, **probes):
    container = {"name": "c", "image": "lace/podserver", "ports": ports or [{"name": "http", "containerPort": 80}]}
    container.update(probes)
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"containers": [container]}}
    if status is not None:
        obj["status"] = status
    return obj


C = "spec.containers[0]"


@pytest.mark.parametrize("probes, field, words", [
    ({"livenessProbe": {}}, f"{C}.livenessProbe", "no handler"),
    ({"livenessProbe": {"periodSeconds": 5}}, f"{C}.livenessProbe", "exactly one of httpGet, tcpSocket, exec"),
    ({"readinessProbe": {"httpGet": {"port": 80}, "tcpSocket": {"port": 80}}}, f"{C}.readinessProbe.tcpSocket",
     "httpGet and tcpSocket"),
    ({"livenessProbe": {"httpGet": {"port": 0}}}, f"{C}.livenessProbe.httpGet.port", "1 to 65535"),
    ({"livenessProbe": {"httpGet": {"port": 65536}}}, f"{C}.livenessProbe.httpGet.port", "out of range"),
    ({"readinessProbe": {"tcpSocket": {"port": "Not_A_Name"}}}, f"{C}.readinessProbe.tcpSocket.port",
     "not a valid port name"),
    ({"readinessProbe": {"tcpSocket": {"port": "a-name-that-is-too-long"}}}, f"{C}.readinessProbe.tcpSocket.port",
     "at most 15"),
    ({"readinessProbe": {"httpGet": {"path": "/"}}}, f"{C}.readinessProbe.httpGet.port", "add port"),
    ({"readinessProbe": {"httpGet": {"port": 80.5}}}, f"{C}.readinessProbe.httpGet.port", "integer or string"),
    ({"livenessProbe": {"httpGet": {"port": "http", "path": "healthz"}}}, f"{C}.livenessProbe.httpGet.path",
     'write it as "/healthz"'),
    ({"livenessProbe": {"httpGet": {"port": 80, "scheme": "ftp"}}}, f"{C}.livenessProbe.httpGet.scheme",
     "use HTTP or HTTPS"),
    ({"livenessProbe": {"httpGet": {"port": 80, "host": "no spaces"}}}, f"{C}.livenessProbe.httpGet.host",
     "neither an IP address nor a host name"),
    ({"livenessProbe": {"httpGet": {"port": 80, "httpHeaders": [{"name": "X Probe", "value": "1"}]}}},
     f"{C}.livenessProbe.httpGet.httpHeaders[0].name", "not an HTTP header name"),
    ({"livenessProbe": {"httpGet": {"port": 80, "httpHeaders": [{"name": "X-Probe", "value": "a\r\nb: c"}]}}},
     f"{C}.livenessProbe.httpGet.httpHeaders[0].value", "line breaks"),
    ({"livenessProbe": {"httpGet": {"port": 80, "httpHeaders": [{"name": "X-Probe"}]}}},
     f"{C}.livenessProbe.httpGet.httpHeaders[0].value", "add value"),
    ({"startupProbe": {"exec": {"command": []}}}, f"{C}.startupProbe.exec.command", "[cat, /tmp/healthy]"),
    ({"startupProbe": {"exec": {}}}, f"{C}.startupProbe.exec.command", "required"),
    ({"readinessProbe": {"grpc": {"port": "grpc"}}}, f"{C}.readinessProbe.grpc.port", "must be integer"),
    ({"readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 0}}, f"{C}.readinessProbe.periodSeconds",
     "default 10"),
    ({"readinessProbe": {"tcpSocket": {"port": 80}, "timeoutSeconds": 0}}, f"{C}.readinessProbe.timeoutSeconds",
     "default 1"),
    ({"readinessProbe": {"tcpSocket": {"port": 80}, "failureThreshold": -2}},
     f"{C}.readinessProbe.failureThreshold", "default 3"),
    ({"readinessProbe": {"tcpSocket": {"port": 80}, "successThreshold": 0}},
     f"{C}.readinessProbe.successThreshold", "below 1"),
    ({"readinessProbe": {"tcpSocket": {"port": 80}, "initialDelaySeconds": -1}},
     f"{C}.readinessProbe.initialDelaySeconds", "0 or more"),
    ({"readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": "10"}}, f"{C}.readinessProbe.periodSeconds",
     "must be integer"),
    ({"livenessProbe": {"tcpSocket": {"port": 80}, "successThreshold": 2}}, f"{C}.livenessProbe.successThreshold",
     "must be 1 for a livenessProbe"),
    ({"startupProbe": {"tcpSocket": {"port": 80}, "successThreshold": 3}}, f"{C}.startupProbe.successThreshold",
     "must be 1 for a startupProbe"),
    ({"readinessProbe": {"tcpSocket": {"port": 80}, "terminationGracePeriodSeconds": 5}},
     f"{C}.readinessProbe.terminationGracePeriodSeconds", "does not restart"),
    ({"livenessProbe": {"tcpSocket": {"port": 80}, "terminationGracePeriodSeconds": 0}},
     f"{C}.livenessProbe.terminationGracePeriodSeconds", "below 1"),
    ({"livenessProbe": "tcp 80"}, f"{C}.livenessProbe", "must be object"),
])
def test_rejects(probes, field, words):
    with pytest.raises(ValidationError) as info:
        validate(probe_pod(**probes), DictLookup())
    err = info.value
    assert err.field == field, str(err)
    assert words in str(err), str(err)
    assert str(err).startswith(f'Pod "default/web" is invalid: {field}: ')
    assert "\n" not in str(err) and "Traceback" not in str(err)


def test_accepts_kubernetes_probes_and_fills_kubernetes_defaults():
    out = validate(probe_pod(
        startupProbe={"exec": {"command": ["cat", "/tmp/started"]}, "failureThreshold": 30, "periodSeconds": 1},
        livenessProbe={"tcpSocket": {"port": "http"}, "initialDelaySeconds": 0, "terminationGracePeriodSeconds": 2},
        readinessProbe={"httpGet": {"port": "8080", "host": "10.244.0.9",
                                    "httpHeaders": [{"name": "X-Probe", "value": "lace"}]},
                        "successThreshold": 2}), DictLookup())
    c = out["spec"]["containers"][0]
    assert c["readinessProbe"] == {"httpGet": {"port": 8080, "host": "10.244.0.9", "path": "/", "scheme": "HTTP",
                                               "httpHeaders": [{"name": "X-Probe", "value": "lace"}]},
                                   "successThreshold": 2, "periodSeconds": 10, "timeoutSeconds": 1,
                                   "failureThreshold": 3}
    assert c["startupProbe"]["failureThreshold"] == 30 and c["startupProbe"]["periodSeconds"] == 1
    assert c["livenessProbe"]["tcpSocket"] == {"port": "http"}
    # normalising twice changes nothing (the store validates stored objects again on status writes)
    assert validate(copy.deepcopy(out), DictLookup()) == out


@pytest.mark.parametrize("probe", [
    {"httpGet": {"port": 443, "scheme": "HTTPS", "path": "/healthz?full=1"}},
    {"httpGet": {"port": "http", "host": "fd00:10:244::5"}},
    {"tcpSocket": {"port": 80, "host": "db.example"}},
    {"grpc": {"port": 9090, "service": "health"}},
    {"exec": {"command": ["true"]}},
])
def test_accepts_each_handler(probe):
    validate(probe_pod(readinessProbe=probe, livenessProbe=copy.deepcopy(probe)), DictLookup())


def test_status_probe_ips_are_addresses():
    validate(probe_pod(status={"podIPs": [{"ip": "10.10.0.5"}], "probeIPs": [{"ip": "10.244.1.7"}]}), DictLookup())
    with pytest.raises(ValidationError) as info:
        validate(probe_pod(status={"probeIPs": [{"ip": "10.244.1.300"}]}), DictLookup())
    assert info.value.field == "status.probeIPs[0].ip"


def test_the_store_stores_nothing_of_an_invalid_pod(tmp_path):
    store = SqliteStore(str(tmp_path / "store.db"))
    try:
        with pytest.raises(ValidationError) as info:
            store.apply(probe_pod(livenessProbe={"httpGet": {"port": "http"}, "successThreshold": 3}))
        assert info.value.field == f"{C}.livenessProbe.successThreshold"
        assert store.list("pods").items == []
        stored = store.apply(probe_pod(readinessProbe={"httpGet": {"port": "http", "path": "/healthz"}})).object
        assert stored["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] == 10
        # a status with containerStatuses and probe addresses, as the lab's kubelet writes it
        store.update_status("pods", "web", "default", {
            "phase": "Running", "podIP": "10.10.0.5", "podIPs": [{"ip": "10.10.0.5"}],
            "probeIPs": [{"ip": "10.244.1.7"}],
            "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": "2030-01-01T00:00:00Z"}],
            "containerStatuses": [{"name": "c", "ready": False, "started": True, "restartCount": 2,
                                   "state": {"running": {"startedAt": "2030-01-01T00:00:00Z"}}}]})
        with pytest.raises(ValidationError) as info:
            store.update_status("pods", "web", "default", {"probeIPs": [{"ip": "nope"}]})
        assert info.value.field == "status.probeIPs[0].ip"
        assert store.get("pods", "web", "default")["status"]["containerStatuses"][0]["restartCount"] == 2
    finally:
        store.close()
