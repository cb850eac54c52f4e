"""``lace connectivity test`` without a cluster: scenario selection (--test), capabilities and
skips, the flows a scenario owns, the expected-drop judgement, JUnit XML, the manifests and plans,
and the command line's bad input (exit 2)."""

from __future__ import annotations

import io
import os
import tempfile
import xml.etree.ElementTree as ET

import pytest

from lace.cli.main import main as lace_main
from lace.cli.connectivity import junit
from lace.cli.connectivity import runner as R
from lace.cli.connectivity import scenarios as S
from lace.cli.connectivity.judge import FAIL, PASS, SKIP, Outcome, Result, check_answer, flow_matches, judge, \
    select_flows

BY_NAME = {s.name: s for s in S.SCENARIOS}


def flow(verdict="forward", reason="none", saddr="10.244.0.2", daddr="10.244.1.2", dport=80, proto="tcp",
         t=100.0, family="ipv4", nat_addr=None, nat_port=None, sport=40000):
    return {"verdict": verdict, "reason": reason, "saddr": saddr, "daddr": daddr, "sport": sport, "dport": dport,
            "proto": proto, "time": t, "family": family, "nat_addr": nat_addr, "nat_port": nat_port, "node": "worker-1"}


# ---- selection ------------------------------------------------------------------------------------

def test_every_scenario_named_once_and_the_issue_list_is_covered():
    names = [s.name for s in S.SCENARIOS]
    assert len(names) == len(set(names))
    for prefix in ("pod-to-pod/same-node/ipv4/tcp", "pod-to-pod/cross-node/ipv6/udp", "pod-to-service/",
                   "node-to-service/", "pod-to-outside/masquerade/", "pod-to-outside/no-masquerade/", "dns/",
                   "host-to-pod/", "host-to-pod/probe", "large-payload/", "isolation/", "policy/allow",
                   "policy/deny", "policy/audit"):
        assert any(n.startswith(prefix) for n in names), prefix


def test_select_all_by_default_regex_search_and_several_patterns_in_table_order():
    assert S.select(None) == list(S.SCENARIOS)
    assert S.select([]) == list(S.SCENARIOS)
    got = [s.name for s in S.select(["^policy/"])]
    assert got == ["policy/allow", "policy/deny", "policy/audit"]
    got = [s.name for s in S.select(["deny", "cross-node/ipv4/tcp"])]
    assert got == ["pod-to-pod/cross-node/ipv4/tcp", "policy/deny"]   # table order, not pattern order
    assert all("ipv6" in s.name for s in S.select(["ipv6"]))


@pytest.mark.parametrize("patterns, words", [(["("], "not a regular expression"), (["nothing-like-this"], "matches no")])
def test_select_rejects_bad_and_empty_patterns(patterns, words):
    with pytest.raises(S.BadPattern, match=words):
        S.select(patterns)


def test_missing_capabilities_name_what_the_cluster_lacks():
    svc6 = BY_NAME["pod-to-service/ipv6/tcp"]
    assert S.missing(svc6, set(S.CAPABILITIES)) == []
    assert S.missing(svc6, {S.IPV6}) == [S.SERVICES]
    assert S.missing(svc6, set()) == [S.SERVICES, S.IPV6]
    assert S.missing(BY_NAME["pod-to-pod/cross-node/ipv4/tcp"], {S.IPV6}) == [S.TWO_NODES]
    assert S.missing(BY_NAME["pod-to-pod/same-node/ipv4/tcp"], set()) == []


# ---- flows of a scenario ------------------------------------------------------------------------

