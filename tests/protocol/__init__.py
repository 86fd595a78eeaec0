"""tubeq.protocol, sans-IO: bytes in, commands out; no event loop, no server (unit tests)."""
