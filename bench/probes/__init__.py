"""Micro-probes: small, standalone measurements of one cost each, run by hand when a change needs
a figure (the Lua cost of a script, RESP parsing throughput, an XADD per transition, a metrics
hook, reserve cycles). None is part of `make bench`; each says how to run it in its header.

Rules: a probe imports the harness (bench/harness/) and tubeq, never a scenario or another
probe.
"""
