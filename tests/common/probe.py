# SPDX-License-Identifier: Apache-2.0
"""An engine's state as its probe server's /state reports it, for tests that wait on it."""
import http.client
import json


def engine_state(probe_port, timeout=1.0):
    """The state in lower case ("active", "standby", ...), or None while the
    probe server does not answer or answers something that is not its JSON
    (an engine starting, stopping or gone)."""
    c = http.client.HTTPConnection("127.0.0.1", probe_port, timeout=timeout)
    try:
        c.request("GET", "/state")
        return json.loads(c.getresponse().read()).get("state", "").lower()
    except (OSError, ValueError, AttributeError, http.client.HTTPException):
        return None
    finally:
        c.close()