def test_flow_matching_by_window_proto_family_and_destination_port():
    src, dests = ["10.244.0.2"], [("10.244.1.2", 53)]
    assert flow_matches(flow(dport=53, proto="udp"), src, dests, "udp", 99.9, 100.1)
    assert not flow_matches(flow(dport=5353, proto="udp"), src, dests, "udp", 99.9, 100.1), "another check's port"
    assert not flow_matches(flow(dport=53, proto="tcp"), src, dests, "udp", 99.9, 100.1)
    assert not flow_matches(flow(dport=53, proto="udp", t=105), src, dests, "udp", 99.9, 100.1)
    assert not flow_matches(flow(dport=53, proto="udp", saddr="10.244.0.9"), src, dests, "udp", 99, 101)
    # the translated destination counts (a service's backend), and so does the reply
    assert flow_matches(flow(daddr="10.96.0.1", dport=80, nat_addr="10.244.1.2", nat_port=53, proto="udp"),
                        src, dests, "udp", 99, 101)
    assert flow_matches(flow(saddr="10.244.1.2", sport=53, daddr="10.244.0.2", dport=40000, proto="udp"),
                        src, dests, "udp", 99, 101)
    # family: a v4 scenario does not own the v6 check's flows; any port with None
    v6 = flow(family="ipv6", saddr="fd00::2", daddr="fd00::1:2")
    assert not flow_matches(v6, ["fd00::2"], [("fd00::1:2", None)], "tcp", 99, 101, family=4)
    assert flow_matches(v6, ["fd00::2"], [("fd00::1:2", None)], "tcp", 99, 101, family=6)
    assert flow_matches(v6, ["fd00::2"], [("fd00::1:2", None)], "any", 99, 101)
    # v4-mapped addresses are normalized
    assert flow_matches(flow(saddr="::ffff:10.244.0.2"), src, [("10.244.1.2", 80)], "tcp", 99, 101)


def test_select_flows_sorts_by_time():
    fs = [flow(t=100.2), flow(t=100.0), flow(t=100.1, saddr="10.9.9.9")]
    got = select_flows(fs, ["10.244.0.2"], [("10.244.1.2", 80)], "tcp", 100, 100.2)
    assert [f["time"] for f in got] == [100.0, 100.2]


# ---- judging --------------------------------------------------------------------------------------

def test_pass_needs_an_answer_the_right_one_and_no_drop():
    s = BY_NAME["pod-to-pod/cross-node/ipv4/tcp"]
    assert judge(s, Outcome(0, "ns/echo-other\n", 1, 2, True), [flow()]).status == PASS
    r = judge(s, Outcome(1, "no answer from 10.244.1.2:80 (tcp): timed out\n", 1, 2), [])
    assert r.status == FAIL and "no answer" in r.message and "timed out" in r.message
    r = judge(s, Outcome(0, "ns/other\n", 1, 2, False, "'ns/other', expected ns/echo-other"), [])
    assert r.status == FAIL and "wrong answer" in r.message
    # answered after a retransmission, yet a packet was dropped on the way: fail, naming the reason
    r = judge(s, Outcome(0, "ns/echo-other\n", 1, 2, True), [flow(), flow("drop", "ct-invalid")])
    assert r.status == FAIL and "unexpected drop: ct-invalid" in r.message
    r = judge(s, Outcome(1, "x", 1, 2), [flow("drop", "policy-ingress")] * 3)
    assert "unexpected drops: policy-ingress (3)" in r.message


def test_expected_failures_need_their_own_drop_reason_and_no_other():
    iso = BY_NAME["isolation/pod-of-another-network/ipv4"]
    assert iso.expected_drops == {"no-route"}
    assert judge(iso, Outcome(1, "timed out", 1, 2), [flow("drop", "no-route")]).status == PASS
    r = judge(iso, Outcome(1, "timed out", 1, 2), [])
    assert r.status == FAIL and "no drop with reason no-route was seen" in r.message
    r = judge(iso, Outcome(1, "timed out", 1, 2), [flow("drop", "no-route"), flow("drop", "policy-egress")])
    assert r.status == FAIL and "unexpected drop: policy-egress" in r.message
    r = judge(iso, Outcome(0, "ns/echo-other", 1, 2), [])
    assert r.status == FAIL and "got through but must not" in r.message
    deny = BY_NAME["policy/deny"]
    assert judge(deny, Outcome(1, "", 1, 2), [flow("drop", "policy-ingress")]).status == PASS
    assert judge(deny, Outcome(1, "", 1, 2), [flow("drop", "no-route")]).status == FAIL


def test_audit_passes_only_with_an_audit_flow():
    s = BY_NAME["policy/audit"]
    audit = flow("audit", "policy-ingress")
    assert judge(s, Outcome(0, "ns/audited", 1, 2, True), [audit]).status == PASS
    r = judge(s, Outcome(0, "ns/audited", 1, 2, True), [flow()])
    assert r.status == FAIL and "no AUDIT flow was seen" in r.message


