"""The vocabulary: what a job, a tube and an event are, as plain data every layer shares.

Holds: job states and their transitions (states), per-job policies (policies), recurring
schedules (recurring), the lifecycle event schema (events), the ``name=value`` options of the
extensions (options) and the admin verbs' words and limits (admin).

Rules: imports nothing of tubeq outside this package; no asyncio, no Redis, no sockets (the
import-linter contracts in pyproject.toml keep that).
"""
