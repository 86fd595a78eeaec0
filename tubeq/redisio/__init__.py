"""Talking to Redis, knowing no jobs: the RESP client and everything about reaching a Redis.

Holds: the RESP client (client), the one pub/sub connection (pubsub), Sentinel (sentinel) and
Cluster (cluster) discovery, the Redis start-up checks (checks), the private redis-server process
(process), and the hot path's future plumbing, ``then`` / ``discard`` (futures). futures lives
here because the RESP client is its first user and it imports nothing; the store and the server
use it too, from below, which the layers allow.

Rules: knows no jobs, tubes or beanstalkd: imports nothing of tubeq.store, tubeq.server,
tubeq.http or tubeq.protocol (import-linter contracts in pyproject.toml). A namespace's data
layout record is the store's (tubeq.store.layout), not a Redis check.
"""
