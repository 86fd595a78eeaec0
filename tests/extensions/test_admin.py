"""The admin verbs and figures (issue 10 parts 6 and 7) through a real tubeq on a real Redis,
with exact reply bytes: clear-tube, list-jobs, change-pri, change-delay, tube-pause,
tube-resume, and the stats-tube keys an extended connection sees."""

from __future__ import annotations

import pytest

from tests.support.servers import ServerProcess
from tests.support.wire import Wire
from tubeq.model import admin

ADMIN_WORDS = ("change-delay", "change-pri", "clear-tube", "list-jobs", "tube-pause",
               "tube-resume")


def put(w: Wire, pri: int = 0, delay: int = 0, body: bytes = b"x") -> int:
    reply = w.ask(b"put %d %d 60 %d\r\n%s\r\n" % (pri, delay, len(body), body))
    assert reply.startswith(b"INSERTED "), reply
    return int(reply.split()[1])


def bury_one(w: Wire, pri: int = 0) -> int:
    job_id = put(w, pri)
    assert w.ask(f"reserve-job {job_id}").startswith(b"RESERVED ")
    assert w.ask(f"bury {job_id} {pri}") == b"BURIED\r\n"
    return job_id


def ok(document: str) -> bytes:
    data = document.encode()
    return b"OK %d\r\n%s\r\n" % (len(data), data)


