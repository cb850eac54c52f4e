"""The apiserver as lace's Kubernetes store sees it: REST calls and watch streams on one ApiClient.

Built on the official Python client (``kubernetes`` on PyPI): its kubeconfig and in-cluster
loading, authentication, TLS and connection pool (``ApiClient.param_serialize`` + ``call_api``, the
calls every generated ``CoreV1Api``/``CustomObjectsApi`` method makes). lace keeps objects as plain
dicts, the shape its agent already reads in the lab, so every kind goes through one generic
resource path and raw JSON instead of the typed models (which would only be converted back).

Errors become lace's own (``lace.store.errors``): a refused request names the object, what the
apiserver said and what to do (RBAC for 403, the kubeconfig for 401), an unreachable apiserver is
``Unavailable`` naming it; no library exception reaches a caller.

``netns``: every client socket is created inside that network namespace (setns of the creating
thread only), so a process outside a lab's namespaces reaches an apiserver that listens only
inside one — the tests' recorded-response apiserver listens nowhere else.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from lace import nsenter
from lace.store import kinds as K, netns_http
from lace.store.errors import (AlreadyExists, Conflict, Forbidden, Gone, NotFound, StoreError,
                               Unavailable, ValidationError)

#: seconds one unary request may take (connect + read) before the apiserver counts as unreachable
REQUEST_TIMEOUT = 10.0


@dataclasses.dataclass(frozen=True)
class Resource:
    """Where a kind lives in the REST API: ``/api/v1`` or ``/apis/GROUP/VERSION``, plural, scope."""

    kind: str
    api_version: str
    plural: str
    namespaced: bool

    @classmethod
    def of(cls, kind: str) -> Resource:
        info = K.kind_info(kind)
        return cls(info.kind, info.api_version, info.plural, info.namespaced)

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        """The collection (``name`` None; all namespaces when ``namespace`` is None) or one object."""
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{urllib.parse.quote(namespace, safe='')}")
        parts.append(self.plural)
        if name is not None:
            parts.append(urllib.parse.quote(name, safe=""))
        if sub:
            parts.append(sub)
        return "/".join(parts)


#: coordination.k8s.io Leases (node liveness, the operator's leader election) and the ConfigMap
#: holding lace's named counters: Kubernetes kinds lace writes that are not in its kinds table
LEASES = Resource("Lease", "coordination.k8s.io/v1", "leases", True)
CONFIG_MAPS = Resource("ConfigMap", "v1", "configmaps", True)


def format_micro_time(t: datetime.datetime | None = None) -> str:
    """``t`` (default: now) as a Kubernetes MicroTime, as a Lease's ``renewTime`` carries it."""
    t = datetime.datetime.now(datetime.UTC) if t is None else t.astimezone(datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str | None) -> datetime.datetime | None:
    """A Lease time as any writer sends it (RFC 3339: with or without fractional seconds, ``Z`` or
    an offset), in UTC; None when absent or not a time."""
    if not text:
        return None
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return t.replace(tzinfo=datetime.UTC) if t.tzinfo is None else t.astimezone(datetime.UTC)


def _status_message(body: bytes) -> tuple[str, str, dict]:
    """(reason, message, details) of an apiserver Status body; empty when it is not one."""
    try:
        status = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "", body[:200].decode(errors="replace").strip(), {}
    if not isinstance(status, dict):
        return "", "", {}
    return str(status.get("reason") or ""), str(status.get("message") or ""), status.get("details") or {}


