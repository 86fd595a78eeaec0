"""Scenarios for each command's semantics (checklist section 4): put, use, reserve-job, delete,
release, bury, touch, watch/ignore, the peek family, kick, kick-job and pause-tube.

Blocking reserves, timing and job-state scheduling are in ``scenarios_scheduling``; tubes and
stats in ``scenarios_stats``.
"""

from __future__ import annotations

from tests.differential.harness import Script, scenario
from tests.differential.setups import (
    STATES,
    buried_and_delayed,
    bury_new_job,
    conn_on_fresh_tube,
    job_in_each_state,
)

MAX_JOB_SIZE = 65535  # beanstalkd's default -z


# --- put -------------------------------------------------------------------------------------

@scenario()
def put_ttr_zero_becomes_one(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"zero", ttr=0, capture="a").stats_job("a")
    c.put(b"one", ttr=1, capture="b").stats_job("b")


@scenario()
def put_max_delay_and_ttr(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"far", delay=4294967295, ttr=4294967295, capture="a").stats_job("a")
    c.cmd("peek-delayed").cmd("kick-job {a}").reserve().stats_job("a")


@scenario()
def put_goes_to_used_tube(s: Script) -> None:
    used, watched = s.tube("used"), s.tube("watched")
    c = s.conn("c").watch_only(watched).cmd(f"use {used}")
    c.put(b"x", capture="a").stats_job("a").cmd("peek-ready")
    c.reserve().stats_tube(used).stats_tube(watched)


