"""Services as the datapath sees them: frontends (a VIP, port and protocol in the source networks
it serves) with their active and terminating backends, built from Service and EndpointSlice
objects (``model``), and one node's services, backends and Maglev entries from them (``program``).
"""
