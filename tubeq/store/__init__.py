"""Jobs in Redis: one Lua script per state transition, and the Python that calls them.

Holds: the interface the layers above hold a store by (base: JobStore), the records a store
returns (records: Reservation, JobInfo, TubeCounts, ...), the store (store),
its split over shards (shards, by composition), the scripts' loader and library
(scripts), the key schema, the only place a key name is built (keys), the data layout record
(layout) and the Lua sources (lua/, package data).

Rules: imports tubeq.model and tubeq.redisio; never tubeq.protocol, tubeq.server or tubeq.http
(import-linter contracts in pyproject.toml). Knows no sockets and no replies.
"""
