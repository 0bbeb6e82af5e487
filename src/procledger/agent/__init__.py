"""The host agent (issue 28); so far its anchor (``anchor``) and the exit journal it writes
(``exit_journal``). Standard library only, and nothing imported here: the anchor runs as
``python -m procledger.agent.anchor`` and must load no more than it needs."""
