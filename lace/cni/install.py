"""``python -m lace.cni.install``: put the CNI plugin and lace's conflist on a Kubernetes node.

Run by the ``lace-node`` DaemonSet's init container with the host's CNI directories mounted. The
plugin is lace's stdlib-only ``lace.cni`` package as one executable zipapp (``lace-cni``), so the
host needs only ``python3`` (3.11 or later) and nothing of lace's dependencies; the conflist
points it at the agent's socket, a hostPath shared with the lace-node pod. Both files are
written to a temporary name and renamed, so the container runtime never reads half a file; a
conflist already there and the same is left alone (no needless CNI reconfiguration).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import zipfile

import lace
from lace.cni.spec import CNI_VERSION

PLUGIN = "lace-cni"
CONFLIST = "05-lace.conflist"
MAIN = "import sys\nfrom lace.cni.plugin import main\nsys.exit(main())\n"
#: every zipapp entry's timestamp (zip's earliest): the bytes depend on the sources only
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def plugin_zipapp() -> bytes:
    """The plugin as an executable zipapp: a shebang line, then lace/__init__ and lace/cni/*.py.

    The same sources give the same bytes: every entry has a fixed date (not now, not the file's
    mtime) and fixed permissions, so an installer run finds an unchanged plugin unchanged.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(lace.__file__)))
    cni = os.path.join(root, "lace", "cni")
    entries = [("__main__.py", MAIN.encode())]
    with open(os.path.join(root, "lace", "__init__.py"), "rb") as f:
        entries.append(("lace/__init__.py", f.read()))
    for name in sorted(os.listdir(cni)):
        if name.endswith(".py"):
            with open(os.path.join(cni, name), "rb") as f:
                entries.append((f"lace/cni/{name}", f.read()))
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w") as z:
        for arcname, data in entries:
            info = zipfile.ZipInfo(arcname, date_time=ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return buf.getvalue()


def conflist(socket: str) -> dict:
    return {"cniVersion": CNI_VERSION, "name": "lace",
            "plugins": [{"type": PLUGIN, "agentSocket": socket}]}


def _write(path: str, data: bytes, mode: int) -> bool:
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    tmp = f"{path}.lace-tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def install(bin_dir: str, conf_dir: str, socket: str) -> list[str]:
    """Install the plugin and the conflist; returns the paths that changed."""
    changed = []
    for d in (bin_dir, conf_dir):
        os.makedirs(d, exist_ok=True)
    plugin = os.path.join(bin_dir, PLUGIN)
    if _write(plugin, plugin_zipapp(), 0o755):
        changed.append(plugin)
    conf = os.path.join(conf_dir, CONFLIST)
    if _write(conf, (json.dumps(conflist(socket), indent=2) + "\n").encode(), 0o644):
        changed.append(conf)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lace-cni-install", description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", default="/host/opt/cni/bin")
    ap.add_argument("--conf-dir", default="/host/etc/cni/net.d")
    ap.add_argument("--socket", default="/var/run/lace/agent.sock",
                    help="the agent's socket as the host sees it")
    args = ap.parse_args(argv)
    try:
        changed = install(args.bin_dir, args.conf_dir, args.socket)
    except OSError as err:
        print(f"error: cannot install the CNI plugin: {err}", file=sys.stderr)
        print("hint: mount the host's /opt/cni/bin and /etc/cni/net.d into the init container", file=sys.stderr)
        return 1
    print("installed " + (", ".join(changed) if changed else "nothing new (already in place)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
