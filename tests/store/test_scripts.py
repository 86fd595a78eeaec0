"""Script assembly (tubeq.store.scripts): each script carries only the included definitions it uses;
the library holds every script as a function, binding per call what a script reads per call.

That every assembled script and the library compile and run is the business of test_lua.py
(real Redis, both ways).
"""

from __future__ import annotations

import re
from importlib import resources

from tubeq.store.scripts import (
    INCLUDE_ORDER,
    calls_only_reads,
    expand,
    library,
    load_all,
    script_names,
)


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


def test_string_constants_are_written_in_by_script_and_in_the_library() -> None:
    """In the library too: a Lua function holds at most 200 locals, and the library's main
    chunk declares every other shared definition."""
    source = expand('--- @include "keys"\n'
                    "return {JOB_TUBE, 'JOB_TUBE', x.JOB_TUBE} -- JOB_TUBE\n")
    assert "local JOB_TUBE" not in source
    assert source.endswith("return {'t', 'JOB_TUBE', x.JOB_TUBE} -- JOB_TUBE\n")
    put = load_all()["put"].source
    assert b"local JOB_STATE" not in put and b"JOB_STATE, 'ready'" not in put
    assert b"redis.call('HSET', jk, 't', t, 's', 'ready', 'p', text(pri)," in put  # store_job
    code = library().source.decode()
    assert "local JOB_STATE" not in code
    assert "redis.call('HSET', jk, 't', t, 's', 'ready', 'p', text(pri)," in code


def test_the_scripts_that_change_a_job_take_the_bound_event_arguments() -> None:
    recording = {name for name, s in load_all().items() if s.records_events}
    assert recording == {"put", "promote", "reserve", "reserve_job", "release", "bury", "touch",
                         "expire", "disconnect", "reap", "kick", "kick_job", "delete",
                         "put_many", "delete_many",  # batches (issue 10, part 3)
                         # admin verbs (issue 10 part 6)
                         "clear_tube", "change_pri", "change_delay",
                         "schedule_tick",  # recurring jobs: a tick puts a job
                         "finish", "fail", "cancel", "progress",  # ends (wait: a read that marks)
                         "after_end",  # dependencies: a held child told its parent ended
                         "hand_back"}  # quiet shutdowns
    assert b"local EVENTS_MAXLEN, EVENTS_BY = tonumber(ARGV[1]), ARGV[2]" in \
        load_all()["delete"].source


def test_the_library_has_a_function_per_script_named_after_its_version() -> None:
    lib = library()
    version = lib.name.removeprefix("tubeq_")
    assert len(version) == 12 and lib.source.startswith(f"#!lua name={lib.name}\n".encode())
    assert set(lib.functions) == set(script_names())
    for script, function in lib.functions.items():
        assert function == f"tq{version}_{script}"
        assert f"function_name = '{function}'".encode() in lib.source


def _wrapper(script: str) -> str:
    """The text of one script's function in the library, up to the next one."""
    source = library().source.decode()
    start = source.index(f"function_name = '{library().functions[script]}'")
    end = source.find("redis.register_function", start)
    return source[start:end if end > 0 else None]


def test_a_function_binds_the_call_s_arguments_before_the_script_s_body() -> None:
    delete = _wrapper("delete")
    # KEYS/ARGV, the key names (when the root changed), then what depends on the arguments,
    # before the body's first line.
    order = ["KEYS, ARGV = keys, args", "bind_root()",
             "EVENTS_MAXLEN, EVENTS_BY = tonumber(ARGV[1]), ARGV[2]", "rcall = redis.call",
             "local token, id, now = ARGV[3], ARGV[4], tonumber(ARGV[5])"]
    assert [delete.index(line) for line in order] == sorted(delete.index(line) for line in order)
    assert "EVENTS_MAXLEN" not in _wrapper("peek")  # bound only where the script reads them
    source = library().source.decode()
    shared = source[:source.index("redis.register_function")]  # the includes' definitions
    # Nothing that depends on a call is computed at load time (Redis has no KEYS, ARGV or
    # redis.call then): declared as locals, assigned per call.
    assert re.search(r"^local NS =|^local K_\w+ =|^local rcall =|^local EVENTS_MAXLEN,",
                     shared, re.MULTILINE) is None
    assert "local K_JOB_IDS\n" in source and "  K_JOB_IDS = NS .. 'id'\n" in source


def test_only_scripts_that_call_nothing_but_reads_are_read_only_functions() -> None:
    scripts = load_all()
    assert scripts["peek"].read_only and scripts["stats"].read_only
    assert not scripts["put"].read_only and not scripts["reserve"].read_only
    assert "flags = {'no-writes'}" in _wrapper("peek")
    assert "no-writes" not in _wrapper("put")
    assert calls_only_reads("rcall('HGET', k, 'f') return redis.call(\"ZRANGE\", k, 0, 1)")
    assert not calls_only_reads("rcall('HGET', k, 'f') rcall('HSET', k, 'f', 1)")
    assert not calls_only_reads("local cmd = 'HGET' return rcall(cmd, k, 'f')")  # not literal
    assert calls_only_reads("-- rcall('DEL', k) in a comment\nreturn rcall('GET', k)")


# A Redis call on a job's hash (its key `jk` or k_job(...)), up to where its parentheses close.
_JOB_HASH_CALL = re.compile(r"(?:rcall|redis\.call)\('H[A-Z]+', (?:jk|k_job\()")


def _job_hash_calls(text: str) -> list[str]:
    calls = []
    for found in _JOB_HASH_CALL.finditer(text):
        depth, end = 0, found.start()
        while True:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
            if depth == 0 and text[end - 1] == ")":
                break
        calls.append(text[found.start():end])
    return calls


def test_scripts_name_the_job_records_fields_by_their_constants() -> None:
    # The job record's fields are named once (lua/includes/job_record.lua); a letter written
    # at a call site would be a field that table does not document. The only quoted words
    # left in such a call are state names ('ready', 'delayed', 'reserved', 'buried', 'held').
    folder = resources.files("tubeq.store").joinpath("lua")
    files = [*folder.iterdir(), *folder.joinpath("includes").iterdir()]
    calls = [c for f in files if f.name.endswith(".lua") for c in _job_hash_calls(f.read_text())]
    assert len(calls) > 50  # the scan finds them
    for call in calls:
        assert set(re.findall(r"'(\w*)'", call)) <= {"HSET", "HMGET", "HGET", "HDEL", "HINCRBY",
                                                       "HEXISTS", "ready", "delayed", "reserved",
                                                       "buried", "held"}, call


def test_the_library_places_every_include_in_its_order() -> None:
    # A new file under lua/includes/ must be given its place (after what it uses), or the
    # library would lack its definitions: library() refuses to build without it.
    folder = resources.files("tubeq.store").joinpath("lua", "includes")
    assert set(INCLUDE_ORDER) == {p.name[:-4] for p in folder.iterdir() if p.name.endswith(".lua")}
