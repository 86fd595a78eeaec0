"""Micro-probes: small, standalone measurements of one cost each, run by hand when a change needs
a figure (a script's Redis time or instructions, an XADD's shape, a metrics hook, a lone put, a
batched enqueue, what the second core gives, timer lateness, reserve cycles' memory,
whole-namespace reads). None is part of `make bench`; each says how to run it in its header, and
bench/README.md says which question each answers.

Rules: a probe imports the harness (bench/harness/) and tubeq, never a scenario or another
probe.
"""
