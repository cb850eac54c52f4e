"""lace.controllers: control loops that turn stored objects into other stored objects.

``endpointslices`` keeps every Service's EndpointSlices in step with its pods, as Kubernetes'
EndpointSlice controller does: a pure function from (Service, Pods) to the desired slices, and a
level-triggered loop that watches the store and writes only the difference. ``python -m
lace.controllers --store FILE`` runs the controllers as one process (``lace lab up`` starts one
per lab).
"""
