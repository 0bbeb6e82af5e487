"""The hot commands' bodies: ``ps``, ``show``, ``feed`` (``listing``, ``showing``), ``logs``
(``output``), ``wait`` (``waiting``), ``stop`` (``stopping``), ``agent status``
(``agent_status``) -- over ``reads.LedgerReads``, whichever path opened it (docs/design.md
§8.1). Nothing here imports typer, click, pydantic, eventsourcing, rich, psycopg, cryptography
or psutil at module level; the full stack is imported only on the full path.
"""
