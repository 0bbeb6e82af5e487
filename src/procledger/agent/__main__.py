"""``python -m procledger.agent``: the agent itself, as the anchor starts it (docs/design.md
§18). Not the CLI: the agent lives for days beside a thousand children, and the CLI's own
stack (typer, click, rich) would be memory it never uses. Its ledger is ``$PROCLEDGER_URL``
(or the default), as ``procledger agent start`` set it."""

import sys

from procledger.agent.host import serve_ledger

sys.exit(serve_ledger(None))
