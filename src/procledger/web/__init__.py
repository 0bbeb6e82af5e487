"""The web view of the ledger, ``procledger serve`` (docs/design.md §16): a small ASGI app that
shows the processes and their output live, driven by the change feed.

- ``app``: the Starlette application, its routes and the server that runs it.
- ``auth``: the access token, the session cookie it becomes, CSRF, and the headers every
  response carries.
- ``hub``: one poller of the change feed per server, fanned out to every stream.
- ``streams``: the Server-Sent Events responses (changes, output).
- ``pages``: the HTML pages and the Stop and Abandon actions.
- ``api``: the JSON API under ``/api/``, in the CLI's ``--json`` shapes.
- ``views``: what the pages and streams show of a record, and the list filters.

starlette, uvicorn and jinja2 are the ``procledger[web]`` extra; nothing outside this package
imports them, and only ``procledger serve`` imports this package.
"""