def test_extensions_lists_the_admin_verbs(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        words = w.ask("extensions").split(b"\r\n", 1)[1].decode().split("\n")
        assert all(f"- {word}" in words for word in ADMIN_WORDS)


def test_clear_tube_one_state_then_all_but_reserved(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w, Wire(server.host, server.port) as worker:
        w.ask("use clear-a")
        worker.ask("watch clear-a")
        held = put(w)
        assert worker.ask(f"reserve-job {held}").startswith(b"RESERVED ")
        for pri in (3, 1, 2):
            put(w, pri)
        put(w, delay=100)
        bury_one(w)
        bury_one(w)
        assert w.ask("clear-tube clear-a buried") == b"CLEARED 2\r\n"
        assert w.ask("clear-tube clear-a buried") == b"CLEARED 0\r\n"
        assert w.ask("clear-tube clear-a all") == b"CLEARED 4\r\n"
        doc = w.yaml("stats-tube clear-a")
        assert [doc[f"current-jobs-{s}"] for s in ("ready", "delayed", "buried", "reserved")] \
            == ["0", "0", "0", "1"]
        # The worker's reservation was left alone; it finishes the job as usual.
        assert worker.ask(f"delete {held}") == b"DELETED\r\n"
        assert w.ask("clear-tube no-such-tube all") == b"NOT_FOUND\r\n"


def test_list_jobs_pages_with_a_cursor(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use list-a")
        a, b, c = put(w, 7), put(w, 3), put(w, 7)
        assert w.ask("list-jobs list-a ready 0 2") == ok(
            f"---\ntube: list-a\nstate: ready\ncursor: 7-{a}\njobs:\n"
            f"- id: {b}\n  pri: 3\n- id: {a}\n  pri: 7\n")
        assert w.ask(f"list-jobs list-a ready 7-{a} 2") == ok(
            f"---\ntube: list-a\nstate: ready\ncursor: 0\njobs:\n- id: {c}\n  pri: 7\n")
        assert w.ask("list-jobs list-a buried 0 10") == ok(
            "---\ntube: list-a\nstate: buried\ncursor: 0\njobs: []\n")
        d = bury_one(w, 9)
        assert w.ask("list-jobs list-a buried 0 10") == ok(
            f"---\ntube: list-a\nstate: buried\ncursor: 0\njobs:\n- id: {d}\n  pri: 9\n")


def test_list_jobs_shows_due_times_of_delayed_and_reserved_jobs(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use list-b")
        w.ask("watch list-b")
        delayed = put(w, 4, delay=100)
        reserved = put(w, 2)
        assert w.ask("reserve-with-timeout 0").startswith(b"RESERVED %d " % reserved)
        for state, key, job_id, pri in (("delayed", "due-ms", delayed, 4),
                                        ("reserved", "deadline-ms", reserved, 2)):
            reply = w.ask(f"list-jobs list-b {state} 0 5").decode()
            head, _, due = reply.rpartition(f"  {key}: ")
            assert head.split("\r\n", 1)[1] == (
                f"---\ntube: list-b\nstate: {state}\ncursor: 0\njobs:\n- id: {job_id}\n"
                f"  pri: {pri}\n")
            assert due.endswith("\n\r\n") and due[:-3].isdigit()


def test_change_pri_reorders_reserves(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use pri-a")
        w.ask("watch pri-a")
        w.ask("ignore default")
        first, second = put(w, 10), put(w, 20)
        assert w.ask(f"change-pri {second} 5") == b"CHANGED\r\n"
        assert w.ask("reserve-with-timeout 0") == b"RESERVED %d 1\r\nx\r\n" % second
        assert w.ask(f"change-pri {second} 0") == b"CHANGED\r\n"  # reserved: any state
        assert w.ask(f"stats-job {second}").count(b"\npri: 0\n") == 1
        assert w.ask("reserve-with-timeout 0") == b"RESERVED %d 1\r\nx\r\n" % first
        assert w.ask("change-pri 99999999 1") == b"NOT_FOUND\r\n"


def test_change_delay_brings_a_job_forward_in_real_time(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use delay-a")
        w.ask("watch delay-a")
        w.ask("ignore default")
        job_id = put(w, delay=100)
        assert w.ask("reserve-with-timeout 0") == b"TIMED_OUT\r\n"
        assert w.ask(f"change-delay {job_id} 300") == b"CHANGED\r\n"
        assert w.ask("reserve-with-timeout 2") == b"RESERVED %d 1\r\nx\r\n" % job_id
        assert w.ask(f"change-delay {job_id} 300") == b"NOT_FOUND\r\n"  # reserved, not delayed
        later = put(w, delay=100)
        assert w.ask(f"change-delay {later} 0") == b"CHANGED\r\n"
        assert w.ask("reserve-with-timeout 0") == b"RESERVED %d 1\r\nx\r\n" % later
        assert w.ask("change-delay 99999999 1") == b"NOT_FOUND\r\n"


def test_tube_pause_has_no_end_and_tube_resume_ends_it(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as plain, Wire(server.host, server.port) as w:
        w.ask("use pause-a")
        w.ask("watch pause-a")
        w.ask("ignore default")
        job_id = put(w)
        assert w.ask("tube-pause pause-a") == b"PAUSED\r\n"
        assert w.ask("reserve-with-timeout 0") == b"TIMED_OUT\r\n"
        doc = plain.yaml("stats-tube pause-a")
        assert (doc["pause"], doc["pause-time-left"]) == ("4294967295", "4294967295")
        assert w.ask("tube-resume pause-a") == b"RESUMED\r\n"
        assert w.ask("reserve-with-timeout 0") == b"RESERVED %d 1\r\nx\r\n" % job_id
        assert w.ask("tube-resume pause-a") == b"RESUMED\r\n"  # not paused: nothing to end
        assert w.ask("tube-pause no-such-tube") == b"NOT_FOUND\r\n"
        assert w.ask("tube-resume no-such-tube") == b"NOT_FOUND\r\n"


def test_a_tube_paused_with_no_end_survives_its_last_user(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("use pause-b")
        assert w.ask("tube-pause pause-b") == b"PAUSED\r\n"
        w.ask("use default")
        assert b"\n- pause-b\n" in w.ask("list-tubes")
        assert w.yaml("stats-tube pause-b")["pause"] == "4294967295"
        assert w.ask("tube-resume pause-b") == b"RESUMED\r\n"
        assert b"\n- pause-b\n" not in w.ask("list-tubes")
        assert w.ask("stats-tube pause-b") == b"NOT_FOUND\r\n"


def test_stats_tube_shows_the_figures_to_an_extended_connection_only(
        server: ServerProcess) -> None:
    with Wire(server.host, server.port) as plain, Wire(server.host, server.port) as w:
        w.ask("use figures-a")
        for delay in (10, 120, 120, 4000, 90000):
            put(w, delay=delay)
        put(w, 5)
        assert w.ask("extensions").startswith(b"OK ")
        doc = w.yaml("stats-tube figures-a")
        keys = list(doc)
        # the figures, then the groups' keys last (protocol.md, "Groups")
        assert keys[-len(admin.FIGURE_KEYS) - len(admin.GROUP_KEYS):-len(admin.GROUP_KEYS)] == \
            list(admin.FIGURE_KEYS)
        assert keys[-len(admin.GROUP_KEYS):] == list(admin.GROUP_KEYS)
        assert [doc[k] for k in admin.FIGURE_KEYS[:-1]] == ["1", "2", "0", "0", "1", "0", "1",
                                                             "0", "0"]
        assert doc["oldest-ready-age-ms"].isdigit()
        assert list(plain.yaml("stats-tube figures-a"))[-1] == "pause-time-left"


@pytest.mark.parametrize("line", [
    "clear-tube ", "clear-tube t", "clear-tube t reserved", "clear-tube t Ready",
    "clear-tube t all ", "clear-tube -t all", "clear-tube t all x",
    "list-jobs t ready 0", "list-jobs t sleeping 0 10", "list-jobs t ready 0 0",
    "list-jobs t ready 0 1001", "list-jobs t ready x 10", "list-jobs t ready 5 10",
    "list-jobs t ready 5:1 10", "list-jobs t ready 5- 10", "list-jobs t ready -1 10",
    "list-jobs t ready 9007199254740992-1 10", "list-jobs t ready 1-18446744073709551616 10",
    "list-jobs t ready 0 10 ",
    "change-pri 1", "change-pri 1 4294967296", "change-pri x 1", "change-pri 1 1 ",
    "change-delay 1", "change-delay 1 4294967295001", "change-delay 1 -5",
    "tube-pause ", "tube-pause -t", "tube-pause a b", "tube-resume ", "tube-resume a*",
])
def test_malformed_admin_lines_are_bad_format(server: ServerProcess, line: str) -> None:
    with Wire(server.host, server.port) as w:
        assert w.ask(line) == b"BAD_FORMAT\r\n"
        assert w.ask("list-tube-used") == b"USING default\r\n"  # and the connection goes on


@pytest.mark.parametrize("word", ADMIN_WORDS)
def test_a_bare_word_without_its_arguments_is_unknown_as_in_beanstalkd(
        server: ServerProcess, word: str) -> None:
    # beanstalkd answers a bare "use" (its word is "use ") UNKNOWN_COMMAND; so do tubeq's words.
    with Wire(server.host, server.port) as w:
        assert w.ask(word) == b"UNKNOWN_COMMAND\r\n"


def test_list_jobs_of_a_missing_tube_is_not_found(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        assert w.ask("list-jobs no-such-tube ready 0 10") == b"NOT_FOUND\r\n"
        assert w.ask("list-jobs no-such-tube reserved 5-1 10") == b"NOT_FOUND\r\n"
