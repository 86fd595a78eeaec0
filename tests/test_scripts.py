"""Script assembly (tubeq.scripts): each script carries only the included definitions it uses.

That every assembled script compiles and runs is the business of test_lua.py (real Redis).
"""

from __future__ import annotations

from tubeq.scripts import expand, load_all


def _defines(source: bytes, name: str) -> bool:
    return f"local function {name}(".encode() in source


def test_unused_definitions_are_left_out_and_transitive_ones_kept() -> None:
    scripts = load_all()
    assert not _defines(scripts["peek"].source, "gc_tube")
    assert not _defines(scripts["counters"].source, "grant")
    # put.lua calls hand_over -> take_entry -> grant / index_tube: kept through the chain.
    put = scripts["put"].source
    assert all(_defines(put, name) for name in ("take_entry", "grant", "index_tube"))
    assert b"@include" not in put


def test_names_in_comments_and_strings_do_not_pull_definitions() -> None:
    text = '--- @include "keys"\n--- @include "jobs"\n-- gc_tube is not called here\n' \
           "return 'requeue'\n"
    source = expand(text)
    assert "local function gc_tube(" not in source
    assert "local function requeue(" not in source
    assert source.endswith("return 'requeue'\n")


def test_a_definition_comes_with_the_comment_above_it() -> None:
    source = expand('--- @include "keys"\n--- @include "jobs"\nreturn {member(7), bump(1, 2, 3)}\n')
    assert "-- Sorted-set member of a job id" in source
    assert "-- Add delta to a counter field" in source
    assert source.index("local rcall") < source.index("local function bump(")


def test_the_scripts_that_change_a_job_take_the_bound_event_arguments() -> None:
    recording = {name for name, s in load_all().items() if s.records_events}
    assert recording == {"put", "promote", "reserve", "reserve_job", "release", "bury", "touch",
                         "expire", "disconnect", "reap", "kick", "kick_job", "delete",
                         "put_many", "delete_many",  # batches (issue 10, part 3)
                         # admin verbs (issue 10 part 6)
                         "clear_tube", "change_pri", "change_delay",
                         "schedule_tick"}  # recurring jobs: a tick puts a job
    assert b"local EVENTS_MAXLEN, EVENTS_BY = tonumber(ARGV[1]), ARGV[2]" in \
        load_all()["delete"].source