def test_check_answer_kinds():
    assert check_answer("target", "ns/a\n", ["ns/a"]) == (True, "")
    ok, problem = check_answer("backend", "ns/c\n", ["ns/a", "ns/b"])
    assert not ok and "expected ns/a or ns/b" in problem
    assert check_answer("node-address", "::ffff:10.0.0.1\n", ["10.0.0.1"])[0]
    assert check_answer("vips", "10.96.0.5 fd00:10:96::5\n", ["10.96.0.5", "fd00:10:96::5"])[0]
    ok, problem = check_answer("vips", "10.96.0.5\n", ["10.96.0.5", "fd00:10:96::5"])
    assert not ok and "fd00:10:96::5" in problem
    assert check_answer("echo", "anything", []) == (None, "")
    assert check_answer("target", "", ["ns/a"])[0] is False


# ---- JUnit ----------------------------------------------------------------------------------------

def test_junit_xml_counts_failures_with_flows_and_skips():
    results = [Result(BY_NAME["policy/allow"], PASS, duration=0.25, output="ns/guarded\n"),
               Result(BY_NAME["policy/deny"], FAIL, "got through but must not: ns/guarded", 1.5,
                      [flow("drop", "policy-ingress")], "ns/guarded\n"),
               Result(BY_NAME["dns/service-name"], SKIP, "skipped: needs dns")]
    data = junit.to_xml(results, duration=3.2, timestamp="2025-01-01T00:00:00+00:00", hostname="h",
                        properties={"lab": "x"}, flow_text=lambda f: f"FLOW {f['verdict']} {f['reason']}")
    root = ET.fromstring(data)
    suite = root.find("testsuite")
    assert suite.get("tests") == "3" and suite.get("failures") == "1" and suite.get("skipped") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["policy/allow"].get("classname") == "policy" and cases["policy/allow"].get("time") == "0.250"
    fail = cases["policy/deny"].find("failure")
    assert fail.get("message") == "got through but must not: ns/guarded"
    assert "FLOW drop policy-ingress" in fail.text and "flows seen:" in fail.text
    assert cases["dns/service-name"].find("skipped").get("message") == "skipped: needs dns"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "r.xml")
        junit.write(path, data)
        assert ET.parse(path).getroot().tag == "testsuites"
        assert os.listdir(d) == ["r.xml"]


# ---- what is deployed and run ----------------------------------------------------------------------

def test_only_the_pods_the_chosen_scenarios_need_are_deployed():
    assert R.roles_needed(S.select(["^pod-to-pod/same-node"])) == ["client", "echo-same"]
    assert R.roles_needed(S.select(["pod-to-service"])) == ["client", "echo-same", "echo-other"]
    assert R.roles_needed(S.select(["policy/deny"])) == ["echo-same", "guarded"]
    assert R.roles_needed(list(S.SCENARIOS)) == list(R.POD_ROLES)


def test_manifests_networks_policies_service_and_nodes():
    objs = R.manifests("lace-connectivity-abc", "abc", list(R.POD_ROLES), "worker-1", "worker-2",
                       create_namespace=True)
    kinds = [o["kind"] for o in objs]
    assert kinds[0] == "Namespace" and kinds.count("Pod") == 8 and kinds.count("Network") == 3
    nets = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "Network"}
    assert nets["lcx-abc-masq"]["routes"] == [{"to": "outside", "masquerade": True}]
    assert nets["lcx-abc-open"]["routes"] == [{"to": "outside", "masquerade": False}]
    assert "routes" not in nets["lcx-abc-iso"]
    pods = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Pod"}
    assert pods["echo-other"]["spec"]["nodeName"] == "worker-2" and pods["client"]["spec"]["nodeName"] == "worker-1"
    assert pods["isolated"]["metadata"]["annotations"] == {"lace.dev/network": "lcx-abc-iso"}
    assert "readinessProbe" in pods["isolated"]["spec"]["containers"][0]
    pols = {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkPolicy"}
    assert pols["audit"]["metadata"]["annotations"] == {"lace.dev/audit": "true"}
    svc = next(o for o in objs if o["kind"] == "Service")
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(80, 8080), (53, 5353)]
    # --namespace: no Namespace object; one node: everything on it
    objs = R.manifests("mine", "abc", ["client", "echo-other"], "worker-1", "worker-1", create_namespace=False)
    assert [o["kind"] for o in objs] == ["Pod", "Pod"]
    assert {o["spec"]["nodeName"] for o in objs} == {"worker-1"}