class ApiServer:
    """One apiserver: its address for messages, and JSON calls through the official client."""

    def __init__(self, api_client: Any, *, where: str, netns: str | None = None,
                 timeout: float = REQUEST_TIMEOUT) -> None:
        self.client = api_client
        self.where = where
        self.netns = netns
        self.timeout = timeout
        if netns is not None:
            _socket_in_netns(api_client, netns)

    # ---- unary calls -----------------------------------------------------------------------

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, what: str = "", content_type: str | None = None,
                timeout: float | None = None) -> dict:
        """One call; the decoded JSON answer, or a StoreError naming ``what`` (an object or list)."""
        resp = self._open(method, path, query=query, body=body, content_type=content_type,
                          timeout=(timeout or self.timeout, timeout or self.timeout))
        try:
            data = resp.read()
        except Exception as err:  # urllib3 read errors: the connection broke mid-answer
            raise self._unreachable(err) from None
        finally:
            resp.response.release_conn()
        if resp.status >= 300:
            raise self.error(resp.status, data, what or f"{method} {path}")
        try:
            out = json.loads(data) if data else {}
        except ValueError:
            raise Unavailable(f"the apiserver at {self.where} answered {method} {path} with no JSON",
                              hint="check that the kubeconfig's server is a Kubernetes apiserver") from None
        return out if isinstance(out, dict) else {}

    def stream(self, path: str, query: Mapping[str, Any], *, what: str,
               read_timeout: float) -> WatchStream:
        """A watch: the open response, read line by line (``WatchStream``)."""
        resp = self._open("GET", path, query=query, timeout=(self.timeout, read_timeout))
        if resp.status >= 300:
            try:
                data = resp.read()
            finally:
                resp.response.release_conn()
            raise self.error(resp.status, data, what)
        return WatchStream(resp.response, self)

    def _open(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
              body: Any = None, content_type: str | None = None,
              timeout: tuple[float, float]) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        try:
            serialized = self.client.param_serialize(method, path, query_params=params,
                                                     header_params=headers, body=body,
                                                     auth_settings=["BearerToken"])
            return self.client.call_api(*serialized, _request_timeout=timeout)
        except StoreError:
            raise
        except Exception as err:  # urllib3/ssl/socket errors all mean: not reachable now
            raise self._unreachable(err) from None

    def _unreachable(self, err: BaseException) -> Unavailable:
        where = self.where + (f" (from network namespace {self.netns})" if self.netns else "")
        return Unavailable(f"the Kubernetes apiserver at {where} is not reachable: {_short(err)}",
                           hint="check the kubeconfig's server and that the cluster is up "
                                "(`kubectl --context ... get nodes`)")

    def error(self, status: int, body: bytes, what: str) -> StoreError:
        """The lace error for an apiserver's refusal of ``what``."""
        reason, message, details = _status_message(body)
        said = message or reason or f"HTTP {status}"
        if status == 404:
            return NotFound(f"{what} not found on the apiserver at {self.where}: {said}",
                            hint="for lace's own kinds: install lace's CRDs (deploy/crds)"
                            if "the server could not find the requested resource" in said else None)
        if status == 409 and reason == "AlreadyExists":
            return AlreadyExists(f"{what} already exists", hint="use `lace apply` to update it")
        if status == 409:
            return Conflict(f"{what} was modified since it was read: {said}",
                            hint="read it again, reapply the change and retry")
        if status == 410:
            return Gone(f"{what}: the apiserver no longer has that resourceVersion ({said})",
                        hint="list again and watch from the list's resourceVersion")
        if status == 401:
            return Unavailable(f"the apiserver at {self.where} refused lace's credentials for {what}: {said}",
                               hint="check the kubeconfig's user (or the pod's ServiceAccount token)")
        if status == 403:
            return Forbidden(f"the apiserver at {self.where} forbids {what}: {said}",
                             hint="grant lace's ServiceAccount that verb on that resource "
                                  "(deploy/rbac.yaml holds what lace needs)")
        if status == 422 or status == 400:
            causes = "; ".join(f'{c.get("field", "")}: {c.get("message", "")}'
                               for c in details.get("causes") or ()) or said
            return ValidationError(what, None, f"the apiserver rejected it: {causes}")
        if status == 429 or status >= 500:
            return Unavailable(f"the apiserver at {self.where} could not serve {what} now: {said}",
                               hint="retry; lace retries by itself with backoff")
        return StoreError(f"the apiserver at {self.where} refused {what}: HTTP {status} {said}")


class WatchStream:
    """One watch response: ``events()`` yields each JSON line; ``close()`` from any thread ends a
    blocked read (the socket is shut down, so the reader wakes at once)."""

    def __init__(self, response: Any, api: ApiServer) -> None:
        self.response = response
        self.api = api
        self.closed = False

    def events(self) -> Iterator[dict]:
        buf = b""
        try:
            for chunk in self.response.stream(4096, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        except ValueError as err:
            raise Unavailable(f"the apiserver at {self.api.where} sent a watch event that is not JSON: {err}") from None
        except Exception as err:
            if self.closed:
                return
            raise self.api._unreachable(err) from None
        if buf.strip() and not self.closed:
            yield json.loads(buf)

    def close(self) -> None:
        self.closed = True
        try:
            self.response.shutdown()   # wakes a reader blocked in recv (urllib3 >= 2.3)
        except Exception:
            pass
        try:
            self.response.release_conn()
        except Exception:
            pass


def _query_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _short(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    # urllib3 wraps the reason in long reprs; the innermost reason is what a person needs
    reason = getattr(err, "reason", None)
    if reason is not None and str(reason):
        text = str(reason)
    return text if len(text) < 200 else text[:200] + "..."


def _socket_in_netns(api_client: Any, netns: str) -> None:
    """Make every new connection of ``api_client``'s pool in network namespace ``netns``."""
    import urllib3

    def translate(err: nsenter.NetnsError) -> BaseException:
        return Unavailable(f"cannot enter network namespace {netns} to reach the apiserver: {err}",
                           hint="is the lab (or the test's namespace) still there?")

    old: urllib3.PoolManager = api_client.rest_client.pool_manager
    manager = urllib3.PoolManager(**old.connection_pool_kw)
    manager.pool_classes_by_scheme = netns_http.pool_classes(netns, translate)
    api_client.rest_client.pool_manager = manager


def load_api_client(*, kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """The official client's ApiClient for a kubeconfig context (in-cluster config when there is
    no kubeconfig and the process runs in a pod), and where it points, for messages."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    in_cluster = kubeconfig is None and context is None and "KUBERNETES_SERVICE_HOST" in os.environ
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=kubeconfig, context=context,
                                    client_configuration=configuration, persist_config=False)
    except (ConfigException, OSError, TypeError) as err:
        source = "the in-cluster service account" if in_cluster else (
            f"kubeconfig {kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'}"
            + (f" context {context}" if context else ""))
        raise StoreError(f"cannot load {source}: {err}",
                         hint="point k8s://CONTEXT?kubeconfig=PATH at a working kubeconfig") from None
    return client.ApiClient(configuration), configuration.host
