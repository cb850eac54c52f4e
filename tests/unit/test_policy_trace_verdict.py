"""``lace policy trace``'s verdict and drop reason for each pair of direction verdicts, as the
datapath reports them (pod_veth.c new_flow_policy: an audited egress still checks ingress)."""

import pytest

from lace.policy.trace import verdict_of


@pytest.mark.parametrize("egress,ingress,want", [
    ("allow", "allow", ("allow", None)),
    ("deny", "allow", ("deny", "POLICY_EGRESS")),
    ("deny", "deny", ("deny", "POLICY_EGRESS")),
    ("allow", "deny", ("deny", "POLICY_INGRESS")),
    # found by the datapath fuzzer: the egress audit lets the packet on, the ingress deny drops it
    ("audit", "deny", ("deny", "POLICY_INGRESS")),
    ("audit", "allow", ("audit", "POLICY_EGRESS")),
    ("allow", "audit", ("audit", "POLICY_INGRESS")),
    ("audit", "audit", ("audit", "POLICY_EGRESS")),
    ("deny", None, ("deny", "POLICY_EGRESS")),
    ("audit", None, ("audit", "POLICY_EGRESS")),
])
def test_verdict_and_reason(egress, ingress, want):
    assert verdict_of({"verdict": egress}, {"verdict": ingress} if ingress else None) == want


def test_no_route():
    assert verdict_of({"verdict": "no-route", "reason": "NO_ROUTE"}, None) == ("deny", "NO_ROUTE")