def _env() -> R.Env:
    def pod(*ips, probe=()):
        return {"status": {"podIPs": [{"ip": i} for i in ips], "probeIPs": [{"ip": i} for i in probe]}}
    return R.Env("ns", "worker-1", "worker-2", pods={
        "client": pod("10.244.0.2", "fd00::2"), "echo-same": pod("10.244.0.3", "fd00::3"),
        "echo-other": pod("10.244.1.2", "fd00::1:2"), "isolated": pod("10.201.0.1", probe=("10.244.0.9",)),
        "masq": pod("10.202.0.1", "fd20:202::1")},
        vips=["10.96.0.7", "fd00:10:96::7"], dns_addrs=["10.96.0.10"], host_addrs={"worker-1": ["10.244.0.1"]},
        node_addrs={"worker-1": ["198.18.0.1", "fd5e:ff::1"]}, internet={4: "203.0.113.1", 6: "2001:db8:cafe::1"},
        outside_ports={"tcp": 40001, "udp": 40002}, pod_mtu=1460)


def test_plans_resolve_roles_to_commands_and_flow_filters():
    env = _env()
    p = R.plan(BY_NAME["pod-to-service/ipv4/udp"], env)
    assert p.where == ("pod", "client") and p.argv[-5:] == ["udp", "10.96.0.7", "53", "--timeout", "1"]
    assert ("10.96.0.7", 53) in p.dests and ("10.244.1.2", 5353) in p.dests and ("10.244.1.2", 53) not in p.dests
    p = R.plan(BY_NAME["node-to-service/ipv6/tcp"], env)
    assert p.where == ("host", "worker-1") and "fd00:10:96::7" in p.argv and p.sources == {"10.244.0.1"}
    p = R.plan(BY_NAME["pod-to-outside/masquerade/ipv4/tcp"], env)
    assert p.argv[-4:-2] == ["203.0.113.1", "40001"] and p.want == ["198.18.0.1"] and "198.18.0.1" in p.sources
    p = R.plan(BY_NAME["large-payload/cross-node/ipv6"], env)
    assert p.argv[-5:] == ["lace.cli.connectivity.pmtu", "fd00::1:2", "5353", "--mtu", "1460"]
    p = R.plan(BY_NAME["host-to-pod/probe-isolated"], env)
    assert p.where == ("none", "") and ("10.244.0.9", 8080) in p.dests
    p = R.plan(BY_NAME["dns/service-name"], env)
    assert p.dests == {("10.96.0.10", 53)} and p.want == env.vips


# ---- the command line ------------------------------------------------------------------------------

def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with tempfile.TemporaryDirectory() as d:
        rc = int(lace_main(list(argv), {"LACE_STATE_DIR": d, "NO_COLOR": "1"}, stdout=out, stderr=err,
                           stdin=io.StringIO("")))
    return rc, out.getvalue(), err.getvalue()


def test_cli_bad_input_exits_2_and_list_needs_no_lab():
    rc, _, err = _cli("connectivity", "test", "--test", "(")
    assert rc == 2 and "not a regular expression" in err
    rc, _, err = _cli("connectivity", "test", "--test", "zzz-nothing")
    assert rc == 2 and "matches no scenario" in err
    rc, _, err = _cli("connectivity", "test", "--junit", "/nonexistent-dir/x.xml")
    assert rc == 2 and "does not exist" in err
    rc, out, _ = _cli("connectivity", "test", "--list", "--test", "^policy/")
    assert rc == 0 and [ln.split()[0] for ln in out.splitlines()] == ["policy/allow", "policy/deny", "policy/audit"]
    rc, _, err = _cli("connectivity", "test")
    assert rc == 5 and "no lab" in err
