"""Scenarios for command recognition and argument grammar (checklist sections 2 and 3).

One ``prefix_forms_<verb>`` scenario per command word sends the word bare, with a suffix, with a
space, with a tab, truncated and upper-cased: which of BAD_FORMAT and UNKNOWN_COMMAND each gets is
beanstalkd's ordered prefix matching. The ``*_parse`` scenarios walk each argument kind: u32, u64,
the strtol/strtoul arguments of reserve-with-timeout and kick, and the two tube-name rules.
"""

from __future__ import annotations

from tests.differential.harness import Client, Script, register, scenario
from tests.differential.setups import buried_and_delayed, conn_on_fresh_tube

U32_MAX = "4294967295"
U32_OVER = "4294967296"
U64_MAX = "18446744073709551615"
U64_OVER = "18446744073709551616"

# Every command word, in beanstalkd's matching order (quit is covered by quit_prefix_quirk).
VERBS = ("put", "peek", "peek-ready", "peek-delayed", "peek-buried", "reserve-with-timeout",
         "reserve-job", "reserve", "delete", "release", "bury", "kick", "kick-job", "touch",
         "stats-job", "stats-tube", "stats", "use", "watch", "ignore", "list-tubes-watched",
         "list-tube-used", "list-tubes", "pause-tube")
# A bare `reserve` would block (that is reserve_* scenarios' business), so it is not sent here.
BLOCKING_FORMS = frozenset({"reserve"})


def _prefix_forms(verb: str) -> list[str]:
    forms = [verb, verb + "x", verb + " ", verb + "  x", verb + "\t1", verb + "-", verb[:-1],
             verb.upper(), verb.capitalize(), " " + verb]
    return [form for form in dict.fromkeys(forms) if form not in BLOCKING_FORMS]


def _prefix_scenario(verb: str) -> None:
    def build(s: Script) -> None:
        # The connection only ever sees `default`, which no scenario puts jobs into.
        s.conn("c").cmds(*_prefix_forms(verb))

    register(f"prefix_forms_{verb.replace('-', '_')}", build)


for _verb in VERBS:
    _prefix_scenario(_verb)


@scenario()
def unknown_commands(s: Script) -> None:
    s.conn("c").cmds("put", "use", "watch", "ignore", "peek", "delete", "release", "bury",
                     "touch", "kick", "kick-job", "list-tube", "", " stats", "\tstats",
                     "PUT 0 0 1 1", "Stats", "foo", "reserve_job", "kick_job 1", "peekready",
                     "-", "x" * 200)


@scenario()
def prefix_matched_commands_bad_format(s: Script) -> None:
    s.conn("c").cmds("reservex", "reserve x", "reserve_job 1", "reserve-with-timeout",
                     "reserve-job", "statsx", "stats ", "stats-job", "stats-tube", "stats-jobx",
                     "stats-tubes x", "list-tubesx", "list-tube-used ", "list-tubes-watched x",
                     "peek-readyx", "peek-delayed 1", "peek-buried ", "stats-job\t1",
                     "list-tubes-watchedd")


@scenario()
def quit_prefix_quirk(s: Script) -> None:
    for name, line in (("suffix", "quitx"), ("argument", "quit now"), ("space", "quit "),
                       ("dash", "quit-tube 1")):
        s.conn(name).line(line).expect_closed()
    s.conn("upper").cmd("QUIT").cmd("list-tube-used")


