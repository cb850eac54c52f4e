"""The CNI protocol's constants, shared by the plugin, the agent that serves it and the lab's
runtime: the version lace speaks, the versions it accepts, and the error codes of a CNI error
result (1-99 are the spec's, 100 and up lace's own). Stdlib only: the plugin imports it at start."""

#: the CNI version lace implements and answers with
CNI_VERSION = "1.1.0"
#: versions a network configuration may ask for
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

# the spec's error codes
E_INCOMPATIBLE = 1          # incompatible CNI version
E_UNKNOWN_CONTAINER = 3     # unknown container (CHECK of something never added)
E_INVALID_ENV = 4           # invalid or missing CNI_* environment
E_IO = 5                    # I/O failure
E_DECODE = 6                # could not decode the network configuration
E_INVALID_CONFIG = 7        # invalid network configuration
E_TRY_AGAIN = 11            # temporary failure: the runtime retries later
E_NOT_READY = 50            # STATUS: the plugin cannot serve ADD now

# lace's own
E_IPAM_EXHAUSTED = 100      # no address left in the pod's network on this node
E_POD_UNKNOWN = 101         # the pod is not in the store


def error_result(code: int, msg: str, details: str = "", version: str = CNI_VERSION) -> dict:
    """A CNI error result document."""
    return {"cniVersion": version, "code": code, "msg": msg, "details": details}
