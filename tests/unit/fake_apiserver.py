"""A recorded-response Kubernetes apiserver over real HTTP, for the Kubernetes store's tests.

A real kube-apiserver cannot run on this machine, so this stands in for one — and only for it:
the store under test is the real one, going through the official Python client (kubeconfig
loading, ApiClient, urllib3) over a real TCP connection. It speaks the apiserver's wire format:
lists with ``metadata.resourceVersion``, watch streams of JSON event lines (chunked) from a
resourceVersion with ``allowWatchBookmarks``, ``Status`` bodies for errors (409 AlreadyExists and
Conflict, 404, 410 Expired both as an HTTP status and as an in-stream ERROR event), creates that
assign uid/resourceVersion/creationTimestamp, updates guarded by resourceVersion, status
subresources, delete preconditions and ``dryRun=All``. One etcd-like revision counter runs across
every resource, as in a real cluster.

The test controls what a real cluster does to clients: ``disconnect_watches()`` drops every open
watch, ``compact()`` forgets history (a watch from before it gets 410), ``bookmark()`` sends a
BOOKMARK event, ``delay`` answers slowly, ``fail(...)`` answers the next matching requests with an
error. Every request is recorded (``requests``).

Objects come from ``data/apiserver/*.json``: objects as a cluster serves them (managedFields,
status written by the kubelet, a ClusterIP the apiserver allocated, an EndpointSlice the
controller manager wrote), written in that format by hand after real clusters' output.
"""

from __future__ import annotations

import bisect
import copy
import datetime
import http.server
import json
import os
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

DATA_DIR = os.path.join(os.path.dirname(__file__), "data", "apiserver")


def recorded(name: str) -> list[dict]:
    """The objects of one recorded file (``data/apiserver/NAME.json``: a List)."""
    with open(os.path.join(DATA_DIR, name + ".json")) as f:
        return json.load(f)["items"]


@dataclass
class Route:
    """A request path taken apart: the collection (``/api/v1/pods``), namespace, name, subresource."""

    collection: str
    namespace: str | None
    name: str | None
    sub: str | None


