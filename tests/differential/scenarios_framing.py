"""Scenarios for framing (checklist section 1): line ends, line limits, NUL, bodies, pipelining,
fragmentation, quit and half-close.

Two of these are documented differences (1.12 accidents tubeq does not copy): a stray CR hiding
the line end, and the 225-byte line that swallows the next one.
"""

from __future__ import annotations

from tests.differential.harness import Documented, Script, scenario
from tests.differential.setups import conn_on_fresh_tube

# beanstalkd's LINE_BUF_SIZE: the longest command line, CRLF included.
LINE_LIMIT = 224


def _padded_put_line(total_length: int) -> bytes:
    """A valid ``put`` line of exactly ``total_length`` bytes (CRLF included), padded with
    leading zeros in the priority: the length, not the content, is what is being tested."""
    tail = b" 0 60 1\r\n"
    zeros = total_length - len(b"put ") - len(tail) - 1
    return b"put " + b"0" * zeros + b"7" + tail


@scenario()
def pipelined_mixed_batch(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c")
    c.send(f"use {tube}\r\nput 5 0 60 3\r\nabc\r\nput 1 0 60 2\r\nxy\r\npeek-ready\r\n"
           f"watch {tube}\r\nignore default\r\nreserve-with-timeout 0\r\nlist-tube-used\r\n"
           f"list-tubes-watched\r\nbogus\r\nstats-tube {tube}\r\nreserve-with-timeout 0\r\n"
           "reserve-with-timeout 0\r\n")
    c.expect_many(13)


@scenario()
def put_pipelined_batch(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    bodies = [f"job-{n}".encode() for n in range(20)]
    c.send(b"".join(b"put %d 0 60 %d\r\n%s\r\n" % (n % 3, len(b), b) for n, b in enumerate(bodies)))
    c.expect_many(len(bodies))
    c.send(b"reserve-with-timeout 0\r\n" * (len(bodies) + 1))
    c.expect_many(len(bodies) + 1)


@scenario()
def bare_lf_is_not_a_terminator(s: Script) -> None:
    c = s.conn("c")
    c.send(b"list-tube-used\nlist-tube-used\r\n").expect()
    c.send(b"list-tube-used\r").no_reply()
    c.send(b"\n").expect()
    c.send(b"stats-tube default\n\r\n").expect()


@scenario(documented=Documented(
    reference=("<no reply>", "BAD_FORMAT", "USING default"),
    tubeq=("BAD_FORMAT | USING default", "BAD_FORMAT", "USING default"),
))
def stray_cr_hides_line_end(s: Script) -> None:
    c = s.conn("c")
    c.send(b"list-tube-used\rX\r\nlist-tube-used\r\n").replies_until_quiet()
    c.send(b"y" * 250 + b"\r\n").replies_until_quiet()
    c.cmd("list-tube-used")


@scenario()
def line_224_bytes_accepted(s: Script) -> None:
    tube = s.tube("t", length=200)
    c = s.conn("c").on_tube(tube)
    pause_line = f"pause-tube {tube} 4294967295\r\n".encode()
    assert len(pause_line) == LINE_LIMIT
    c.send(pause_line).expect()
    c.cmd(f"pause-tube {tube} 0")
    put_line = _padded_put_line(LINE_LIMIT)
    c.send(put_line + b"x\r\n").expect(capture="a")
    c.stats_job("a")


@scenario()
def tube_name_length_limits(s: Script) -> None:
    longest = s.tube("t", length=200)
    too_long = longest + "y"
    c = s.conn("c")
    for verb in ("use", "watch", "ignore", "stats-tube"):
        c.cmd(f"{verb} {longest}").cmd(f"{verb} {too_long}")
    c.cmd(f"pause-tube {longest} 0").cmd(f"pause-tube {too_long} 0")
    c.cmd("list-tube-used").cmd("list-tubes-watched")


@scenario()
def line_226_bytes_bad_format(s: Script) -> None:
    c = s.conn("c")
    c.cmd("use " + s.tube("t"))
    for total in (226, 5000):
        c.send(b"use " + b"n" * (total - 6) + b"\r\n").expect()
        c.cmd("list-tube-used")
    # Nothing is answered before the CRLF arrives, even with the CR and LF in separate writes.
    c.send(b"stats-job " + b"9" * 288 + b"\r").no_reply()
    c.send(b"\n").expect()
    c.cmd("list-tube-used")


@scenario(documented=Documented(
    reference=("<no reply>", "BAD_FORMAT", "USING default"),
    tubeq=("BAD_FORMAT", "USING default", "USING default"),
))
def line_225_bytes_swallows_next(s: Script) -> None:
    c = s.conn("c")
    c.send(b"use " + b"n" * 219 + b"\r\n").replies_until_quiet()
    c.line("list-tube-used").replies_until_quiet()
    c.cmd("list-tube-used")


@scenario()
def nul_byte_in_command(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube)
    for line in (b"list-tube-used\x00", b"\x00", b"stats\x00", b"use " + tube.encode() + b"\x00x",
                 b"put 0 0 60 1\x00", b"reserve-with-timeout 0\x00", b"peek-ready\x00"):
        c.cmd(line)
    c.cmd("list-tube-used")


@scenario()
def put_body_with_crlf_inside(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"a\r\nput 0 0 1 1\r\nb\r\n", capture="a")
    c.put(b"\r\n", capture="b")
    c.cmd("peek {a}").reserve().reserve()


@scenario()
def put_binary_body(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(bytes(range(256)), capture="a")
    c.put(b"\x00\xff\r\x00\n", capture="b")
    c.cmd("peek {a}").reserve().reserve()


@scenario()
def put_zero_bytes(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.put(b"", capture="a").cmd("peek {a}").reserve().stats_job("a")


@scenario()
def byte_at_a_time(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c")
    c.send(f"use {tube}\r\nput 3 0 60 5\r\nhello\r\npeek-ready\r\nlist-tube-used\r\n",
           bytewise=True)
    c.expect_many(4)


@scenario()
def put_fragmented_writes(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.send(b"put 0 0 60 10\r\n0123456789\r\n", pieces=(2, 5, 8, 3, 7, 1)).expect(capture="a")
    c.send(b"put 0 0 60 4\r", pieces=(6,)).no_reply()
    c.send(b"\nab").no_reply()
    c.send(b"cd\r").no_reply()
    c.send(b"\n").expect(capture="b")
    c.reserve().reserve()


@scenario()
def reserve_pipelined_behind_blocking(s: Script) -> None:
    tube = s.tube("t")
    worker = s.conn("worker").watch_only(tube)
    worker.send("reserve\r\nlist-tube-used\r\nlist-tubes-watched\r\n").no_reply()
    s.conn("producer").cmd(f"use {tube}").put(b"wake")
    worker.expect_many(3)


@scenario()
def quit_closes_connection(s: Script) -> None:
    s.conn("plain").line("quit").expect_closed()
    s.conn("pipelined").send("quit\r\nlist-tube-used\r\n").expect_closed()
    s.conn("after_work").cmd("list-tube-used").line("quit").expect_closed()


@scenario()
def reserve_half_close_times_out(s: Script) -> None:
    c = s.conn("c").watch_only(s.tube("t"))
    c.line("reserve").no_reply()
    c.half_close().expect().expect_closed()


@scenario()
def half_close_idle_connection_closes(s: Script) -> None:
    c = s.conn("c").cmd("list-tube-used")
    c.line("list-tubes-watched").half_close().expect().expect_closed()


def _put_held_by_reserve_then_half_close(s: Script, *, wait_first: bool,
                                         whole: bool = True) -> None:
    """Issue 35's sequence: a put pipelined behind a reserve that finds nothing, then the
    client's EOF. The reserve answers TIMED_OUT, then the put runs, answers and is stored;
    a put whose body the EOF cuts off (not ``whole``, the issue's bytes as written) gets no
    reply and stores nothing."""
    tube = s.tube("t")
    c = s.conn("c")
    c.send(f"watch {s.tube('empty')}\r\nignore default\r\nuse {tube}\r\nreserve\r\n"
           "put 0 0 10 1\r\nz" + ("\r\n" if whole else ""))
    if wait_first:  # the reserve is known to wait before the EOF comes
        c.expect_many(3).no_reply()
    c.half_close()
    if not wait_first:
        c.expect_many(3)
    c.expect_many(2 if whole else 1).expect_closed()
    s.conn("peeker").cmds(f"use {tube}", "peek-ready")


@scenario()
def half_close_runs_put_held_by_waiting_reserve(s: Script) -> None:
    _put_held_by_reserve_then_half_close(s, wait_first=True)


@scenario()
def half_close_with_pipeline_runs_put_behind_reserve(s: Script) -> None:
    _put_held_by_reserve_then_half_close(s, wait_first=False)


@scenario()
def half_close_cuts_put_body_behind_reserve(s: Script) -> None:
    _put_held_by_reserve_then_half_close(s, wait_first=True, whole=False)


@scenario()
def half_close_answers_long_pipeline_behind_reserve(s: Script) -> None:
    # More commands behind the waiting reserve than one turn of the pump takes (64) and than
    # may be in flight (128); a second reserve, received before the EOF and run after it,
    # finds nothing and answers TIMED_OUT at once, as the first one did.
    tube = s.tube("t")
    c = s.conn("c").on_tube(tube)
    rounds = 100
    c.send("reserve\r\n" + "put 0 0 10 2\r\nab\r\nlist-tube-used\r\npeek-ready\r\n" * rounds
           + f"watch {s.tube('empty')}\r\nignore {tube}\r\nreserve\r\nlist-tube-used\r\n")
    c.no_reply().half_close()
    c.expect_many(1 + 3 * rounds + 4).expect_closed()
    s.conn("observer").cmd(f"stats-tube {tube}")


@scenario()
def half_close_answers_every_pipelined_command(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c")
    rounds = 100
    c.send(f"use {tube}\r\n" + "put 0 0 10 2\r\nab\r\npeek-ready\r\nstats-job 0\r\n" * rounds)
    c.half_close().expect_many(1 + 3 * rounds).expect_closed()
    s.conn("observer").cmd(f"stats-tube {tube}")


@scenario()
def half_close_mid_command_answers_what_came_before(s: Script) -> None:
    # What the EOF cuts off (a body, a put line, a command line) gets no reply and no job.
    tube = s.tube("t")
    for name, tail in (("body", "put 0 0 10 5\r\nab"), ("no_crlf", "put 0 0 10 1\r\nz"),
                       ("cr_only", "put 0 0 10 1\r\nz\r"), ("header", "put 0 0 10 5\r\n"),
                       ("line", "list-tube-used")):
        c = s.conn(name)
        c.send(f"use {tube}\r\nput 0 0 10 1\r\na\r\n{tail}").half_close()
        c.expect_many(2).expect_closed()
    s.conn("observer").cmd(f"stats-tube {tube}")


@scenario()
def half_close_releases_reserved(s: Script) -> None:
    tube = s.tube("t")
    owner = s.conn("owner").on_tube(tube)
    owner.put(b"held", capture="a").reserve()
    other = s.conn("other").watch_only(tube)
    owner.half_close().expect_closed()
    other.reserve(timeout=3).stats_job("a")
