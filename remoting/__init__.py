"""The servers' HTTP runtime: the HTTP/1.1 protocol (:mod:`remoting.http`) and the server over it
(:mod:`remoting.server`) the broker, the nameserver and the dashboard serve with, the router their endpoints are
registered in, and the ACL gate that checks a request before its handler runs.

It imports :mod:`common` and nothing else of the project; the SDK (``client``) does not import it, but for the
dashboard, which is a server.
"""
