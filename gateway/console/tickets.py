"""One-time WebSocket tickets of the browser console (docs/browser-console.md).

A browser cannot put ``Authorization`` on a WebSocket upgrade, and a token in a URL ends up in logs
and history. So a page that holds the token asks ``POST /v1/session/{id}/ws-ticket`` (authenticated
as usual) for a ticket and puts that in the upgrade's URL instead: random, good once, for that
session only, for ``TICKET_TTL_SEC`` seconds, spent only by an upgrade that succeeds (one refused
for another reason, or a plain GET, leaves it usable). ``TicketStore`` keeps at most
``MAX_TICKETS`` unused ones, and at most ``MAX_TICKETS_PER_OWNER`` of one user (the server's
``ticket_owner``, gateway/server/routes/console.py), so one client cannot take them all; each
carries the identity (user, role) of whoever asked for it, which the upgrade it opens is; past
either a new one is refused (429 ``TOO_MANY_TICKETS``) rather than an older one dropped. It is
sans-IO: the caller passes the clock.
"""

from __future__ import annotations

import secrets
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Final

from gateway.team.roles import LOCAL, Identity

__all__ = ["MAX_TICKETS", "MAX_TICKETS_PER_OWNER", "TICKET_TTL_SEC", "TicketStore"]

TICKET_TTL_SEC: Final = 30
MAX_TICKETS: Final = 1024  # unused tickets held at once, across all sessions
MAX_TICKETS_PER_OWNER: Final = 64  # unused tickets of one user


@dataclass(frozen=True, slots=True)
class _Ticket:
    session_id: str
    expires_at: float
    owner: str  # the user it counts against (MAX_TICKETS_PER_OWNER)
    identity: Identity  # who asked for it: the upgrade it opens is theirs


class TicketStore:
    """One-time WebSocket tickets: ``issue`` for a session, ``valid`` until they expire, ``spend``
    once (by the upgrade that succeeds)."""

    def __init__(
        self,
        *,
        ttl_sec: float = TICKET_TTL_SEC,
        capacity: int = MAX_TICKETS,
        per_owner: int = MAX_TICKETS_PER_OWNER,
    ) -> None:
        self.ttl_sec = ttl_sec
        self.capacity = capacity
        self.per_owner = per_owner
        self._tickets: OrderedDict[str, _Ticket] = OrderedDict()  # oldest first
        self._owners: Counter[str] = Counter()  # unused tickets per owner

    def __len__(self) -> int:
        return len(self._tickets)

    def _drop(self, ticket: str) -> _Ticket | None:
        entry = self._tickets.pop(ticket, None)
        if entry is not None:
            self._owners[entry.owner] -= 1
            if not self._owners[entry.owner]:
                del self._owners[entry.owner]
        return entry

    def _expire(self, now: float) -> None:
        while self._tickets:
            ticket, entry = next(iter(self._tickets.items()))
            if entry.expires_at > now:
                break
            self._drop(ticket)

    def issue(
        self, session_id: str, now: float, owner: str = "", identity: Identity = LOCAL
    ) -> str | None:
        """A new ticket for ``session_id`` carrying ``identity``, or ``None`` when ``capacity``
        unused ones exist, or ``per_owner`` of ``owner``'s."""
        self._expire(now)
        if len(self._tickets) >= self.capacity or self._owners[owner] >= self.per_owner:
            return None
        ticket = secrets.token_urlsafe(32)
        self._tickets[ticket] = _Ticket(session_id, now + self.ttl_sec, owner, identity)
        self._owners[owner] += 1
        return ticket

    def valid(self, ticket: str, session_id: str, now: float) -> Identity | None:
        """The identity of ``ticket`` if it was issued for ``session_id``, is not expired and not
        spent (None otherwise).

        A ticket presented for another session is dropped: it was shown where it does not belong,
        so it must not work anywhere afterwards.
        """
        self._expire(now)
        entry = self._tickets.get(ticket)
        if entry is not None and entry.session_id != session_id:
            self._drop(ticket)
            return None
        return entry.identity if entry is not None else None

    def spend(self, ticket: str) -> bool:
        """Use ``ticket`` up; False if it was spent (or dropped) already."""
        return self._drop(ticket) is not None
