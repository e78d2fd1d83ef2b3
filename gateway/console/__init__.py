"""The server side of the browser console (docs/browser-console.md); the page itself is in
``ui/``.

* ``static.py``: the page's files, read once from the package and served with a strict
  Content-Security-Policy, without the token (they hold no data);
* ``tickets.py``: the one-time tickets a page that holds the token puts in a WebSocket upgrade's
  URL, since a browser cannot give the upgrade an ``Authorization`` header;
* ``origin.py``: the ``Origin`` check that keeps other web pages off a gateway they can reach.
"""

from gateway.console.origin import OriginForbidden, check_origin
from gateway.console.static import CSP, load_static, static_response
from gateway.console.tickets import MAX_TICKETS, MAX_TICKETS_PER_OWNER, TICKET_TTL_SEC, TicketStore

__all__ = [
    "CSP",
    "MAX_TICKETS",
    "MAX_TICKETS_PER_OWNER",
    "TICKET_TTL_SEC",
    "OriginForbidden",
    "TicketStore",
    "check_origin",
    "load_static",
    "static_response",
]
