"""The ``node`` command's internals: one module per command group (bpf show, ct, trace, device),
the node context (pin root, store, agent socket), ID -> name resolution and rendering.

``lace.cli.node`` is the thin entry point; everything here reads pinned maps directly, so the
commands work with the agent down, and opens the store only to resolve names (never with -n).
"""
