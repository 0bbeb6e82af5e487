"""The host agent (docs/design.md §18): one supervisor per user, host and ledger for every
background process, which its children never depend on. The anchor (``anchor``) and its exit
journal (``exit_journal``), the control socket (``control_socket``, ``control_client``),
adoption identity (``adoption``), the agent (``host``, ``orders``, ``takeover``, ``held``) and
how a client reaches or starts it (``places``, ``launch``). Nothing is imported here: the anchor
runs as ``python -m procledger.agent.anchor`` and must load no more than it needs."""
