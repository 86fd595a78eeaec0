"""Scenarios for tubes and stats (checklist sections 6 and 7): tube lifetime, list orders, YAML
formats, per-tube counters, global counter deltas, id allocation and drain mode.

Global counters, ids and drain mode are only meaningful on a server nobody else is using, so
those scenarios are ``pristine``: each runs on a fresh beanstalkd/target pair of its own.
"""

from __future__ import annotations

import signal

from tests.differential.harness import Documented, Script, scenario
from tests.differential.setups import bury_new_job, conn_on_fresh_tube

OVERSIZE_PUT = b"put 0 0 60 65536\r\n" + b"o" * 65536 + b"\r\n"
# A put the parser refuses: the body that follows is then read as a command.
BAD_FORMAT_PUT = b"put 0 0 60 x\r\n"
# A put whose bytes+2 bytes do not end in CRLF.
EXPECTED_CRLF_PUT = b"put 0 0 60 3\r\nabcXY"


# --- tube lifetime --------------------------------------------------------------------------------

@scenario()
def tube_gc_on_last_reference(s: Script) -> None:
    by_use, by_watch, by_job, by_conn = (s.tube(label) for label in ("use", "watch", "job", "conn"))
    c = s.conn("c")
    c.cmd(f"use {by_use}").stats_tube(by_use).cmd("use default").stats_tube(by_use)
    c.cmd(f"watch {by_watch}").stats_tube(by_watch).cmd(f"ignore {by_watch}")
    c.stats_tube(by_watch)
    c.cmd(f"use {by_job}").put(b"x", capture="a").cmd("use default").stats_tube(by_job)
    c.cmd("delete {a}").stats_tube(by_job)
    c.cmd(f"pause-tube {by_use} 0").cmd(f"ignore {by_use}").stats_tube(by_use)
    s.conn("leaver").cmd(f"use {by_conn}").cmd(f"watch {by_conn}").close()
    s.sleep(0.5)  # lets the server see the close; the observation below is not timed
    c.stats_tube(by_conn).cmd("list-tubes")


