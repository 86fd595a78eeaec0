"""tubeq.server and the tubeq command: the connection adapter, the waiters, scheduler and use
ledger (unit tests), then real processes: listeners, access, workers, limits, logs, stop."""
