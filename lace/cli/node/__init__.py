"""The ``node`` command (console script ``node``, entry :func:`lace.cli.node.main.entry`): what one
node's data plane holds and decides.

    main.py     the parser, ``main(argv, env) -> ExitStatus`` and the console script's ``entry``
    bpf.py      node bpf show MAP
    ct.py       node ct list|gc TABLE (ct_dump.py: a table as NumPy columns; ct_json.py: ``-o json``
                streaming; ct_text.py: the lines)
    trace.py    node trace flow
    device.py   node device list
    env.py      NodeEnv: where the node's state lives (pin root, store, node name, agent socket)
    resolve.py  ID -> name resolution through the store (never with -n)

Tables, count lines and ``-o json`` come from :mod:`lace.cli.render` (shared with ``lace``, one
rule for empty cells); ``ct list``'s million-row text from :mod:`lace.textcols`.

Every command reads the pinned maps directly, so it works with the agent down, and opens the
store only to resolve names.  This package imports nothing itself: ``main`` imports only the
command group named on the command line.
"""
