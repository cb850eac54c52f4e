"""``lace connectivity test``: named connectivity scenarios run against a live cluster (the lab).

The pure parts — the scenarios as data and their selection (:mod:`.scenarios`), judging a check's
answer and the flows seen during it (:mod:`.judge`), JUnit XML (:mod:`.junit`) — import nothing
heavy; :mod:`.runner` deploys the test's own pods and runs them; :mod:`.pmtu` is the stdlib-only
large-payload check that runs inside a pod.  Importing this package costs nothing: ``python -m
lace.cli.connectivity.pmtu`` starts in a fresh pod namespace.
"""