@scenario()
def tube_gc_resets_pause(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").cmd(f"use {tube}").put(b"x", capture="a").cmd(f"pause-tube {tube} 60")
    c.cmd("delete {a}").stats_tube(tube).cmd("use default").stats_tube(tube)
    c.cmd(f"use {tube}").stats_tube(tube)


@scenario()
def list_tubes(s: Script) -> None:
    a, b, c_tube = s.tube("a"), s.tube("b"), s.tube("c")
    first = s.conn("first").cmd(f"use {a}").cmd(f"watch {b}")
    second = s.conn("second").cmd(f"use {c_tube}").cmd("list-tubes")
    first.cmd("use default").cmd("list-tubes").cmd(f"ignore {b}").cmd("list-tubes")
    second.cmd("use default").cmd("list-tubes")


@scenario(pristine=True, documented=Documented(
    reference=("OK list (ordered) | - default | - <a> | - <b> | - <c> | - <d>",
               "OK list (ordered) | - default | - <a> | - <d> | - <c>"),
    tubeq=("OK list (ordered) | - default | - <a> | - <b> | - <c> | - <d>",
           "OK list (ordered) | - default | - <a> | - <c> | - <d>"),
))
def list_tubes_order_after_delete(s: Script) -> None:
    users = {label: s.conn(f"uses_{label}").quietly(f"use {s.tube(label)}") for label in "abcd"}
    observer = s.conn("observer").line("list-tubes").expect(ordered=True)
    users["b"].quietly("use default")
    observer.line("list-tubes").expect(ordered=True)


@scenario()
def watched_list_order(s: Script) -> None:
    t1, t2, t3, t4 = (s.tube(f"t{n}") for n in range(1, 5))
    c = s.conn("c").cmds(f"watch {t1}", f"watch {t2}", f"watch {t3}")
    c.line("list-tubes-watched").expect(ordered=True)
    c.cmd("ignore default").line("list-tubes-watched").expect(ordered=True)
    c.cmd(f"ignore {t1}").cmd(f"watch {t4}").line("list-tubes-watched").expect(ordered=True)


# --- formats and per-tube counters ----------------------------------------------------------------

@scenario()
def stats_format(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube).put(b"x", pri=3, ttr=7, capture="a")
    c.cmd("stats").stats_tube(tube).stats_job("a").reserve().stats_job("a")


@scenario()
def stats_tube_counts(s: Script) -> None:
    tube = s.tube("t")
    producer = s.conn("producer").cmd(f"use {tube}")
    producer.put(b"1", capture="a").put(b"2", capture="b").put(b"3", delay=60)
    producer.cmds(f"pause-tube {tube} 0", f"pause-tube {tube} 0", "delete {a}", "delete {a}")
    bury_new_job(s.conn("burier").on_tube(tube), "c", "4")
    s.conn("watcher").watch_only(tube)
    s.conn("waiter").watch_only(tube).cmd("reserve-job {b}").line("reserve").no_reply()
    producer.stats_tube(tube)


# --- global counter deltas (pristine servers) -----------------------------------------------------

@scenario(pristine=True)
def stats_deltas_producer_family(s: Script) -> None:
    observer = s.conn("observer").stats_snapshot("before")
    c = conn_on_fresh_tube(s)
    c.put(b"ok").send(EXPECTED_CRLF_PUT).expect().send(OVERSIZE_PUT).expect()
    c.send(BAD_FORMAT_PUT).expect().put(b"delayed", delay=60)
    observer.stats_delta("before")


@scenario(pristine=True)
def stats_deltas_worker_family(s: Script) -> None:
    observer = s.conn("observer").stats_snapshot("before")
    c = conn_on_fresh_tube(s)
    c.put(b"short", ttr=1, capture="a").reserve().reserve().cmd("reserve").cmd("delete {a}")
    c.put(b"long", capture="b").line("reserve").expect()
    c.cmds("release {b} 0 0", "reserve-with-timeout 0", "bury {b} 0", "kick 1", "kick 1")
    c.reserve().cmds("touch {b}", "touch 0", "release 0 0 0", "bury 0 0", "delete {b}",
                     "delete {b}", "reserve-with-timeout 0")
    observer.stats_delta("before")


@scenario(pristine=True)
def stats_deltas_inspection_family(s: Script) -> None:
    tube = s.tube("t")
    observer = s.conn("observer").stats_snapshot("before")
    c = s.conn("c").cmds(f"use {tube}", f"watch {tube}", "ignore default", "ignore default",
                         "peek 0", "peek-ready", "peek-delayed", "peek-buried", "stats-job 0",
                         f"stats-tube {tube}", f"stats-tube {s.tube('missing')}", "list-tubes",
                         "list-tube-used", "list-tubes-watched", f"pause-tube {tube} 0",
                         f"pause-tube {s.tube('missing')} 0", "kick-job 0", "reserve-job 0",
                         "stats", "peek x", "stats-tube -x", "bogus", "use ")
    c.line("quit").expect_closed()
    observer.stats_delta("before")


@scenario(pristine=True)
def stats_deltas_connections(s: Script) -> None:
    tube = s.tube("t")
    observer = s.conn("observer").stats_snapshot("before")
    s.conn("producer").cmd(f"use {tube}").put(b"x", capture="a").put(b"y")
    s.conn("bad_producer").send(EXPECTED_CRLF_PUT).expect()
    s.conn("too_big_producer").send(OVERSIZE_PUT).expect()
    s.conn("timed_out_worker").watch_only(s.tube("empty")).cmd("reserve-with-timeout 0")
    s.conn("reserve_job_miss").cmd("reserve-job 0")
    s.conn("reserve_job_worker").cmd("reserve-job {a}")
    s.conn("waiter").watch_only(s.tube("empty")).line("reserve").no_reply()
    s.conn("idle").cmd("list-tube-used")
    observer.stats_delta("before").stats_snapshot("all_open")
    for name in ("producer", "timed_out_worker", "reserve_job_worker", "waiter", "idle"):
        s.conn(name).close()
    s.sleep(0.5)  # lets the server see the closes; the observation below is not timed
    observer.stats_delta("all_open")


@scenario(pristine=True)
def stats_counts_invalid_pause_tube(s: Script) -> None:
    tube = s.tube("t")
    observer = s.conn("observer").stats_snapshot("before")
    c = s.conn("c").cmd(f"use {tube}")
    c.cmds(f"pause-tube -{tube} 0", f"pause-tube {tube}! 0", f"pause-tube {tube} x",
           f"pause-tube {tube}", f"pause-tube {tube} 0", f"pause-tube {s.tube('missing')} 0")
    c.stats_tube(tube)
    observer.stats_delta("before")


# --- id allocation and drain mode (pristine servers) ----------------------------------------------

@scenario(pristine=True)
def put_expected_crlf_consumes_id(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"first", capture="base")
    c.send(EXPECTED_CRLF_PUT).expect()
    c.put(b"after EXPECTED_CRLF", raw_id_base="base")
    c.send(OVERSIZE_PUT).expect().send(BAD_FORMAT_PUT).expect()
    c.put(b"after JOB_TOO_BIG and BAD_FORMAT", raw_id_base="base")


@scenario(pristine=True)
def drain_mode(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube).put(b"before", capture="a")
    s.signal_server(signal.SIGUSR1)
    c.put(b"during").send(EXPECTED_CRLF_PUT).expect().send(OVERSIZE_PUT).expect()
    c.send(BAD_FORMAT_PUT).expect()
    c.cmd("stats").reserve().cmd("delete {a}").stats_tube(tube)
    s.conn("newcomer").cmd(f"use {tube}").put(b"late").cmd("list-tube-used")
