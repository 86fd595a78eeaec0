"""The peers section of ``make bench``: tubeq among the other job queues.

    make bench-peers                                 the full section (bench/RESULTS-peers.md)
    .venv/bin/python -m bench.peers --quick          small counts, 1 repetition (bench/out/)

Modules, one way (orchestrator -> driver processes -> each system's own client):

* :mod:`bench.peers.run`: the orchestrator. Per system and repetition it starts the system's
  servers fresh (a private redis-server on a free loopback port; beanstalkd; tubeq on its own
  Redis), runs one producer process and then one worker process, samples the servers' CPU from
  /proc, stops everything by PID, and writes the raw results and the report. Its servers, run
  state and machine table are bench/harness/'s, as every scenario's.
* :mod:`bench.peers.envs`: where each system's client comes from. The Python peers are pinned
  in pyproject.toml (extras ``bench-peer-<system>``) and each gets a virtualenv of its own under
  bench/out/ (their redis-py pins conflict: arq < 6, kombu >= 6.4, saq < 8); BullMQ comes from
  bench/peers/node (package-lock.json, ``npm ci``). It also reads the installed versions.
* :mod:`bench.peers.driver`: the command line every Python driver process runs
  (``python -m bench.peers.driver SYSTEM ROLE ...``); :mod:`bench.peers.common` holds what the
  drivers share (the job tally, the result file). Both import the standard library only, so they
  run in any system's virtualenv.
* :mod:`bench.peers.drivers`: one module per system, written with that system's idiomatic API.
* :mod:`bench.peers.report`: bench/RESULTS-peers.md from a raw results file.

Request/reply, run on its own (``python -m bench.peers.call``; not part of ``make bench``):

* :mod:`bench.peers.call`: the orchestrator of a call run: per system and repetition fresh
  servers (as above), one worker process (``serve``), one caller process (``call``: one caller,
  then 32 at once), CPU from /proc; the report to bench/out/.
* :mod:`bench.peers.call_common`: the call drivers' contract (settings, payloads, the phases and
  their bounds), standard library only; the drivers' ``serve`` and ``call`` live beside their
  ``produce`` and ``consume`` (and bench/peers/drivers/reply_tube.py: beanstalkd's pattern).
* :mod:`bench.peers.call_report`: calls/s, latency quantiles, CPU per call, issue 32's targets.
"""
