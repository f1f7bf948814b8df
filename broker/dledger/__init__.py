"""DLedger mode (issue 12, docs/BEHAVIOUR.md 9): a Raft-replicated commit log with leader election.

Pure state first, each module a table of rules with no I/O (the house rule of ``broker/ha/``):

* :mod:`broker.dledger.member` -- the member state (role, term, vote, leader, ledger end) and its transitions;
* :mod:`broker.dledger.election` -- vote and heartbeat handling, the candidate's count of votes, the timers;
* :mod:`broker.dledger.quorum` -- the leader's pending appends and peer watermarks, the quorum index;
* :mod:`broker.dledger.dispatcher` -- the leader's per-follower COMPARE / TRUNCATE / APPEND states;
* :mod:`broker.dledger.follower` -- the follower's COMPARE answer, its agreement with the leader (the commit bound),
  its parked appends and their gap timeout;
* :mod:`broker.dledger.entry` -- the entry and index byte formats;
* :mod:`broker.dledger.protocol` -- the peer protocol's frames;
* :mod:`broker.dledger.store` -- the log on disk: data and index files, checkpoint, ``currterm``, recovery,
  truncation;
* :mod:`broker.dledger.transport` -- the peer connections (``PeerChannel``, ``PeerClient``) and the peer port.

The roles, each driving those rules with the clock, the network and the log (DLedger's names):

* :mod:`broker.dledger.elector` -- ``LeaderElector``: campaigns with pre-vote, votes, heartbeats, the leader's
  quorum check, leadership transfer;
* :mod:`broker.dledger.pusher` -- ``EntryPusher``: the leader's appends, per-follower push loops, quorum wait and
  commit;
* :mod:`broker.dledger.handler` -- ``EntryHandler``: the follower's handling of the leader's pushes;
* :mod:`broker.dledger.server` -- ``DLedgerServer``: one member, wiring the roles over its log and peer port;
* :mod:`broker.dledger.config` -- ``DLedgerConfig`` and ``AppendError``; :mod:`broker.dledger.wakeup` -- the
  loops' wake-up flag.

The broker side:

* :mod:`broker.dledger.message_store` -- the broker's store on the DLedger log: one entry per send holds its
  records, consume queues and the index are built from committed entries only;
* :mod:`broker.dledger.roles` -- the role-change handler: the member's role becomes the broker's (docs/BEHAVIOUR.md 9.8).

Not built: changing a group's members while it runs (docs/DLEDGER.md).
"""
