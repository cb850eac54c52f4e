"""lace-operator: cluster-scoped allocation on a Kubernetes cluster (one leader at a time).

In the lab, the lab itself registers nodes with their locators, and the store allocates network
IDs as Networks are written through lace. On Kubernetes, Nodes register themselves and users may
write Networks with kubectl, so the operator does what nobody else does there: it creates the
default Network, gives Networks without one their ID, gives each Node its node ID, locator and
underlay address (annotations the agents read), and takes each node's first pod block of the
default network. It uses the same Store and allocators as every other component.
"""
