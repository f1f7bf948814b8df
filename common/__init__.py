"""What the SDK and the servers both speak, and nothing else: the wire and disk formats, codes, errors, names and
signing. RocketMQ keeps the same split (``common`` and ``remoting`` under ``client`` and ``broker``).

Every module here is pure in the sense that matters for layering: it opens no socket and starts no thread or
task, and it imports nothing from the packages above it (``client``, ``remoting``, ``broker``, ``nameserver``).

- :mod:`common.codec`: commit-log records, send batches and message ids (the one place that reads or writes them).
- :mod:`common.wire`: the binary send and pull replies, the JSON error body and the HTTP status of each code.
- :mod:`common.requests`: the query arguments of ``/send`` and ``/pull``, and the query string's one parser.
- :mod:`common.codes`: RocketMQ's response codes, send and pull statuses, permissions and flags.
- :mod:`common.errors`: the exception tree (re-exported to users as :mod:`client.errors`).
- :mod:`common.message`, :mod:`common.properties`, :mod:`common.route`, :mod:`common.selector`,
  :mod:`common.sql92`, :mod:`common.transaction`, :mod:`common.queue_lock`: the models and formats around them.
- :mod:`common.signing`: the ACL's request signature (both sides), :mod:`common.tls`: the TLS contexts both ends
  build, :mod:`common.tcp`: the TCP options both ends set.
"""
