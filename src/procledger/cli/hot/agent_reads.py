"""A PostgreSQL ledger's reads, asked of this host's agent for it over its socket: the agent
holds the connections (and psycopg), so a hot command need not load them for one query
(docs/design.md §8.1). The agent answers with ``LedgerReads``' own results, computed on its
full path; an error comes back as its class and message and is raised again here, so the line
printed is the one the full path prints.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from procledger.agent.launch import ask, ping
from procledger.agent.places import AgentPlaces
from procledger.application.document_reads import Document, LedgerReads, NeedsFullPath
from procledger.domain import errors
from procledger.domain.errors import AgentError, ProcledgerError

__all__ = ["agent_reads", "raised_again"]

READ_TIMEOUT_S = 30.0
"""A read rides through what the agent's store rides through (a database restart)."""
PING_TIMEOUT_S = 5.0
"""How long an agent that accepted the connection may take to answer before the command takes
the full path instead: a machine busy for a moment (twenty interpreters starting on two cores)
delays an answer by seconds, and the full path would be slower still there. An agent that is
not running is known at once (no socket, or a refused connection)."""


def agent_reads(store_key: str) -> LedgerReads:
    """The reads of the ledger ``store_key`` through its agent on this host; ``NeedsFullPath``
    when none answers."""
    try:
        places = AgentPlaces.of(store_key, create=False)
        answered = ping(places, timeout=PING_TIMEOUT_S) is not None
    except (ProcledgerError, OSError):
        answered = False
    if not answered:
        raise NeedsFullPath
    return _AgentReads(places, store_key)


class _AgentReads(LedgerReads):
    def __init__(self, places: AgentPlaces, store_key: str) -> None:
        super().__init__(_unused, store_key=store_key, close=_nothing)
        self._places = places

    def _ask(self, method: str, *args: Any) -> Any:
        try:
            answer = ask(
                self._places, {"op": "read", "method": method, "args": list(args)}, READ_TIMEOUT_S
            )
        except AgentError as error:
            raise raised_again(error) from None
        return answer["value"]

    def record(self, process_id: str) -> Document:
        return self._ask("record", process_id)  # type: ignore[no-any-return]

    def resolve(self, text: str) -> str:
        return str(self._ask("resolve", text))

    def newest_first(
        self, conditions: list[Any], limit: int | None, before: tuple[int, str] | None
    ) -> tuple[list[Document], list[str], tuple[int, str] | None]:
        records, damaged, last = self._ask("newest_first", conditions, limit, before)
        return records, damaged, None if last is None else (int(last[0]), str(last[1]))

    def changes_since(self, cursor: int, limit: int) -> tuple[list[Document], int]:
        records, after = self._ask("changes_since", cursor, limit)
        return records, int(after)

    def events(self, process_id: str) -> list[Document]:
        return self._ask("events", process_id)  # type: ignore[no-any-return]

    def attempts(self, process_id: str) -> list[Document]:
        return self._ask("attempts", process_id)  # type: ignore[no-any-return]

    def newest_attempt(self, process_id: str) -> Document:
        return self._ask("newest_attempt", process_id)  # type: ignore[no-any-return]

    def wanted_up(self, name: str) -> bool:
        return bool(self._ask("wanted_up", name))

    def holders(self, process_ids: Iterable[str]) -> dict[str, Document]:
        wanted = list(process_ids)
        return {} if not wanted else self._ask("holders", wanted)


def raised_again(error: AgentError, fallback: Exception | None = None) -> Exception:
    """The agent's error reply as the error the full path would have raised: a
    ``ProcledgerError`` of the class it names, with its message; any other reply (the agent
    went away, a reply too large) is ``fallback`` -- by default, the command goes down the
    full path."""
    kind = getattr(errors, error.type, None)
    if not (isinstance(kind, type) and issubclass(kind, ProcledgerError)) or kind is AgentError:
        return NeedsFullPath() if fallback is None else fallback
    again = kind.__new__(kind)
    Exception.__init__(again, error.message)
    return again


def _unused(read: Any) -> Any:
    raise NeedsFullPath  # every read is asked of the agent


def _nothing() -> None:
    """Nothing to close: each question was its own connection."""
