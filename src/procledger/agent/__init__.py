"""The host agent's parts (issue 28): the pieces that let a child outlive its supervisor.

Groundwork only: nothing outside this package imports it yet.
"""
