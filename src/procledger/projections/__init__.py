"""Read models built from the event log (docs/design.md §5): change feed, lists and filters, handle
grants and summaries, session deletion, pruning, rebuild."""

from procledger.projections.feed import ChangeCursor
from procledger.projections.filters import ProcessListFilter
from procledger.projections.handles import HandleSummary
from procledger.projections.reports import PruneReport, SessionDeleteReport

__all__ = [
    "ChangeCursor",
    "HandleSummary",
    "ProcessListFilter",
    "PruneReport",
    "SessionDeleteReport",
]
