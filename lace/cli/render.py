"""Rendering for ``lace`` and ``node``: tables (rich), ``-o json`` (one document), ``-o yaml``,
``-o name``, count lines and errors — and one rule for empty cells (:func:`cell`).

``lace get`` prints kubectl-style object tables: each kind's columns are declared once in
``COLUMNS``; ``wide`` columns appear with ``-o wide``.  The ``node`` commands print tables of map
entries (:func:`node_table`, :func:`plain_table`) ending with a count line (:func:`count_line`).

rich and YAML are imported only when a table or YAML is drawn: ``-o json`` never loads them.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TextIO

import orjson

from lace.store import kinds as K
from lace.store.selectors import format_selector

if TYPE_CHECKING:
    from rich.console import Console


# ---- empty cells: one rule -----------------------------------------------------------------------

TableKind = Literal["objects", "node"]

#: What an empty cell (no value: None or "") prints as, by the kind of table; :func:`cell` applies
#: it.  Object tables (``lace get``) print kubectl's ``<none>``, which readers and scripts used to
#: kubectl expect.  Node tables (``node bpf show``, ``node device list``, ``node ct gc``) print
#: ``-``, as ip, ss and bpftool print an unset field; the node commands' own texts use ``-`` for
#: "nothing here" too (``net red → -`` in ``node trace flow``).
EMPTY_CELL: dict[TableKind, str] = {"objects": "<none>", "node": "-"}

#: a cell left blank on purpose (the continuation rows of a multi-row entry): printed as nothing
BLANK = "\0"

#: how a routing entry flagged SERVICE_MAP_FULL reads (node bpf show routing, node verify)
SERVICE_MAP_FULL_ROUTE = "dropped: map-full (a service frontend the full services map left out)"


def cell(value: Any, table: TableKind = "objects") -> str:
    """A cell's text: ``BLANK`` is nothing, no value (None or "") is ``EMPTY_CELL[table]``,
    anything else ``str(value)``."""
    if value is BLANK:
        return ""
    return EMPTY_CELL[table] if value is None or value == "" else str(value)


# ---- errors ----------------------------------------------------------------------------------------

def print_error(stream: TextIO, message: str, hint: str | None = None) -> None:
    """``error: <message>`` and, when there is one, ``hint: <hint>`` — never a traceback."""
    stream.write(f"error: {message}\n")
    if hint:
        stream.write(f"hint: {hint}\n")
    stream.flush()


def print_unexpected(stream: TextIO, err: BaseException, env: Any) -> None:
    """The last line of defence of ``lace`` and ``node``: one line naming the exception, and the
    traceback only when LACE_DEBUG asks for it."""
    debug = bool(env.get("LACE_DEBUG"))
    if debug:
        import traceback
        traceback.print_exception(err, file=stream)
    print_error(stream, f"unexpected {type(err).__name__}: {err}",
                None if debug else "this is a bug in lace; set LACE_DEBUG=1 to see the traceback")


# ---- documents -------------------------------------------------------------------------------------

def dump_json(doc: Any) -> str:
    """One JSON document, indented for humans who page it (still one document)."""
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"


def write_json(stream: TextIO, doc: Any) -> None:
    """:func:`dump_json` to ``stream``, flushed (the node commands' ``-o json``)."""
    stream.write(dump_json(doc))
    stream.flush()


@functools.cache
def _yaml_dumper() -> Any:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    return Dumper


def dump_yaml(doc: Any) -> str:
    import yaml
    return yaml.dump(doc, Dumper=_yaml_dumper(), sort_keys=False, default_flow_style=False, allow_unicode=True)


def list_document(items: list[dict], resource_version: str = "") -> dict:
    """A Kubernetes ``List`` of objects, as ``kubectl get -o json`` prints one."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": resource_version},
            "items": items}


def write_document(stream: TextIO, doc: Any, fmt: str) -> None:
    stream.write(dump_json(doc) if fmt == "json" else dump_yaml(doc))


def object_name(obj: Mapping[str, Any]) -> str:
    """``pod/web``, ``network.lace.dev/blue``: ``-o name`` and apply's output."""
    info = K.kind_info(obj["kind"])
    return f"{info.qualified_singular}/{obj['metadata']['name']}"


# ---- cell helpers ------------------------------------------------------------------------------

def age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    """kubectl's AGE: 45s, 12m, 3h, 5d, 2y (with a second unit while short: 3m20s, 5h4m, 3d4h)."""
    if not timestamp:
        return cell(None)
    try:
        then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return cell(None)
    now = now or datetime.datetime.now(datetime.UTC)
    secs = max(0, int((now - then).total_seconds()))
    if secs < 120:
        return f"{secs}s"
    mins = secs // 60
    if mins < 10:
        return f"{mins}m{secs % 60}s" if secs % 60 else f"{mins}m"
    if mins < 180:
        return f"{mins}m"
    hours = mins // 60
    if hours < 8:
        return f"{hours}h{mins % 60}m" if mins % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    cur: Any = obj
    for part in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _join(values: Iterable[Any]) -> str:
    return cell(",".join(str(v) for v in values if v not in (None, "")))


def _labels(obj: Mapping[str, Any]) -> str:
    labels = _get(obj, "metadata", "labels") or {}
    return _join(f"{k}={v}" for k, v in labels.items())


def _pod_ips(pod: Mapping[str, Any]) -> str:
    ips = [e.get("ip") for e in (_get(pod, "status", "podIPs") or []) if isinstance(e, Mapping)]
    if not ips and _get(pod, "status", "podIP"):
        ips = [_get(pod, "status", "podIP")]
    return _join(ips)


def _routes(net: Mapping[str, Any]) -> str:
    out = []
    for r in _get(net, "spec", "routes") or []:
        text = r.get("to", "?")
        if r.get("cidrs"):
            text += "[" + " ".join(r["cidrs"]) + "]"
        if r.get("masquerade"):
            text += "(masq)"
        out.append(text)
    return _join(out)


def _node_status(node: Mapping[str, Any]) -> str:
    for cond in _get(node, "status", "conditions") or []:
        if cond.get("type") == "Ready":
            return "Ready" if cond.get("status") == "True" else "NotReady"
    return "Unknown"


def _node_ip(node: Mapping[str, Any]) -> str:
    return _join(a.get("address") for a in _get(node, "status", "addresses") or []
                 if a.get("type") == "InternalIP")


def _service_ports(svc: Mapping[str, Any]) -> str:
    """kubectl's PORT(S): ``80/TCP``, ``80:30080/TCP`` with a node port."""
    out = []
    for p in _get(svc, "spec", "ports") or []:
        text = str(p.get("port"))
        if p.get("nodePort"):
            text += f":{p['nodePort']}"
        out.append(f"{text}/{p.get('protocol', 'TCP')}")
    return _join(out)


def _service_external_ip(svc: Mapping[str, Any]) -> str:
    """kubectl's EXTERNAL-IP: a LoadBalancer's addresses (``<pending>`` before it has one)."""
    if _get(svc, "spec", "type") != "LoadBalancer":
        return cell(None)
    ingress = _get(svc, "status", "loadBalancer", "ingress") or []
    return _join(e.get("ip") or e.get("hostname") for e in ingress) if ingress else "<pending>"


def _first_and_more(values: list[str], limit: int = 3) -> str:
    """kubectl's list cell: the first three, ``+ N more...``, ``<unset>`` when empty."""
    text = ",".join(values[:limit])
    if len(values) > limit:
        return f"{text} + {len(values) - limit} more..."
    return text or "<unset>"


def _slice_ports(sl: Mapping[str, Any]) -> str:
    return _first_and_more([str(p["port"]) if p.get("port") is not None else (p.get("name") or "<unset>")
                            for p in sl.get("ports") or []])


def _slice_endpoints(sl: Mapping[str, Any]) -> str:
    return _first_and_more([a for ep in sl.get("endpoints") or [] for a in ep.get("addresses") or []])


def _pod_phase(pod: Mapping[str, Any]) -> str:
    if _get(pod, "metadata", "deletionTimestamp"):
        return "Terminating"
    return _get(pod, "status", "phase") or "Pending"


def _pod_ready(pod: Mapping[str, Any]) -> str:
    """Ready containers / containers, as kubectl shows them (from status.containerStatuses; before
    the kubelet reports them, from the Ready condition)."""
    containers = _get(pod, "spec", "containers") or []
    statuses = _get(pod, "status", "containerStatuses") or []
    if statuses:
        ready = sum(1 for c in statuses if isinstance(c, Mapping) and c.get("ready"))
        return f"{ready}/{max(len(containers), len(statuses))}"
    conds = _get(pod, "status", "conditions") or []
    ok = any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    return f"{len(containers) if ok else 0}/{len(containers)}"


def _pod_restarts(pod: Mapping[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in _get(pod, "status", "containerStatuses") or []
               if isinstance(c, Mapping))


def _allocation_value(rec: Mapping[str, Any]) -> Any:
    spec = rec.get("spec") or {}
    return next((spec[k] for k in ("ip", "port", "id") if k in spec), None)


def _selector_map(sel: Mapping[str, Any] | None) -> str:
    return _join(f"{k}={v}" for k, v in (sel or {}).items())


@dataclasses.dataclass(frozen=True)
class Column:
    """One table column: its header, how to compute a cell, and whether only ``-o wide`` shows it."""

    header: str
    cell: Callable[[Mapping[str, Any]], Any]
    wide: bool = False


_NAME = Column("NAME", lambda o: o["metadata"]["name"])
_AGE = Column("AGE", lambda o: age(_get(o, "metadata", "creationTimestamp")))
_LABELS = Column("LABELS", _labels, wide=True)

COLUMNS: dict[str, list[Column]] = {
    "Pod": [_NAME,
            Column("NODE", lambda o: cell(_get(o, "spec", "nodeName"))),
            Column("NETWORK", K.pod_network),
            Column("IPS", _pod_ips),
            Column("READY", _pod_ready),
            Column("PHASE", _pod_phase),
            Column("RESTARTS", _pod_restarts),
            _AGE, _LABELS],
    "Namespace": [_NAME, Column("STATUS", lambda o: _get(o, "status", "phase") or "Active"), _AGE, _LABELS],
    "Node": [_NAME, Column("STATUS", _node_status), Column("INTERNAL-IP", _node_ip),
             Column("POD-CIDRS", lambda o: _join(_get(o, "spec", "podCIDRs") or [])), _AGE, _LABELS],
    "Network": [_NAME, Column("ID", lambda o: cell(_get(o, "status", "id") or None)),
                Column("CIDRS", lambda o: _join(_get(o, "spec", "cidrs") or [])),
                Column("ROUTES", _routes), _AGE,
                Column("SERVICE-CIDRS", lambda o: _join(_get(o, "spec", "serviceCIDRs") or []), wide=True),
                Column("IMPORTS", lambda o: _join(_get(o, "spec", "importServices") or []), wide=True),
                _LABELS],
    "NetworkPolicy": [_NAME, Column("POD-SELECTOR", lambda o: format_selector(_get(o, "spec", "podSelector"))
                                    if _get(o, "spec", "podSelector") else "<all>"),
                      Column("POLICY-TYPES", lambda o: _join(_get(o, "spec", "policyTypes") or []), wide=True),
                      _AGE, _LABELS],
    "Service": [_NAME, Column("TYPE", lambda o: _get(o, "spec", "type") or "ClusterIP"),
                Column("CLUSTER-IP", lambda o: cell(_get(o, "spec", "clusterIP"))),
                Column("EXTERNAL-IP", _service_external_ip),
                Column("PORT(S)", _service_ports), _AGE,
                Column("SELECTOR", lambda o: _selector_map(_get(o, "spec", "selector")), wide=True),
                Column("NETWORK", K.pod_network, wide=True), _LABELS],
    "EndpointSlice": [_NAME, Column("ADDRESSTYPE", lambda o: o.get("addressType")),
                      Column("PORTS", _slice_ports), Column("ENDPOINTS", _slice_endpoints), _AGE, _LABELS],
    "ServiceCIDR": [_NAME, Column("CIDRS", lambda o: _join(_get(o, "spec", "cidrs") or [])), _AGE, _LABELS],
    "LoadBalancerIPPool": [_NAME, Column("CIDRS", lambda o: _join(_get(o, "spec", "cidrs") or [])), _AGE,
                           _LABELS],
    "ServiceAllocation": [_NAME, Column("RESOURCE", lambda o: _get(o, "spec", "resource")),
                          Column("VALUE", lambda o: cell(_allocation_value(o))),
                          Column("NETWORK", lambda o: cell(_get(o, "spec", "network"))),
                          Column("SERVICE", lambda o: _get(o, "spec", "service")), _AGE],
    "Segment": [_NAME, Column("ID", lambda o: cell(_get(o, "status", "id") or None)),
                Column("NETWORK", lambda o: _get(o, "spec", "network")),
                Column("NAMESPACE", lambda o: cell(_get(o, "spec", "namespace"))),
                Column("LABELS", lambda o: _selector_map(_get(o, "spec", "labels"))), _AGE],
    "IPBlock": [_NAME, Column("NETWORK", lambda o: _get(o, "spec", "network")),
                Column("NODE", lambda o: _get(o, "spec", "node")),
                Column("CIDR", lambda o: _get(o, "spec", "cidr")), _AGE],
    "IPLease": [_NAME, Column("NETWORK", lambda o: _get(o, "spec", "network")),
                Column("NODE", lambda o: _get(o, "spec", "node")),
                Column("IP", lambda o: _get(o, "spec", "ip")),
                Column("POD", lambda o: _get(o, "spec", "pod")), _AGE,
                Column("BLOCK", lambda o: cell(_get(o, "spec", "block")), wide=True),
                Column("CONTAINER-ID", lambda o: cell(_get(o, "spec", "containerID"))[:12], wide=True),
                Column("IFNAME", lambda o: cell(_get(o, "spec", "ifname")), wide=True)],
}

_NAMESPACE = Column("NAMESPACE", lambda o: o["metadata"].get("namespace", ""))


def table_rows(kind: str, items: list[dict], *, wide: bool = False,
               all_namespaces: bool = False) -> tuple[list[str], list[list[str]]]:
    """Headers and cell strings of a kind's table (pure: the tests and other renderers use it)."""
    columns = [c for c in COLUMNS[kind] if wide or not c.wide]
    if all_namespaces and K.kind_info(kind).namespaced:
        columns.insert(0, _NAMESPACE)
    headers = [c.header for c in columns]
    rows = [[str(c.cell(obj)) for c in columns] for obj in items]
    return headers, rows


# ---- tables -----------------------------------------------------------------------------------------

def render_table(console: Console, headers: list[str], rows: list[list[str]]) -> None:
    """A borderless kubectl-like table of cell strings (printed as they are: no rich markup);
    trailing blanks are trimmed so output diffs cleanly."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
    table = Table(box=None, pad_edge=False, show_edge=False, expand=False,
                  header_style="bold" if console.is_terminal else None, padding=(0, 3, 0, 0))
    for h in headers:
        table.add_column(h, no_wrap=True, overflow="fold")
    for row in rows:
        # cells are data, never markup: "[fd00::1]:80" must print as it is
        table.add_row(*(Text(c) for c in row))
    buf = io.StringIO()
    tmp = Console(file=buf, width=console.width, force_terminal=console.is_terminal,
                  color_system=console.color_system and "auto", no_color=console.no_color,
                  highlight=False, emoji=False)
    tmp.print(table)
    console.file.write("\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n")
    console.file.flush()


def render_objects(console: Console, kind: str, items: list[dict], *, wide: bool = False,
                   all_namespaces: bool = False) -> None:
    headers, rows = table_rows(kind, items, wide=wide, all_namespaces=all_namespaces)
    render_table(console, headers, rows)


# ---- the node commands' tables ---------------------------------------------------------------------

def node_table(console: Console, headers: list[str], rows: list[list[Any]]) -> None:
    """A node table: cells by :func:`cell`'s node rule (``-`` when empty), drawn by :func:`render_table`."""
    render_table(console, headers, [[cell(c, "node") for c in r] for r in rows])


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def plain_table(stream: TextIO, env: Any, headers: list[str], rows: list[list[Any]]) -> bool:
    """What :func:`node_table` prints when the output is not a terminal — left-aligned columns
    three spaces apart, trailing blanks trimmed — without importing rich (a small table should not
    cost a command like ``ct gc`` a tenth of a second).  False, and nothing written, when the
    output is a terminal, ``COLUMNS`` is set or a cell is not plain ASCII: then use
    :func:`node_table`."""
    if _isatty(stream) or env.get("COLUMNS"):
        return False
    cells = [list(headers)] + [[cell(c, "node") for c in r] for r in rows]
    if not all(c.isascii() and c.isprintable() for r in cells for c in r):
        return False
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if sum(widths) + 3 * len(widths) > 4096:  # the console width rich would wrap at
        return False
    stream.write("".join("   ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in cells))
    stream.flush()
    return True


def human_duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h5m``, ``3d4h`` (two units at most); negative durations are ``-3s``.
    (The node commands' durations; object tables print kubectl's AGE, :func:`age`.)"""
    if seconds < 0:
        return "-" + human_duration(-seconds)
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s}s" if s else f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m}m" if m else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d{h}h" if h else f"{d}d"


def pressure(count: int, capacity: int) -> str:
    """A map's fill: ``3/4096 entries (0.1% full)``."""
    pct = 100.0 * count / capacity if capacity else 0.0
    return f"{count}/{capacity} entries ({pct:.1f}% full)"


def plural(n: int, noun: str) -> str:
    if n == 1 and noun.endswith("ies"):
        return f"1 {noun[:-3]}y"
    if n == 1 and noun.endswith("s"):
        return f"1 {noun[:-1]}"
    return f"{n} {noun}"


def count_line(console: Console, what: str, shown: int, total: int, capacity: int | None = None,
               noun: str = "entries", map_entries: int | None = None) -> None:
    """The line that ends every node listing: how many, how many shown (--limit), and the map's
    pressure (entries/capacity) when it has one; ``map_entries`` when rows are not map entries."""
    text = plural(total, noun)
    if shown < total:
        text = f"showing {shown} of {text} (--limit)"
    if capacity:
        text += f", map {pressure(total if map_entries is None else map_entries, capacity)}"
    console.file.write(f"{what}: {text}\n")
    console.file.flush()


def empty(console: Console, what: str, capacity: int | None = None) -> None:
    """What a node listing prints instead of an empty table: ``routing is empty (capacity 4096)``."""
    cap = f" (capacity {capacity})" if capacity else ""
    console.file.write(f"{what} is empty{cap}\n")
    console.file.flush()