def parse_path(path: str) -> Route | None:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        root, rest = "/api/v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        root, rest = "/" + "/".join(parts[:3]), parts[3:]
    else:
        return None
    ns = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        ns, rest = rest[1], rest[2:]
    if not rest:
        return None
    return Route(f"{root}/{rest[0]}", ns, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


@dataclass
class Failure:
    """Answer the next ``count`` requests matching ``match`` with ``code``."""

    match: Callable[[str, str, dict], bool]
    code: int
    count: int
    reason: str = "InternalError"


@dataclass
class FakeApiServer:
    """The apiserver's state and behaviour (served by ``serve``)."""

    revision: int = 1000
    objects: dict[str, dict[tuple[str, str], dict]] = field(default_factory=dict)
    events: list[tuple[int, str, str, dict]] = field(default_factory=list)
    compacted: int = 0
    status_subresource: set[str] = field(default_factory=lambda: {
        "/apis/lace.dev/v1alpha1/networks", "/api/v1/pods", "/api/v1/nodes", "/api/v1/services"})
    requests: list[tuple[str, str, dict]] = field(default_factory=list)
    delay: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    watch_epoch: int = 0
    bookmarks: list[int] = field(default_factory=list)
    #: answer a watch from a compacted resourceVersion with HTTP 410 (else: an ERROR event)
    expired_as_http_status: bool = False

    def __post_init__(self) -> None:
        self.cond = threading.Condition()

    # ---- what a test does --------------------------------------------------------------------

    def load(self, collection: str, items: list[dict]) -> None:
        """Store recorded objects as they are (their resourceVersions bumped into this server's)."""
        with self.cond:
            for obj in items:
                self._write(collection, "ADDED", copy.deepcopy(obj))

    def put(self, collection: str, obj: dict, type_: str = "ADDED") -> dict:
        """A write by someone else (the kubelet, the controller manager): stored and watched."""
        with self.cond:
            return self._write(collection, type_, copy.deepcopy(obj))

    def remove(self, collection: str, namespace: str, name: str) -> None:
        with self.cond:
            obj = self.objects.get(collection, {}).pop((namespace, name))
            self.revision += 1
            obj["metadata"]["resourceVersion"] = str(self.revision)
            self.events.append((self.revision, collection, "DELETED", obj))
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget all history up to now: a watch from an older resourceVersion gets 410."""
        with self.cond:
            self.compacted = self.revision
            self.events = []

    def disconnect_watches(self) -> None:
        with self.cond:
            self.watch_epoch += 1
            self.cond.notify_all()

    def bookmark(self) -> int:
        """Advance the revision (a write elsewhere) and send every watch a BOOKMARK of it."""
        with self.cond:
            self.revision += 1
            self.bookmarks.append(self.revision)
            self.cond.notify_all()
            return self.revision

    def fail(self, code: int, count: int = 1, *, method: str | None = None, path: str | None = None,
             watch: bool | None = None, reason: str = "InternalError") -> None:
        def match(m: str, p: str, q: dict) -> bool:
            return ((method is None or m == method) and (path is None or p.startswith(path))
                    and (watch is None or (q.get("watch") == "true") == watch))
        with self.cond:
            self.failures.append(Failure(match, code, count, reason))

    def watch_requests(self, collection: str) -> list[dict]:
        return [q for m, p, q in self.requests if q.get("watch") == "true" and p.endswith(collection.rsplit("/", 1)[1])
                and (parse_path(p) or Route("", None, None, None)).collection == collection]

    # ---- state ---------------------------------------------------------------------------------

    def _write(self, collection: str, type_: str, obj: dict) -> dict:
        self.revision += 1
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(self.revision)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp",
                        datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        key = (meta.get("namespace", ""), meta["name"])
        self.objects.setdefault(collection, {})[key] = obj
        self.events.append((self.revision, collection, type_, copy.deepcopy(obj)))
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def handle(self, method: str, path: str, query: dict[str, str], body: dict | None) -> tuple[int, dict]:
        """A unary request: (status, JSON body)."""
        route = parse_path(path)
        if route is None:
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        dry = query.get("dryRun") == "All" or (body or {}).get("dryRun") == ["All"]
        with self.cond:
            coll = self.objects.setdefault(route.collection, {})
            ns = route.namespace or ""
            if method == "GET" and route.name is None:
                items = [copy.deepcopy(o) for (n, _), o in sorted(coll.items())
                         if route.namespace is None or n == route.namespace]
                selector = query.get("labelSelector")
                if selector:
                    k, _, v = selector.partition("=")
                    items = [o for o in items if (o["metadata"].get("labels") or {}).get(k) == v]
                for o in items:
                    o.pop("apiVersion", None)
                    o.pop("kind", None)
                return 200, {"kind": "List", "apiVersion": "v1",
                             "metadata": {"resourceVersion": str(self.revision)}, "items": items}
            if method == "GET":
                obj = coll.get((ns, route.name))
                if obj is None:
                    return 404, status(404, "NotFound", f'"{route.name}" not found')
                return 200, copy.deepcopy(obj)
            if method == "POST":
                assert body is not None
                name = body["metadata"]["name"]
                if (ns, name) in coll:
                    return 409, status(409, "AlreadyExists", f'"{name}" already exists')
                obj = copy.deepcopy(body)
                if route.namespace:
                    obj["metadata"]["namespace"] = route.namespace
                if route.collection in self.status_subresource:
                    obj.pop("status", None)
                obj["metadata"]["generation"] = 1
                obj["metadata"]["uid"] = str(uuid.uuid4())
                if dry:
                    obj["metadata"]["resourceVersion"] = ""
                    return 201, obj
                return 201, self._write(route.collection, "ADDED", obj)
            if method == "PUT":
                assert body is not None
                old = coll.get((ns, route.name))
                if old is None:
                    return 404, status(404, "NotFound", f'"{route.name}" not found')
                want = body["metadata"].get("resourceVersion")
                if want and want != old["metadata"]["resourceVersion"]:
                    return 409, status(409, "Conflict", f'Operation cannot be fulfilled on "{route.name}": '
                                       "the object has been modified; please apply your changes to the "
                                       "latest version and try again")
                if route.sub == "status":
                    obj = copy.deepcopy(old)
                    obj["status"] = copy.deepcopy(body.get("status"))
                else:
                    obj = copy.deepcopy(body)
                    obj["metadata"]["uid"] = old["metadata"]["uid"]
                    obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"]
                    if route.collection in self.status_subresource:
                        if "status" in old:
                            obj["status"] = copy.deepcopy(old["status"])
                        else:
                            obj.pop("status", None)
                if obj == old:
                    return 200, copy.deepcopy(old)
                if dry:
                    return 200, obj
                return 200, self._write(route.collection, "MODIFIED", obj)
            if method == "DELETE":
                old = coll.get((ns, route.name))
                if old is None:
                    return 404, status(404, "NotFound", f'"{route.name}" not found')
                pre = (body or {}).get("preconditions") or {}
                for k in ("uid", "resourceVersion"):
                    if pre.get(k) and pre[k] != old["metadata"].get(k):
                        return 409, status(409, "Conflict", f"Precondition failed: {k} in precondition: "
                                           f"{pre[k]}, {k} in object meta: {old['metadata'].get(k)}")
                if dry:
                    return 200, copy.deepcopy(old)
                del coll[(ns, route.name)]
                self.revision += 1
                gone = copy.deepcopy(old)
                gone["metadata"]["resourceVersion"] = str(self.revision)
                self.events.append((self.revision, route.collection, "DELETED", gone))
                self.cond.notify_all()
                return 200, copy.deepcopy(gone)
        return 405, status(405, "MethodNotAllowed", method)

    def watch(self, path: str, query: dict[str, str], send: Callable[[dict], None], epoch: int) -> None:
        """Stream events after ``resourceVersion`` until the timeout, a disconnect (of ``epoch``, the
        watches as they were when the request arrived) or an error."""
        route = parse_path(path)
        assert route is not None
        since = int(query.get("resourceVersion") or self.revision)
        deadline = time.monotonic() + int(query.get("timeoutSeconds") or 60)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        with self.cond:
            if since < self.compacted:
                send({"type": "ERROR", "object": status(
                    410, "Expired", f"too old resource version: {since} ({self.compacted})")})
                return
            # every bookmark after the watch's revision, also one made while this request was on
            # its way (as the apiserver: a watch sees what happened after its resourceVersion)
            position, sent_bookmarks = since, bisect.bisect_right(self.bookmarks, since)
        while True:
            with self.cond:
                while True:
                    if self.watch_epoch != epoch:
                        return
                    pending = [e for e in self.events if e[0] > position and e[1] == route.collection
                               and (route.namespace is None or e[3]["metadata"].get("namespace") == route.namespace)]
                    marks = self.bookmarks[sent_bookmarks:]
                    if pending or marks:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self.cond.wait(min(left, 0.5))
                if pending:
                    position = pending[-1][0]
                sent_bookmarks = len(self.bookmarks)
            for rv, _, type_, obj in pending:
                send({"type": type_, "object": obj})
            if bookmarks:
                for rv in marks:
                    if rv > position:
                        kind = route.collection.rsplit("/", 1)[1]
                        send({"type": "BOOKMARK", "object": {"kind": kind, "metadata": {
                            "resourceVersion": str(rv),
                            "annotations": {"k8s.io/initial-events-end": "true"}}}})
                        position = rv


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: FakeApiServer

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _do(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        api = self.api
        with api.cond:
            api.requests.append((self.command, url.path, query))
            # a watch ends at any disconnect_watches() from here on, even one made before it streams
            epoch = api.watch_epoch
            failure = next((f for f in api.failures if f.count > 0 and f.match(self.command, url.path, query)), None)
            if failure is not None:
                failure.count -= 1
        if api.delay:
            time.sleep(api.delay)
        if failure is not None:
            self._answer(failure.code, status(failure.code, failure.reason, f"injected failure {failure.code}"))
            return
        if self.command == "GET" and query.get("watch") == "true":
            route = parse_path(url.path)
            if route is not None:
                with api.cond:
                    too_old = int(query.get("resourceVersion") or api.revision) < api.compacted
                if too_old and api.expired_as_http_status:
                    # an apiserver may refuse the request itself rather than say so in the stream
                    self._answer(410, status(410, "Expired", "too old resource version"))
                    return
                self._stream(url.path, query, epoch)
                return
        code, out = api.handle(self.command, url.path, query, body)
        self._answer(code, out)

    def _stream(self, path: str, query: dict[str, str], epoch: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(event: dict) -> None:
            data = json.dumps(event).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            self.api.watch(path, query, send, epoch)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _do


class ServedApiServer:
    """A FakeApiServer answering on a listening socket (made where the caller is: a netns)."""

    def __init__(self, api: FakeApiServer, host: str = "127.0.0.1") -> None:
        handler = type("Handler", (_Handler,), {"api": api})
        self.api = api
        self.httpd = http.server.ThreadingHTTPServer((host, 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.api.disconnect_watches()
        self.httpd.shutdown()
        self.httpd.server_close()


def kubeconfig(url: str, path: str, context: str = "fake") -> str:
    """Write a kubeconfig for ``url`` (no credentials: the fake asks for none)."""
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": context,
           "clusters": [{"name": context, "cluster": {"server": url}}],
           "users": [{"name": context, "user": {"token": "recorded-fixture-token"}}],
           "contexts": [{"name": context, "context": {"cluster": context, "user": context}}]}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path
