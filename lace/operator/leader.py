"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection package does.

The leader renews ``spec.renewTime`` every ``retry`` seconds; a candidate takes the Lease when it
is absent or was not renewed for ``leaseDurationSeconds``. Each write carries the resourceVersion
it read, so two candidates never both win. A leader that cannot renew for the whole duration
stops leading before anyone else can take over (it steps down at ``renew_deadline``).
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

from lace.store.errors import AlreadyExists, Conflict, NotFound, StoreError
from lace.store.kubernetes_client import LEASES, ApiServer, format_micro_time, parse_micro_time

log = logging.getLogger("lace.operator.leader")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class LeaderElector:
    """Tries to hold Lease ``namespace/name`` for ``identity``; ``try_acquire_or_renew`` once per period."""

    api: ApiServer
    namespace: str
    name: str
    identity: str
    lease_duration: int = 15

    def __post_init__(self) -> None:
        self.path = LEASES.path(self.namespace, self.name)
        self.what = f'the leader Lease "{self.namespace}/{self.name}"'
        self.last_renew: datetime.datetime | None = None

    @property
    def leading(self) -> bool:
        return self.last_renew is not None and (_now() - self.last_renew).total_seconds() < self.lease_duration * 2 / 3

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this candidate leads afterwards."""
        now = _now()
        try:
            lease: dict | None = self.api.request("GET", self.path, what=self.what)
        except NotFound:
            lease = None
        except StoreError as err:
            log.warning("leader election: %s", err)
            return self.leading
        spec = (lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = parse_micro_time(spec.get("renewTime"))
        expired = renewed is None or (now - renewed).total_seconds() > int(spec.get("leaseDurationSeconds") or 0)
        if lease is not None and holder not in (None, "", self.identity) and not expired:
            self.last_renew = None
            return False
        new_spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_duration,
                    "renewTime": format_micro_time(now),
                    "acquireTime": spec.get("acquireTime") if holder == self.identity else format_micro_time(now),
                    "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)}
        try:
            if lease is None:
                self.api.request("POST", LEASES.path(self.namespace), what=self.what, body={
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": new_spec})
            else:
                lease["spec"] = new_spec
                self.api.request("PUT", self.path, body=lease, what=self.what)
        except (AlreadyExists, Conflict):
            self.last_renew = None
            return False   # another candidate wrote first
        except StoreError as err:
            log.warning("leader election: %s", err)
            return self.leading
        if holder != self.identity:
            log.info("%s is now the leader (%s)", self.identity, self.what)
        self.last_renew = now
        return True

    def release(self) -> None:
        """Give the Lease up (on shutdown), so a standby takes over at once."""
        if self.last_renew is None:
            return
        try:
            lease = self.api.request("GET", self.path, what=self.what)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["leaseDurationSeconds"] = 1
                self.api.request("PUT", self.path, body=lease, what=self.what)
        except StoreError:
            pass
        self.last_renew = None