@scenario()
def put_job_too_big_waits_for_body(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    oversize = MAX_JOB_SIZE + 1
    c.send(b"put 0 0 60 %d\r\n" % oversize).no_reply()
    c.send(b"a" * oversize, pieces=(30000, 30000)).no_reply()
    c.send(b"\r").no_reply()
    c.send(b"\n").expect()
    # Exactly bytes+2 bytes are swallowed, whatever they are; what follows is a command again.
    c.send(b"put 0 0 60 %d\r\n%sXYlist-tube-used\r\n" % (oversize, b"b" * oversize))
    c.expect_many(2)
    c.cmd("peek-ready")


@scenario()
def put_max_job_size(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"m" * MAX_JOB_SIZE, capture="a").reserve().stats_job("a")
    c.send(b"put 0 0 60 %d\r\n%s\r\n" % (MAX_JOB_SIZE + 1, b"m" * (MAX_JOB_SIZE + 1))).expect()


@scenario()
def put_too_big_beats_trailing_garbage(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.send(b"put 0 0 10 70000x\r\n" + b"g" * 70002).expect()
    c.send(b"put 0 0 10 5x\r\nhello\r\n").expect_many(2)
    c.cmd("peek-ready")


@scenario()
def put_expected_crlf(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube)
    c.send(b"put 0 0 10 3\r\nabcde\r\n").expect_many(2)
    c.send(b"put 0 0 10 3\r\nabcXYlist-tube-used\r\n").expect_many(2)
    c.send(b"put 0 0 10 0\r\nXY").expect()
    c.send(b"put 0 0 10 2\r\nab\n\r").expect()
    c.cmd("peek-ready").stats_tube(tube)


@scenario()
def disconnect_mid_body_discards_job(s: Script) -> None:
    tube = s.tube("t")
    watcher = s.conn("watcher").watch_only(tube)
    s.conn("header_only").cmd(f"use {tube}").send(b"put 0 0 10 10\r\n").close()
    s.conn("half_body").cmd(f"use {tube}").send(b"put 0 0 10 10\r\nabc").close()
    s.conn("no_crlf").cmd(f"use {tube}").send(b"put 0 0 10 3\r\nabc").close()
    watcher.reserve(timeout=1).stats_tube(tube)


# --- use ---------------------------------------------------------------------------------------

@scenario()
def use_and_list_tube_used(s: Script) -> None:
    a, b = s.tube("a"), s.tube("b")
    c = s.conn("c").cmd("list-tube-used")
    c.cmds(f"use {a}", "list-tube-used", f"use {a}", f"use {b}", "list-tube-used", "use default",
           "list-tube-used", "list-tubes-watched")


# --- reserve-job ---------------------------------------------------------------------------------

@scenario()
def reserve_job_states(s: Script) -> None:
    job_in_each_state(conn_on_fresh_tube(s, "owner"))
    other = s.conn("other")
    for state in STATES:
        other.cmd(f"reserve-job {{{state}}}").stats_job(state)
    other.cmd("reserve-job 18446744073709551615")


@scenario()
def reserve_job_any_tube_even_paused(s: Script) -> None:
    paused = s.tube("paused")
    producer = s.conn("producer").cmd(f"use {paused}").put(b"x", capture="a")
    producer.cmd(f"pause-tube {paused} 60")
    worker = s.conn("worker").watch_only(s.tube("elsewhere"))
    worker.cmd("reserve-job {a}").stats_job("a").cmd("release {a} 0 0").stats_job("a")


@scenario()
def reserve_job_reserved_by_other(s: Script) -> None:
    owner = conn_on_fresh_tube(s, "owner").put(b"x", capture="a").reserve()
    s.conn("other").cmd("reserve-job {a}")
    owner.cmd("reserve-job {a}").stats_job("a")


@scenario()
def reserve_job_no_deadline_soon(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"short", ttr=1, capture="a").reserve()
    c.put(b"later", delay=60, capture="b")
    c.reserve().cmd("reserve-job {b}").reserve()


@scenario()
def reserve_job_keeps_delay(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"x", delay=60, capture="a").cmd("reserve-job {a}").stats_job("a")
    c.cmd("release {a} 3 0").stats_job("a")
    bury_new_job(c, "b", "buried", pri=4).cmd("reserve-job {b}").stats_job("b")


# --- delete --------------------------------------------------------------------------------------

@scenario()
def delete_each_state(s: Script) -> None:
    tube = s.tube("t")
    c = job_in_each_state(s.conn("c").on_tube(tube))
    for state in STATES:
        c.cmd(f"delete {{{state}}}").cmd(f"peek {{{state}}}")
    c.cmd("delete {ready}").stats_tube(tube)


@scenario()
def delete_reserved_by_other(s: Script) -> None:
    owner = conn_on_fresh_tube(s, "owner").put(b"x", capture="a").reserve()
    s.conn("other").cmd("delete {a}").stats_job("a")
    owner.cmd("delete {a}")


# --- release / bury / touch: only the reserving connection ----------------------------------------

def _owner_only(s: Script, command: str) -> None:
    """``command`` (``{job}`` = the id) on jobs in every state, from a stranger, then the owner."""
    owner = job_in_each_state(conn_on_fresh_tube(s, "owner"))
    stranger = s.conn("stranger")
    for state in STATES:
        stranger.cmd(command.format(job=f"{{{state}}}"))
    for state in ("ready", "delayed", "buried"):
        owner.cmd(command.format(job=f"{{{state}}}"))
    owner.cmd(command.format(job="18446744073709551615"))
    owner.cmd(command.format(job="{reserved}")).stats_job("reserved")


@scenario()
def release_not_reserved(s: Script) -> None:
    _owner_only(s, "release {job} 5 0")


@scenario()
def bury_not_reserved(s: Script) -> None:
    _owner_only(s, "bury {job} 5")


@scenario()
def touch_not_reserved(s: Script) -> None:
    _owner_only(s, "touch {job}")


@scenario()
def release_basic(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"x", pri=100, capture="a").reserve()
    c.cmd("release {a} 7 0").stats_job("a").reserve().stats_job("a")


@scenario()
def release_with_delay(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"x", capture="a").reserve()
    c.cmd("release {a} 7 1").stats_job("a").cmd("peek-delayed").cmd("peek-ready")
    c.reserve(timeout=3).stats_job("a")


@scenario()
def bury_basic(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube).put(b"x", pri=100, capture="a").reserve()
    c.cmd("bury {a} 9").stats_job("a").cmd("peek-buried").reserve().stats_tube(tube)


@scenario()
def kicked_job_keeps_bury_priority(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"x", pri=100, capture="a").reserve()
    c.cmd("bury {a} 5").cmd("kick 1").stats_job("a")


@scenario()
def touch_extends_ttr(s: Script) -> None:
    c = conn_on_fresh_tube(s).put(b"x", ttr=2, capture="a").reserve()
    s.sleep(1.2)
    c.cmd("touch {a}").stats_job("a")
    s.sleep(1.2)
    c.stats_job("a")  # 2.4 s after the reserve, 1.2 s after the touch: still reserved
    s.sleep(1.5)
    c.nudge()
    s.conn("observer").stats_job("a")


# --- watch / ignore ------------------------------------------------------------------------------

@scenario()
def watch_ignore_counts(s: Script) -> None:
    a, b, never = s.tube("a"), s.tube("b"), s.tube("never")
    c = s.conn("c")
    c.cmds(f"watch {a}", f"watch {a}", f"watch {b}", f"ignore {never}", "list-tubes-watched",
           f"stats-tube {never}", f"ignore {b}", f"ignore {a}", "ignore default",
           f"watch {a}", "ignore default", f"ignore {a}", "list-tubes-watched")


@scenario()
def fresh_connection_defaults(s: Script) -> None:
    s.conn("c").cmds("list-tube-used", "list-tubes-watched", "ignore default", "watch default",
                     "list-tubes-watched")


# --- peek family ----------------------------------------------------------------------------------

@scenario()
def peek_by_id_any_state(s: Script) -> None:
    job_in_each_state(conn_on_fresh_tube(s, "owner"))
    other = s.conn("other").cmd(f"use {s.tube('elsewhere')}")
    for state in STATES:
        other.cmd(f"peek {{{state}}}")
    other.cmd("peek 18446744073709551615")


@scenario()
def peek_scoped_to_used_tube(s: Script) -> None:
    tube = s.tube("t")
    job_in_each_state(s.conn("owner").on_tube(tube))
    other = s.conn("other").watch_only(tube).cmd(f"use {s.tube('elsewhere')}")
    other.cmds("peek-ready", "peek-delayed", "peek-buried")
    other.cmd(f"use {tube}").cmds("peek-ready", "peek-delayed", "peek-buried")


@scenario()
def peek_ready_order(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    for n, pri in enumerate((5, 3, 3, 10, 4294967295)):
        c.put(f"pri-{pri}", pri=pri, capture=f"j{n}")
    for n in (1, 2, 0, 3, 4):
        c.cmd("peek-ready").cmd(f"delete {{j{n}}}")
    c.cmd("peek-ready")


@scenario()
def peek_delayed_soonest(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    for n, delay in enumerate((30, 10, 10, 20)):
        c.put(f"delay-{delay}", delay=delay, pri=9 - n, capture=f"j{n}")
    for n in (1, 2, 3, 0):
        c.cmd("peek-delayed").cmd(f"delete {{j{n}}}")
    c.cmd("peek-delayed")


@scenario()
def peek_buried_oldest(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"first", capture="a").put(b"second", capture="b").reserve().reserve()
    c.cmd("bury {b} 5").cmd("bury {a} 0").cmd("peek-buried")
    c.cmd("kick-job {b}").cmd("peek-buried").cmd("kick 1").cmd("peek-buried")


# --- kick / kick-job ------------------------------------------------------------------------------

@scenario()
def kick_only_used_tube(s: Script) -> None:
    tube = s.tube("t")
    c = buried_and_delayed(s, buried=2, delayed=1)
    other = s.conn("other").cmd(f"use {s.tube('elsewhere')}").cmd("kick 10")
    other.cmd(f"use {tube}").cmd("kick 10").cmd("kick 10")
    c.stats_tube(tube)


@scenario()
def kick_buried_before_delayed(s: Script) -> None:
    tube = s.tube("t")
    c = buried_and_delayed(s, buried=2, delayed=2)
    c.cmd("kick 10").stats_tube(tube).cmd("kick 10").stats_tube(tube).cmd("kick 10")


@scenario()
def kick_bound(s: Script) -> None:
    c = buried_and_delayed(s, buried=3, delayed=3)
    c.cmd("kick 2").cmd("peek-buried").cmd("kick 2").cmd("kick 2").cmd("peek-delayed")
    c.stats_job("d0").stats_job("b0").cmd("kick 0")


@scenario()
def kick_job_states(s: Script) -> None:
    job_in_each_state(conn_on_fresh_tube(s, "owner"))
    other = s.conn("other").cmd(f"use {s.tube('elsewhere')}")
    for state in STATES:
        other.cmd(f"kick-job {{{state}}}")
    other.cmd("kick-job {buried}").cmd("kick-job 18446744073709551615")
    other.stats_job("buried").stats_job("delayed")


# --- pause-tube ----------------------------------------------------------------------------------

@scenario()
def pause_blocks_reserve(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube).put(b"x").cmd(f"pause-tube {tube} 60")
    c.reserve().reserve(timeout=1).stats_tube(tube)


@scenario()
def pause_allows_other_ops(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube)
    c.put(b"a", capture="a").put(b"b", capture="b").cmd(f"pause-tube {tube} 60")
    c.put(b"c", capture="c").put(b"d", delay=60, capture="d")
    c.cmds("peek-ready", "peek-delayed", "reserve-job {a}", "bury {a} 1", "peek-buried",
           "kick 1", "kick-job {d}", "delete {b}", "peek {c}", "stats-job {a}",
           f"stats-tube {tube}")


@scenario()
def a_tube_left_by_its_last_user_is_new_when_used_again(s: Script) -> None:
    # beanstalkd destroys a tube (with its pause and counters) when its last user leaves and it
    # holds no job, even if a `use` brings it back a moment later (issue 13's tube lifetime).
    tube = s.tube("t")
    c = s.conn("c").cmd(f"use {tube}").cmd(f"pause-tube {tube} 100").cmd("use default")
    c.cmd(f"use {tube}").stats_tube(tube)
    c.put(b"x", capture="x").cmd("delete {x}").cmd("use default").cmd(f"use {tube}")
    c.stats_tube(tube)


@scenario()
def a_watched_tube_left_by_its_users_keeps_its_history(s: Script) -> None:
    tube = s.tube("t")
    s.conn("watcher").cmd(f"watch {tube}")
    c = s.conn("c").cmd(f"use {tube}").cmd(f"pause-tube {tube} 100").cmd("use default")
    c.cmd(f"use {tube}").stats_tube(tube)


@scenario()
def pause_zero_wakes_waiters(s: Script) -> None:
    tube = s.tube("t")
    producer = s.conn("producer").cmd(f"use {tube}").put(b"x").cmd(f"pause-tube {tube} 60")
    worker = s.conn("worker").watch_only(tube).line("reserve").no_reply()
    producer.cmd(f"pause-tube {tube} 0")
    worker.expect()
    producer.stats_tube(tube)


@scenario()
def pause_expiry_serves_waiters(s: Script) -> None:
    tube = s.tube("t")
    producer = s.conn("producer").cmd(f"use {tube}").put(b"x").cmd(f"pause-tube {tube} 1")
    worker = s.conn("worker").watch_only(tube).line("reserve").no_reply()
    worker.expect()
    producer.stats_tube(tube)
