"""Scenarios for reserving and scheduling (checklist sections 4 and 5): selection order, blocking
and timeouts, DEADLINE_SOON, delay expiry, TTR expiry, waiters and what wakes them, release on
disconnect, and the job counters through a whole lifecycle.

Waits are bounded: delays and TTRs are 1-2 s, a reply that should come gets several seconds, and
"still blocked" is observed as no reply for a short while. beanstalkd can miss the TTR expiry of
an idle connection (checklist section 8), so TTR scenarios nudge the owner before observing.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.differential.harness import Client, Script, scenario
from tests.differential.setups import conn_on_fresh_tube

# Long enough for a 1 s delay/TTR/pause to have fired on a loaded machine, with margin.
AFTER_ONE_SECOND = 1.6


def _blocked_worker(s: Script, tube: str, name: str = "worker",
                    command: str = "reserve") -> Client:
    """A connection watching only ``tube``, blocked in ``command`` (checked: no reply yet)."""
    return s.conn(name).watch_only(tube).line(command).no_reply()


# --- selection ------------------------------------------------------------------------------------

@scenario()
def reserve_ignores_unwatched(s: Script) -> None:
    used, watched = s.tube("used"), s.tube("watched")
    c = s.conn("c").cmd(f"use {used}").put(b"x").watch_only(watched)
    c.reserve().cmd(f"watch {used}").reserve()


@scenario()
def reserve_priority_then_id(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    for pri in (5, 3, 3, 10, 0, 4294967295):
        c.put(f"pri-{pri}", pri=pri)
    for _ in range(7):
        c.reserve()


@scenario()
def reserve_across_tubes(s: Script) -> None:
    a, b = s.tube("a"), s.tube("b")
    c = s.conn("c")
    for tube, pri in ((a, 5), (b, 5), (b, 1), (a, 1), (a, 3)):
        c.cmd(f"use {tube}").put(f"{tube[-1]}-{pri}", pri=pri)
    c.watch_only(a, b)
    for _ in range(6):
        c.reserve()


# --- DEADLINE_SOON --------------------------------------------------------------------------------

@scenario()
def deadline_soon_immediate(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"short", ttr=1, capture="a").reserve()
    c.reserve().line("reserve").expect(timeout=0.9).stats_job("a")


@scenario()
def deadline_soon_skipped_when_job_ready(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"short", ttr=1).put(b"next", pri=1)
    c.reserve().reserve().reserve()


@scenario()
def deadline_soon_while_waiting(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"two", ttr=2, capture="a").reserve()
    c.line("reserve").expect(timeout=4).stats_job("a")


# --- timeouts and blocking ------------------------------------------------------------------------

@scenario()
def reserve_with_timeout_zero(s: Script) -> None:
    c = conn_on_fresh_tube(s).reserve()
    c.put(b"x").reserve().reserve()


@scenario()
def reserve_with_timeout_expires(s: Script) -> None:
    c = conn_on_fresh_tube(s).line("reserve-with-timeout 1").no_reply(0.3)
    c.expect(timeout=4).cmd("list-tube-used")


@scenario()
def reserve_blocks_until_put(s: Script) -> None:
    tube = s.tube("t")
    worker = _blocked_worker(s, tube)
    s.conn("producer").cmd(f"use {tube}").put(b"wake", capture="a")
    worker.expect().stats_job("a")


@scenario()
def reserve_with_timeout_gets_later_job(s: Script) -> None:
    tube = s.tube("t")
    worker = _blocked_worker(s, tube, command="reserve-with-timeout 5")
    s.conn("producer").cmd(f"use {tube}").put(b"wake")
    worker.expect()


@scenario()
def reserve_gets_delayed_job_when_ready(s: Script) -> None:
    tube = s.tube("t")
    s.conn("producer").cmd(f"use {tube}").put(b"later", delay=1)
    _blocked_worker(s, tube).expect(timeout=4)


@scenario()
def reserve_woken_by_release(s: Script) -> None:
    tube = s.tube("t")
    owner = s.conn("owner").on_tube(tube).put(b"x", capture="a").reserve()
    worker = _blocked_worker(s, tube)
    owner.cmd("release {a} 0 0")
    worker.expect().stats_job("a")


@scenario()
def reserve_woken_by_kick(s: Script) -> None:
    tube = s.tube("t")
    owner = s.conn("owner").on_tube(tube).put(b"x", capture="a").reserve().cmd("bury {a} 0")
    owner.put(b"y", delay=60, capture="b")
    worker = _blocked_worker(s, tube)
    owner.cmd("kick 1")
    worker.expect().line("reserve").no_reply()
    owner.cmd("kick-job {b}")
    worker.expect()


@scenario()
def reserve_woken_by_disconnect_release(s: Script) -> None:
    tube = s.tube("t")
    s.conn("owner").on_tube(tube).put(b"x", capture="a").reserve()
    worker = _blocked_worker(s, tube)
    s.conn("owner").close()
    worker.expect().stats_job("a")


# --- delayed jobs ---------------------------------------------------------------------------------

@scenario()
def delayed_job_becomes_ready(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube).put(b"x", delay=1, capture="a")
    c.cmd("peek-ready").stats_job("a")
    s.sleep(AFTER_ONE_SECOND)
    c.cmd("peek-ready").stats_job("a").stats_tube(tube)


@scenario()
def delayed_jobs_order_by_priority_then_id(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"a: pri 5, ready second", pri=5, delay=1)
    c.put(b"b: pri 5, ready first", pri=5)
    c.put(b"c: pri 1, ready second", pri=1, delay=1)
    s.sleep(AFTER_ONE_SECOND)
    for _ in range(4):
        c.reserve()


@scenario()
def urgent_counts_ready_only(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube)
    c.put(b"buried", pri=0, capture="b").reserve().cmd("bury {b} 0")
    c.put(b"reserved", pri=1).reserve()
    c.put(b"delayed", pri=0, delay=60).put(b"ready", pri=1023).put(b"not urgent", pri=1024)
    c.stats_tube(tube).cmd("kick 1").stats_tube(tube)


# --- TTR expiry and release on disconnect ---------------------------------------------------------

@scenario()
def ttr_expiry_releases_job(s: Script) -> None:
    tube = s.tube("t")
    owner = s.conn("owner").on_tube(tube).put(b"x", ttr=1, capture="a").reserve()
    s.sleep(AFTER_ONE_SECOND)
    owner.nudge()
    s.conn("observer").stats_job("a").stats_tube(tube)
    owner.cmds("release {a} 0 0", "bury {a} 0", "touch {a}", "delete {a}").stats_job("a")


@scenario()
def ttr_expiry_wakes_waiter(s: Script) -> None:
    tube = s.tube("t")
    owner = s.conn("owner").on_tube(tube).put(b"x", ttr=1, capture="a").reserve()
    worker = _blocked_worker(s, tube, command="reserve-with-timeout 8")
    # Just past the TTR: beanstalkd may need the nudge; a timely server has released already.
    s.sleep(1.1)
    owner.nudge()
    # The worker's own 1 s reservation starts now: look and delete well inside it.
    worker.expect().stats_job("a").cmd("delete {a}")


@scenario()
def disconnect_releases_reserved(s: Script) -> None:
    _owner_leaves_holding_two_jobs(s, lambda owner: owner.close())


@scenario()
def quit_releases_reserved(s: Script) -> None:
    _owner_leaves_holding_two_jobs(s, lambda owner: owner.line("quit").expect_closed())


def _owner_leaves_holding_two_jobs(s: Script, leave: Callable[[Client], object]) -> None:
    """The owner reserves two jobs and leaves; a worker gets both back, counters unchanged."""
    tube = s.tube("t")
    owner = s.conn("owner").on_tube(tube)
    owner.put(b"one", pri=7, capture="a").put(b"two", pri=8, capture="b").reserve().reserve()
    worker = s.conn("worker").watch_only(tube)
    leave(owner)
    worker.reserve(timeout=3).reserve(timeout=3).stats_job("a").stats_job("b")


# --- waiters --------------------------------------------------------------------------------------

@scenario()
def reserve_waiters_fifo(s: Script) -> None:
    tube = s.tube("t")
    first = _blocked_worker(s, tube, "first")
    second = _blocked_worker(s, tube, "second")
    third = _blocked_worker(s, tube, "third")
    producer = s.conn("producer").cmd(f"use {tube}")
    for worker, body in ((first, "one"), (second, "two"), (third, "three")):
        producer.put(body)
        worker.expect()


@scenario()
def reserve_waiter_multiple_tubes(s: Script) -> None:
    x, y = s.tube("x"), s.tube("y")
    both = s.conn("both").watch_only(x, y).line("reserve").no_reply()
    only_y = _blocked_worker(s, y, "only_y")
    producer = s.conn("producer").cmd(f"use {y}").put(b"y-1")
    both.expect()
    producer.cmd(f"use {x}").put(b"x-1")
    only_y.no_reply()
    producer.cmd(f"use {y}").put(b"y-2")
    only_y.expect()
    producer.stats_tube(x).stats_tube(y)


@scenario()
def disconnect_while_waiting(s: Script) -> None:
    tube = s.tube("t")
    _blocked_worker(s, tube, "leaver")
    s.conn("leaver").close()
    stayer = _blocked_worker(s, tube, "stayer")
    # beanstalkd hands the job over inside the put: the stats-tube right after INSERTED shows
    # it reserved, the stayer no longer waiting and the leaver gone.
    s.conn("producer").cmd(f"use {tube}").put(b"x").stats_tube(tube)
    stayer.expect()


# --- counters and time fields through a lifecycle -------------------------------------------------

@scenario()
def stats_job_lifecycle(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"x", pri=10, delay=1, ttr=1, capture="a").stats_job("a")
    c.cmd("kick-job {a}").stats_job("a")
    c.reserve().stats_job("a").cmd("release {a} 20 0").stats_job("a")
    c.reserve().cmd("bury {a} 30").stats_job("a").cmd("kick 1").stats_job("a")
    c.reserve()
    s.sleep(AFTER_ONE_SECOND)
    c.nudge()
    c.stats_job("a")


@scenario()
def time_fields_truncated(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube).put(b"x", ttr=10, capture="a").reserve().stats_job("a")
    c.put(b"y", delay=10, capture="b").stats_job("b")
    c.cmd(f"pause-tube {tube} 100").stats_tube(tube)


# --- more edges: pause and DEADLINE_SOON, touch in the margin, large pipelines --------------------

@scenario()
def deadline_soon_ignores_pause(s: Script) -> None:
    tube, paused = s.tube("t"), s.tube("paused")
    s.conn("producer").cmd(f"use {paused}").put(b"paused job").cmd(f"pause-tube {paused} 60")
    c = s.conn("c").on_tube(tube).cmd(f"watch {paused}")
    c.put(b"short", ttr=2, capture="a").reserve()
    s.sleep(1.2)
    c.reserve().line("reserve").expect(timeout=3).stats_job("a")


@scenario()
def touch_in_margin_clears_deadline_soon(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"x", ttr=2, capture="a").reserve()
    s.sleep(1.2)
    c.reserve().cmd("touch {a}").reserve().stats_job("a")


@scenario()
def rwt_truncated_to_int(s: Script) -> None:
    c = conn_on_fresh_tube(s).line("reserve-with-timeout 4294967297").no_reply(0.3)
    c.expect(timeout=4).cmd("list-tube-used")


@scenario()
def pipelined_large_batch(s: Script) -> None:
    jobs = 300
    c = conn_on_fresh_tube(s)
    c.send(b"".join(b"put %d 0 60 4\r\n%04d\r\n" % (n % 7, n) for n in range(jobs)))
    for n in range(jobs):
        c.expect(capture=f"j{n}")
    c.send(b"reserve-with-timeout 0\r\n" * (jobs + 1)).replies_until_quiet(1.0)
    c.send("".join(f"delete {{j{n}}}\r\n" for n in range(jobs))).replies_until_quiet(1.0)


@scenario()
def disconnect_with_pending_replies(s: Script) -> None:
    tube = s.tube("t")
    s.conn("rude").cmd(f"use {tube}").send(b"put 0 0 60 1\r\nx\r\n" + b"peek-ready\r\n" * 2000)
    s.conn("rude").close()
    s.sleep(0.3)
    s.conn("polite").cmd(f"use {tube}").stats_tube(tube)


# --- commands pipelined behind a reserve that waits ----------------------------------------------
# beanstalkd runs one connection's commands one at a time: what a client pipelines behind a
# reserve that waits runs once that reserve has answered, whatever other connections do meanwhile.

@scenario()
def bury_behind_waiting_reserve_is_not_kicked_into_it(s: Script) -> None:
    tube = s.tube("t")
    worker = s.conn("worker").on_tube(tube).put(b"held", capture="a").reserve()
    worker.send("reserve-with-timeout 2\r\nbury {a} 0\r\n")
    s.sleep(0.2)
    s.conn("kicker").cmd(f"use {tube}").cmd("kick 10")  # KICKED 0: the job is still reserved
    worker.expect(timeout=4).expect().stats_job("a")


def _behind_a_reserve_that_gets_a_timed_out_job(s: Script, command: str) -> Client:
    """The worker holds job a and pipelines ``command`` (on {a}) behind a reserve that waits
    until another connection's job k runs out of TTR and is given to it."""
    tube = s.tube("t")
    owner = s.conn("owner").on_tube(tube).put(b"owner's", ttr=1, capture="k").reserve()
    worker = s.conn("worker").on_tube(tube).put(b"held", pri=5, capture="a").reserve()
    worker.send(f"reserve-with-timeout 4\r\n{command}\r\n")
    s.sleep(1.1)
    owner.nudge()  # beanstalkd may need it to see the owner's TTR (checklist section 8)
    return worker.expect(timeout=4).expect()


@scenario()
def bury_behind_waiting_reserve_after_a_ttr_runs_out(s: Script) -> None:
    _behind_a_reserve_that_gets_a_timed_out_job(s, "bury {a} 0").stats_job("a").stats_job("k")


@scenario()
def delete_behind_waiting_reserve_keeps_its_deadline_soon(s: Script) -> None:
    worker = conn_on_fresh_tube(s).put(b"held", ttr=2, capture="a").reserve()
    worker.send("reserve-with-timeout 3\r\ndelete {a}\r\n")
    worker.expect(timeout=4).expect().stats_job("a")


@scenario()
def touch_behind_waiting_reserve_after_a_ttr_runs_out(s: Script) -> None:
    _behind_a_reserve_that_gets_a_timed_out_job(s, "touch {a}").stats_job("k")
