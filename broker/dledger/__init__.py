"""DLedger mode (issue 12, SEMANTICS.md 9): a Raft-replicated commit log with leader election.

Pure state first, each module a table of rules with no I/O (the house rule of ``broker/ha/``):

* :mod:`broker.dledger.member` -- the member state (role, term, vote, leader, ledger end) and its transitions;
* :mod:`broker.dledger.election` -- vote and heartbeat handling, the candidate's count of votes, the timers;
* :mod:`broker.dledger.quorum` -- the leader's pending appends and peer watermarks, the quorum index;
* :mod:`broker.dledger.dispatcher` -- the leader's per-follower COMPARE / TRUNCATE / APPEND states;
* :mod:`broker.dledger.follower` -- the follower's parked appends and their gap timeout;
* :mod:`broker.dledger.entry` -- the entry and index byte formats;
* :mod:`broker.dledger.protocol` -- the peer protocol's frames;
* :mod:`broker.dledger.store` -- the log on disk: data and index files, checkpoint, ``currterm``, recovery,
  truncation;
* :mod:`broker.dledger.transport` -- the peer connections, with a fault layer for tests;
* :mod:`broker.dledger.node` -- one member at work: election with pre-vote, replication, quorum, commit.

Still to come (issue 12, items 2-5): dispatching committed entries into the broker's consume queues, the
broker's role-change handling and ``.properties`` keys, the SDK's write failover, ``LocalCluster(mode=
"dledger")``, the CLI and the benchmarks.
"""
