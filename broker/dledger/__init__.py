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
  truncation.

The peer transport, the node that runs an election over it, and the broker integration (issue 12, items 1 and
3-5) are still to come.
"""
