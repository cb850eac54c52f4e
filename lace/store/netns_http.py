"""HTTP connection pools whose sockets are made inside a network namespace: the one definition the
etcd gateway's requests session and the Kubernetes client's pool manager both install.

Only the creating thread enters the namespace (setns), only while it makes the socket; the
connection then lives on as any other (a socket stays in the namespace it was made in)."""

from __future__ import annotations

from typing import Any

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from lace import nsenter


class _InNetns:
    """Mixed into a urllib3 connection class: its socket is made in ``netns``."""

    netns: str
    translate: nsenter.Translate | None = None

    def _new_conn(self) -> Any:
        with nsenter.entered(self.netns, translate=type(self).translate):
            return super()._new_conn()  # type: ignore[misc]


def pool_classes(netns: str, translate: nsenter.Translate | None = None) -> dict[str, type[HTTPConnectionPool]]:
    """urllib3's ``pool_classes_by_scheme`` (http and https) for connections made in ``netns``;
    ``translate`` turns a failure to enter it into the caller's own error."""
    attrs = {"netns": netns, "translate": translate}
    conn = type("NetnsHTTPConnection", (_InNetns, HTTPConnection), attrs)
    conns = type("NetnsHTTPSConnection", (_InNetns, HTTPSConnection), attrs)
    return {"http": type("NetnsHTTPConnectionPool", (HTTPConnectionPool,), {"ConnectionCls": conn}),
            "https": type("NetnsHTTPSConnectionPool", (HTTPSConnectionPool,), {"ConnectionCls": conns})}
