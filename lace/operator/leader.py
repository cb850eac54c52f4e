"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection package does.

A candidate's thread (``start``) runs a round every ``retry`` seconds: the leader renews
``spec.renewTime``; another candidate takes the Lease when it is absent, released, or has not
changed for ``leaseDurationSeconds`` since this candidate last saw it change. That is judged on the
candidate's own monotonic clock (client-go's observedTime), never by comparing the ``renewTime``
another machine wrote with this machine's clock. Each write carries the resourceVersion it read,
so two candidates never both win.

The leader leads while its last successful renewal began less than ``renew_deadline`` (two thirds
of the duration) ago. A leader that cannot renew steps down then, before any other candidate can
take over (they wait the full duration from when they last saw the Lease change). The renewals run
in their own thread, so a long pass does not let the Lease lapse; the pass checks ``leading`` as
it goes and stops when it turns False.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from dataclasses import dataclass

from lace.store.errors import AlreadyExists, Conflict, NotFound, StoreError
from lace.store.kubernetes_client import LEASES, ApiServer, format_micro_time

log = logging.getLogger("lace.operator.leader")


@dataclass
class LeaderElector:
    """Tries to hold Lease ``namespace/name`` for ``identity``: a round at a time
    (``try_acquire_or_renew``), or every ``retry`` seconds in a thread (``start``/``stop``)."""

    api: ApiServer
    namespace: str
    name: str
    identity: str
    lease_duration: int = 15
    #: seconds between rounds (default: client-go's 2 s of a 15 s lease, in proportion)
    retry: float | None = None

    def __post_init__(self) -> None:
        self.path = LEASES.path(self.namespace, self.name)
        self.what = f'the leader Lease "{self.namespace}/{self.name}"'
        #: client-go's renewDeadline (10 s of a 15 s lease): a leader that has not renewed for this
        #: long stops leading, a third of the duration before another candidate may take over
        self.renew_deadline = self.lease_duration * 2 / 3
        if self.retry is None:
            self.retry = max(0.1, self.lease_duration * 2 / 15)
        #: monotonic time at which this candidate's last successful renewal began (None: not leading)
        self._renewed: float | None = None
        #: the Lease's spec as last seen, and the monotonic time it was first seen so
        self._observed: tuple | None = None
        self._observed_at = 0.0
        self._round_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def leading(self) -> bool:
        renewed = self._renewed
        return renewed is not None and time.monotonic() - renewed < self.renew_deadline

    def start(self) -> None:
        """Run rounds in a thread until ``stop``."""
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the rounds and give the Lease up."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self.lease_duration)
        self.release()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception:   # a bug must not end the renewals: the leader would lead on unseen
                log.exception("leader election: a round failed")
            self._stopping.wait(self.retry)

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this candidate leads afterwards."""
        with self._round_lock:
            return self._round()

    def _observe(self, spec: dict | None) -> float:
        """Seconds since the Lease last changed as this candidate saw it."""
        record = None if spec is None else (spec.get("holderIdentity"), spec.get("renewTime"),
                                            spec.get("acquireTime"), spec.get("leaseDurationSeconds"),
                                            spec.get("leaseTransitions"))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        return now - self._observed_at

    def _round(self) -> bool:
        began = time.monotonic()
        try:
            lease: dict | None = self.api.request("GET", self.path, what=self.what)
        except NotFound:
            lease = None
        except StoreError as err:
            log.warning("leader election: %s", err)
            return self.leading
        spec = (lease or {}).get("spec") or {}
        unchanged_for = self._observe(None if lease is None else spec)
        holder = spec.get("holderIdentity")
        expired = unchanged_for >= int(spec.get("leaseDurationSeconds") or 0)
        if lease is not None and holder not in (None, "", self.identity) and not expired:
            self._renewed = None
            return False
        now = format_micro_time(datetime.datetime.now(datetime.UTC))
        new_spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_duration,
                    "renewTime": now,
                    "acquireTime": spec.get("acquireTime") if holder == self.identity else now,
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
            self._renewed = None
            return False   # another candidate wrote first
        except StoreError as err:
            log.warning("leader election: %s", err)
            return self.leading
        if holder != self.identity:
            log.info("%s is now the leader (%s)", self.identity, self.what)
        self._renewed = began
        self._observe(new_spec)
        return True

    def release(self) -> None:
        """Give the Lease up (on shutdown), so a standby takes over at once."""
        with self._round_lock:
            if self._renewed is None:
                return
            self._renewed = None
            try:
                lease = self.api.request("GET", self.path, what=self.what)
                if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                    lease["spec"]["holderIdentity"] = ""
                    lease["spec"]["leaseDurationSeconds"] = 1
                    self.api.request("PUT", self.path, body=lease, what=self.what)
            except StoreError:
                pass
