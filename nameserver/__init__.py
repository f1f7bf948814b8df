"""SplitMQ nameserver: the route table (:mod:`nameserver.routeinfo`, pure state), its HTTP app and expiry scan
(:mod:`nameserver.server`), and the ``python -m nameserver`` entry point (:mod:`nameserver.__main__`)."""
