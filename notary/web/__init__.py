"""The notary's web pages for people: pure rendering and static assets.

``pages`` renders HTML (every string from outside escaped), ``timeline_svg``
draws a target's certificate history, ``certificates`` reads the details a
person wants from a certificate, ``headers`` holds the security headers of
every page, ``assets`` the static files shipped in ``static/``. Nothing here
does I/O or imports Trio: the router that serves them, and awaits the query
service, is ``notary.server.web``.
"""
