"""The tubeq process: listeners, connections, handlers, waiters, scheduler, counters.

Holds: the process and its phased shutdown (process), the connection adapter (connection) and
what it owns per connection: its reserve queue, where the order of its reserves and of the
commands behind them is decided (reserves), its flow control (flow), its runs of puts and
deletes (runs) and its push loop (push); the command handlers (handlers) and what they may touch
of a connection and share per namespace (context); the job verbs for every front (ops); the one
blocking wait for a job (reserve_wait), the waiter registry that wakes it (waiters) and the
cheap timers they wait with (timers); delayed/TTR timers (scheduler, fine_timer), the ``use``
ledger (using), stats and metrics (stats, metrics), listeners, the access file (access) and
worker processes (workers).

Rules: builds on tubeq.protocol, tubeq.store, tubeq.redisio and tubeq.model; never imports
tubeq.http (the HTTP listener is composed in tubeq.cli and handed to the Server).
"""
