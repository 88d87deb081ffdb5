"""The node's web console: server-rendered pages over the same gateway as the HTTP API.

Served by the API's ASGI app under ``/console/`` (:func:`flows.rpc.console.routes.console_routes`,
mounted by :func:`flows.rpc.app.build_app`). One module per job: ``sessions.py`` (logins and
CSRF tokens), ``forms.py`` (form bodies and the start form's arguments), ``throughput.py``
(finished flows over the last minute), ``pages.py`` (Jinja2 templates, security headers) and
``routes.py`` (the pages and the permission each needs). docs/console.md describes them.
"""
