"""The broker's request processors (RocketMQ's ``broker/processor``), one module each:

* :mod:`~broker.processor.send` -- ``POST /send``;
* :mod:`~broker.processor.pull` -- ``GET /pull`` (read/write split planned by :mod:`broker.read_split`);
* :mod:`~broker.processor.sendback` -- ``POST /consumer/sendback`` (retry and DLQ rules in :mod:`broker.retry`);
* :mod:`~broker.processor.consumer_manager` -- heartbeats, group members, consumer offsets, last pulls;
* :mod:`~broker.processor.admin` -- queue offsets, message lookups, topics, groups, status pages;
* :mod:`~broker.processor.args` -- the request-argument helpers they share.

Each processor is built by :class:`broker.controller.BrokerController` with the few collaborators it uses
(config, store, metadata tables, metrics, the durability wait, callbacks such as "register soon"), named in its
constructor; none gets the controller, and none imports another processor.
"""
