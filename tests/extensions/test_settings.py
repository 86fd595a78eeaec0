"""The extension scaffolding: option grammar, ``extensions``, ``tube-set`` and the extra keys
of stats-tube, against a real tubeq on a real Redis."""

from __future__ import annotations

import pytest

from tests.support.servers import ServerProcess
from tests.support.wire import Wire
from tubeq.model import options
from tubeq.model.options import PUT_OPTIONS, TUBE_SETTINGS, BadFormat, BadOption


def test_options_parse_in_spec_order_whatever_the_order_sent() -> None:
    parsed = options.parse(b" ttl-ms=500  max-tries=3", TUBE_SETTINGS)
    assert parsed == (("max-tries", 3), ("ttl-ms", 500))
    assert options.parse(b"", TUBE_SETTINGS) == ()
    assert options.parse(b" key=order:42 on-expire=delete", PUT_OPTIONS) == (
        ("on-expire", "delete"), ("key", "order:42"))


@pytest.mark.parametrize("text", [
    b" max-tries", b"max-tries=1", b" max-tries=1 ", b" =1", b" Max-Tries=1", b" 9x=1",
])
def test_options_that_are_not_name_value_tokens_are_bad_format(text: bytes) -> None:
    with pytest.raises(BadFormat):
        options.parse(text, TUBE_SETTINGS)


@pytest.mark.parametrize(("text", "name"), [
    (b" colour=red", "colour"),
    (b" max-tries=1 max-tries=2", "max-tries"),
    (b" max-tries=-1", "max-tries"),
    (b" max-tries=4294967296", "max-tries"),
    (b" ttl-ms=1e3", "ttl-ms"),
    (b" on-expire=archive", "on-expire"),
    (b" key=", "key"),
])
def test_refused_options_name_themselves(text: bytes, name: str) -> None:
    with pytest.raises(BadOption) as refused:
        options.parse(text, {**TUBE_SETTINGS, **PUT_OPTIONS})
    assert refused.value.name == name


def test_a_key_is_printable_without_space_or_equals_and_at_most_200_bytes() -> None:
    assert options.parse(b" key=" + b"k" * 200, PUT_OPTIONS) == (("key", "k" * 200),)
    for bad in (b"k" * 201, b"a=b", b"caf\xc3\xa9"):
        with pytest.raises(BadOption):
            options.parse(b" key=" + bad, PUT_OPTIONS)


def test_extensions_lists_the_extension_words(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        reply = w.ask("extensions")
        words = reply.split(b"\r\n", 1)[1].decode().split("\n")
        assert "- push" in words and "- tube-set" in words and "- extensions" in words
        assert w.ask("extensionsx") == b"BAD_FORMAT\r\n"


def test_tube_set_changes_settings_that_stats_tube_shows_to_a_tubeq_client(
        server: ServerProcess) -> None:
    with Wire(server.host, server.port) as plain, Wire(server.host, server.port) as ext:
        plain.ask("use settings-a")
        assert ext.ask("tube-set settings-a max-tries=3 ttl-ms=60000 on-expire=delete "
                       "rate=50 concurrency=4") == b"SET\r\n"
        doc = ext.yaml("stats-tube settings-a")
        assert list(doc)[:15] == [
            "name", "current-jobs-urgent", "current-jobs-ready", "current-jobs-reserved",
            "current-jobs-delayed", "current-jobs-buried", "total-jobs", "current-using",
            "current-watching", "current-waiting", "cmd-delete", "cmd-pause-tube", "pause",
            "pause-time-left", "max-tries"]
        assert {k: doc[k] for k in TUBE_SETTINGS} == {
            "max-tries": "3", "backoff-ms": "0", "backoff-max-ms": "0", "ttl-ms": "60000",
            "on-expire": "delete", "rate": "50", "concurrency": "4", "max-jobs": "0",
            "group-concurrency": "0", "group-rate": "0"}
        # A client that never sent an extension sees beanstalkd's document, nothing more.
        assert list(plain.yaml("stats-tube settings-a"))[-1] == "pause-time-left"
        # Back to the defaults, one at a time; the others stay.
        assert ext.ask("tube-set settings-a max-tries=0 on-expire=bury") == b"SET\r\n"
        doc = ext.yaml("stats-tube settings-a")
        assert (doc["max-tries"], doc["on-expire"], doc["ttl-ms"]) == ("0", "bury", "60000")


def test_settings_outlive_their_tube(server: ServerProcess) -> None:
    with Wire(server.host, server.port) as w:
        assert w.ask("tube-set settings-gone backoff-ms=250") == b"SET\r\n"
        assert w.ask("stats-tube settings-gone") == b"NOT_FOUND\r\n"  # set, not created
        assert w.ask("use settings-gone").startswith(b"USING")
        assert w.yaml("stats-tube settings-gone")["backoff-ms"] == "250"
        assert w.ask("use default").startswith(b"USING")
        assert w.ask("stats-tube settings-gone") == b"NOT_FOUND\r\n"  # the tube went
        assert w.ask("use settings-gone").startswith(b"USING")
        assert w.yaml("stats-tube settings-gone")["backoff-ms"] == "250"  # its settings did not


@pytest.mark.parametrize(("line", "reply"), [
    ("tube-set settings-b", b"BAD_FORMAT\r\n"),
    ("tube-set settings-b ", b"BAD_FORMAT\r\n"),
    ("tube-set -bad max-tries=1", b"BAD_FORMAT\r\n"),
    ("tube-set settings-b max-tries", b"BAD_FORMAT\r\n"),
    ("tube-set settings-b max-tries=1 ", b"BAD_FORMAT\r\n"),
    ("tube-set settings-b colour=red", b"BAD_OPTION colour\r\n"),
    ("tube-set settings-b key=abc", b"BAD_OPTION key\r\n"),  # a job's option, not a tube's
    ("tube-set settings-b rate=1 rate=2", b"BAD_OPTION rate\r\n"),
    ("tube-set settings-b max-tries=1 ttl-ms=x", b"BAD_OPTION ttl-ms\r\n"),
    ("tube-set " + "t" * 201 + " rate=1", b"BAD_FORMAT\r\n"),
])
def test_a_refused_tube_set_stores_nothing(server: ServerProcess, line: str, reply: bytes) -> None:
    with Wire(server.host, server.port) as w:
        w.ask("extensions")  # the extra keys are shown to this connection
        w.ask("use settings-b")
        assert w.ask(line) == reply
        doc = w.yaml("stats-tube settings-b")
        assert {k: doc[k] for k in TUBE_SETTINGS} == dict(
            (k, str(v)) for k, v in options.DEFAULTS.items())
        assert w.ask("stats-tube settings-b").startswith(b"OK")  # still serving
