"""The tubeq process: listeners, connections, handlers, waiters, scheduler, counters.

Holds: the process and its phased shutdown (process), the connection adapter (connection), the
command handlers (handlers), blocked reserves (waiters), delayed/TTR timers (scheduler), the
``use`` ledger (using), stats and metrics (stats, metrics), listeners, the access file (access)
and worker processes (workers).

Rules: builds on tubeq.protocol, tubeq.store, tubeq.redisio and tubeq.model; never imports
tubeq.http (the HTTP listener is composed in tubeq.cli and handed to the Server).
"""
