"""The host agent's parts (issue 28): the pieces that let a child outlive its supervisor --
the anchor (``anchor``) and the exit journal it writes (``exit_journal``), and the output files
a child writes itself (``output_files``). Groundwork: nothing outside this package imports it
yet. Standard library only, and nothing imported here: the anchor runs as
``python -m procledger.agent.anchor`` and must load no more than it needs."""