@scenario()
def pause_tube_prefix_quirk(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").cmd(f"use {tube}")
    c.cmd(f"pause-tube{tube} 30").stats_tube(tube)
    c.cmd(f"pause-tube{tube} 0").stats_tube(tube)


# --- put ---------------------------------------------------------------------------------------

@scenario()
def put_numeric_fields_bad_format(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    for fields in ("-1 0 60 1", "+1 0 60 1", f"{U32_OVER} 0 60 1", f"0 {U32_OVER} 60 1",
                   f"0 0 {U32_OVER} 1", f"0 0 60 {U32_OVER}", "a 0 60 1", "0 0 60 1x",
                   "0 0 60 1 ", "0\t0 60 1", "0 0 60 0x1", "1.5 0 60 1", "0 0 -60 1"):
        c.cmd(f"put {fields}")
    c.cmd("peek-ready")


@scenario()
def put_shape_bad_format(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.cmds("put ", "put 0", "put 0 0", "put 0 0 60", "put 0 0 60 1 1", "put 0 0 60 1 x",
           "put\t0 0 60 1", "put  ")
    c.cmd("peek-ready")


@scenario()
def put_bad_format_leaves_body_unread(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.send("put 0 0 60 x\r\nhello\r\n").expect_many(2)
    c.send("put 0 0 60 5 \r\nlist-tube-used\r\n").expect_many(2)
    c.cmd("peek-ready")


@scenario()
def put_lenient_spacing_and_zeros(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.send("put   7   0   60   2\r\nab\r\n").expect(capture="a").stats_job("a")
    c.send("put 00010 0000 0060 0001\r\nz\r\n").expect(capture="b").stats_job("b")
    c.send(f"put {U32_MAX} 0 {U32_MAX} 1\r\nm\r\n").expect(capture="c").stats_job("c")


# --- single job-id commands (u64) ----------------------------------------------------------------

def _u64_id_forms(c: Client, verb: str) -> None:
    """Malformed and edge ids first, then the two accepted spellings (on jobs a and b)."""
    for job_id in ("0", U64_MAX, U64_OVER, "99999999999999999999999", "-1", "+1", "{a}x",
                   "{a} ", "{a} 1", "0x10", "1.0", ""):
        c.cmd(f"{verb} {job_id}")
    c.cmd(f"{verb}\t{{a}}")
    c.cmd(f"{verb}  {{a}}")
    c.cmd(f"{verb} 000{{b}}")


def _two_jobs(s: Script, delay: int = 0) -> Client:
    c = conn_on_fresh_tube(s)
    return c.put(b"first", delay=delay, capture="a").put(b"second", delay=delay, capture="b")


@scenario()
def peek_parse(s: Script) -> None:
    _u64_id_forms(_two_jobs(s), "peek")


@scenario()
def delete_parse(s: Script) -> None:
    _u64_id_forms(_two_jobs(s), "delete")


@scenario()
def stats_job_parse(s: Script) -> None:
    _u64_id_forms(_two_jobs(s), "stats-job")


@scenario()
def reserve_job_parse(s: Script) -> None:
    _u64_id_forms(_two_jobs(s), "reserve-job")


@scenario()
def kick_job_parse(s: Script) -> None:
    _u64_id_forms(_two_jobs(s, delay=60), "kick-job")


@scenario()
def touch_variants(s: Script) -> None:
    c = _two_jobs(s)
    c.reserve().reserve()
    _u64_id_forms(c, "touch")
    c.cmd("touch {a}")
    other = s.conn("other").cmd("touch {a}")
    c.cmd("release {a} 0 0").cmd("touch {a}")
    other.cmd("reserve-job {a}").cmd("touch {a}")
    c.cmd("touch {a}")


# --- release / bury / pause-tube (u32 arguments after the id or name) -----------------------------

@scenario()
def release_parse(s: Script) -> None:
    c = _two_jobs(s).reserve().reserve()
    for args in ("{a}", "{a} 0", "{a} 0 0 0", "{a} 0 0x", "{a} 0 0 ", "{a} -1 0", "{a} +1 0",
                 f"{{a}} {U32_OVER} 0", f"{{a}} 0 {U32_OVER}", f"{U64_OVER} 0 0", "0 0 0",
                 f"{U64_MAX} 0 0", "{a}\t0 0"):
        c.cmd(f"release {args}")
    c.cmd("release\t{a} 0 0")
    c.cmd("release  {a}   5   0").stats_job("a")
    c.cmd(f"release 000{{b}} {U32_MAX} 0").stats_job("b")


@scenario()
def bury_parse(s: Script) -> None:
    c = _two_jobs(s).reserve().reserve()
    for args in ("{a}", "{a} 0 0", "{a} 0x", "{a} 0 ", "{a} -1", "{a} +1", f"{{a}} {U32_OVER}",
                 f"{U64_OVER} 0", "0 0", "{a}\t0", "x 0"):
        c.cmd(f"bury {args}")
    c.cmd("bury\t{a} 0")
    c.cmd("bury  {a}   5").stats_job("a")
    c.cmd(f"bury 000{{b}} {U32_MAX}").stats_job("b")


@scenario()
def pause_tube_parse(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").cmd(f"use {tube}")
    for args in (tube, f"{tube} ", f"{tube} {U32_OVER}", f"{tube} 0x", f"{tube} 0 ",
                 f"{tube} -1", f"{tube} +1", f"{tube}\t0", f"-{tube} 0", f"{tube}! 0",
                 f"{tube} 0 0", f"{s.tube('missing')} 0", " 0", ""):
        c.cmd(f"pause-tube {args}")
    c.cmd(f"pause-tube   {tube}   20").stats_tube(tube)
    c.cmd(f"pause-tube {tube} {U32_MAX}").stats_tube(tube)
    c.cmd(f"pause-tube {tube} 000").stats_tube(tube)


# --- reserve-with-timeout (strtol in 1.12) and kick (strtoul) -------------------------------------

@scenario()
def rwt_parse_common(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.cmds("reserve-with-timeout 0", "reserve-with-timeout 000", "reserve-with-timeout",
           "reserve-with-timeout\t0")
    c.put(b"ready", capture="a").cmd("reserve-with-timeout 1").cmd("release {a} 0 0")
    c.cmd("reserve-with-timeout 00001")


@scenario()
def rwt_parse_112_quirks(s: Script) -> None:
    c = conn_on_fresh_tube(s)
    c.cmds("reserve-with-timeout x", "reserve-with-timeout ", "reserve-with-timeout 0x",
           "reserve-with-timeout 0 junk", "reserve-with-timeout +0", "reserve-with-timeout -0",
           "reserve-with-timeout  \t 0", f"reserve-with-timeout {U32_OVER}",
           "reserve-with-timeout 99999999999999999999",
           "reserve-with-timeout -99999999999999999999",
           "reserve-with-timeout 18446744073709551616")


@scenario()
def rwt_negative_waits_forever(s: Script) -> None:
    tube = s.tube("t")
    worker = s.conn("worker").watch_only(tube)
    producer = s.conn("producer").cmd(f"use {tube}")
    for timeout in ("-1", U32_MAX):
        worker.line(f"reserve-with-timeout {timeout}").no_reply(1.5)
        producer.put(b"late")
        worker.expect()


@scenario()
def kick_parse_common(s: Script) -> None:
    c = buried_and_delayed(s, buried=6, delayed=0)
    c.cmds("kick 0", "kick 1", "kick 000001", "kick  1", "kick x", "kick ", "kick",
           f"kick {U64_OVER}0", "kick 1 ", "kick\t1")
    c.stats_tube(s.tube("t"))


@scenario()
def kick_parse_112_quirks(s: Script) -> None:
    c = buried_and_delayed(s, buried=9, delayed=0)
    c.cmds("kick 1x", "kick 1 2", f"kick {U32_OVER}", "kick 4294967297", "kick  \t1", "kick +1",
           "kick -1")
    c.stats_tube(s.tube("t"))


# --- tube names --------------------------------------------------------------------------------

@scenario()
def tube_name_valid_chars(s: Script) -> None:
    tube = s.tube("AZaz09-+/;.$_()")
    c = s.conn("c").cmd(f"use {tube}").cmd(f"watch {tube}").stats_tube(tube)
    c.cmd(f"pause-tube {tube} 0").cmd(f"ignore {tube}").cmd("list-tubes")


@scenario()
def tube_name_invalid(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c")
    bad_names = [f"-{tube}", f"{tube} x", f"{tube} ", f" {tube}", f"{tube}\tx", f"{tube}*",
                 f"{tube}:", f"{tube}#", f"{tube}%", f"{tube}!", f"{tube}@", f"{tube},",
                 f"{tube}=", f"{tube}[", f"{tube}'", f'{tube}"', f"{tube}\\", f"{tube}~",
                 f"{tube}\xe9"]
    for name in bad_names:
        c.cmd(f"use {name}")
    c.cmd("list-tube-used").cmd("list-tubes")


@scenario()
def watch_ignore_parse(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c")
    for verb in ("watch", "ignore"):
        c.cmds(f"{verb} {tube} ", f"{verb}  {tube}", f"{verb} -{tube}", f"{verb} {tube} x",
               f"{verb} {tube}*", f"{verb} ")
    c.cmd(f"watch {tube}").cmd(f"ignore {tube}").cmd("list-tubes-watched")


@scenario()
def stats_tube_parse(s: Script) -> None:
    tube = s.tube("t")
    c = s.conn("c").cmd(f"use {tube}")
    c.cmds(f"stats-tube {tube} ", f"stats-tube  {tube}", f"stats-tube -{tube}",
           f"stats-tube {tube} x", f"stats-tube {s.tube('missing')}", "stats-tube ")
    c.stats_tube(tube)
