"""DLedger mode (issue 12, docs/SEMANTICS.md 9): a Raft-replicated commit log with leader election.

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

The broker side:

* :mod:`broker.dledger.message_store` -- the broker's store on the DLedger log: one entry per send holds its
  records, consume queues and the index are built from committed entries only;
* :mod:`broker.dledger.roles` -- the role-change handler: the member's role becomes the broker's (docs/SEMANTICS.md 9.8).

Not built: changing a group's members while it runs (docs/DLEDGER.md).
"""
