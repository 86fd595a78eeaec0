"""The beanstalkd protocol, sans-IO: bytes in, command dataclasses out; replies to bytes.

Holds: the limits of lines, names and numbers (limits), the grammar that turns one line into a
command with its word tables (grammar), the framing of lines and bodies around it (parser), the
commands (commands), the reply words and builders (replies) and the framing of a put-many's
entries (batch_framing).

Rules: imports only tubeq.model; never asyncio or redis (the import-linter contracts in
pyproject.toml keep that). Tested byte by byte, and against a real beanstalkd by tests/differential.
"""
