"""The vocabulary: what a job, a tube and an event are, as plain data every layer shares.

A job's record itself lives in Redis (its fields: tubeq/store/lua/includes/job_record.lua) and
comes up as the store's records (tubeq.store.records); here are the words about it.

Holds: job states and their transitions (states), per-job policies (policies), recurring
schedules (recurring), the lifecycle event schema (events), the ``name=value`` options of the
extensions (options) and the admin verbs' words and limits (admin).

Rules: imports nothing of tubeq outside this package; no asyncio, no Redis, no sockets (the
import-linter contracts in pyproject.toml keep that).
"""
