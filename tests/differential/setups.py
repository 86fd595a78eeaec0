"""Setups shared by scenarios: step sequences that put jobs into given states.

Their replies are compared like any other step; they are helpers only so that no two scenarios
spell the same preparation twice.
"""

from __future__ import annotations

from tests.differential.harness import Client, Script


def conn_on_fresh_tube(s: Script, name: str = "c", label: str = "t") -> Client:
    """A connection that uses and watches only a tube of its own."""
    return s.conn(name).on_tube(s.tube(label))


def bury_new_job(c: Client, var: str, body: str, *, pri: int = 0) -> Client:
    """Put, reserve and bury one job on ``c``'s tube, capturing its id as ``var``."""
    return c.put(body, capture=var).reserve().cmd(f"bury {{{var}}} {pri}")


def buried_and_delayed(s: Script, buried: int, delayed: int) -> Client:
    """A connection using a fresh tube that holds ``buried`` buried jobs (``b0``, ``b1``...) and
    ``delayed`` delayed jobs (``d0``, ``d1``..., delays 60, 61... so the earliest is ``d0``)."""
    c = conn_on_fresh_tube(s)
    for n in range(buried):
        bury_new_job(c, f"b{n}", f"buried-{n}")
    for n in range(delayed):
        c.put(f"delayed-{n}", delay=60 + n, capture=f"d{n}")
    return c


def job_in_each_state(c: Client) -> Client:
    """On ``c``'s tube: ``buried``, ``reserved`` (held by ``c``), ``delayed`` and ``ready`` jobs.

    The buried and reserved jobs are made first, while they are the only ready job, so which job
    a reserve takes is never in doubt.
    """
    bury_new_job(c, "buried", "buried")
    c.put(b"reserved", capture="reserved").reserve()
    c.put(b"delayed", delay=60, capture="delayed")
    return c.put(b"ready", capture="ready")


STATES = ("ready", "delayed", "buried", "reserved")
