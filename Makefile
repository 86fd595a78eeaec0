# tubeq: the two commands a fresh machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test lint bench bench-cluster bench-consume bench-peers bench-node-deps bench-pipeline bench-start bench-ab test-greenstalk system-deps client-deps client-apt-deps clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,pipeline,otel]'
	touch $(STAMP)

# Debian packages the suite runs against: beanstalkd (the reference), redis-server, and chromium
# (headless, for the pipeline report's page: tests/pipeline/test_report.py) with its driver
# (selenium drives the dashboard: tests/http/test_dashboard.py).
system-deps:
	@missing=""; \
	command -v beanstalkd >/dev/null 2>&1 || missing="$$missing beanstalkd"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# The foreign beanstalkd clients tests/clients/test_clients_foreign.py runs for real: PHP
# pheanstalk and Ruby beaneater from Debian (their packages pull in no interpreter, hence php-cli
# and ruby), and the Node clients from the committed lock file. A client that cannot be installed fails here, loudly.
CLIENT_APT_PACKAGES := php-cli php-pda-pheanstalk ruby ruby-beaneater
NODE_CLIENTS := tests/clients/node
NODE_STAMP := $(NODE_CLIENTS)/node_modules/.installed

client-deps: client-apt-deps $(NODE_STAMP)

client-apt-deps:
	@missing=""; \
	for pkg in $(CLIENT_APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$pkg 2>/dev/null | grep -q 'ok installed' \
			|| missing="$$missing $$pkg"; \
	done; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(NODE_STAMP): $(NODE_CLIENTS)/package.json $(NODE_CLIENTS)/package-lock.json | client-apt-deps
	cd $(NODE_CLIENTS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

run: $(STAMP) system-deps
	$(BIN)/tubeq --data-dir data $(ARGS)

# The suite in TEST_PROCESSES pytest processes (pytest-xdist), a test module whole in one of them
# (its module fixtures start once), handed out in collection order (the Spark cluster module
# first: tests/conftest.py). Most tests wait on sockets and timers while the Spark tests keep the
# cores busy: on two cores (AMD EPYC), three processes took 720 s with the CPUs 92% busy, two took
# 824 s before the pipeline tests shared one Spark session per process; one process took 21 min
# (Intel Xeon). TEST_PROCESSES=0: one process. The 25 slowest tests are listed at the end of every
# run: where the suite's time goes, for whoever makes it shorter. The suite starts many
# Python processes (servers, commands, Spark's workers): each compiles tubeq's modules again
# where PYTHONDONTWRITEBYTECODE is set in the caller's environment (0.53 s against 0.41 s to
# import tubeq's server and client, AMD EPYC), so it is unset for the run: the bytecode goes
# to the __pycache__ folders git ignores.
TEST_PROCESSES ?= 3

test: $(STAMP) system-deps client-deps
	$(BIN)/ruff check tubeq tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --durations=25

# The unit tests alone (tests/conftest.py, UNIT_TESTS): no Redis, no subprocess, no network, and
# refused if they try; seconds, not the whole suite's quarter of an hour.
.PHONY: test-fast
test-fast: $(STAMP)
	$(BIN)/pytest -q -m unit

lint: $(STAMP)
	$(BIN)/ruff check tubeq tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# tubeq against beanstalkd: fresh servers, same loads, ~15-16 min; writes bench/RESULTS.md;
# then the pipeline section (bench-pipeline below), the peers section (bench-peers below) and
# the cluster section (bench-cluster below): ~40-60 min in all. `make bench ARGS=--quick` is a
# development run of all four (bench/out/). Which command answers which question: bench/README.md.
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) system-deps bench-node-deps
	$(BIN)/python -m bench.run $(ARGS)
	$(BIN)/python -m bench.pipeline_bench $(filter --quick,$(ARGS))
	$(BIN)/python -m bench.peers $(filter --quick,$(ARGS))
	$(BIN)/python -m bench.cluster_bench $(filter --quick,$(ARGS))

# npm for BullMQ in the peers section (only nodejs and npm: not the other clients of client-deps).
bench-node-deps:
	@command -v npm >/dev/null 2>&1 || { echo "installing: nodejs npm"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }

# The peers section of `make bench` on its own: tubeq, beanstalkd (same client), BullMQ,
# saq, arq, RQ, Celery, Dramatiq; one producer then one worker (concurrency 32) each, on fresh
# private servers; ~20-30 min, writes bench/RESULTS-peers.md. The Python peers get a virtualenv
# each under bench/out/peer-venvs (pinned in pyproject.toml's bench-peer-* extras), BullMQ
# `npm ci` in bench/peers/node; a system that fails to install is reported failed in the table.
# ARGS=--quick: 1 repetition, small counts, a few minutes, bench/out/.
bench-peers: $(BENCH_STAMP) system-deps bench-node-deps
	$(BIN)/python -m bench.peers $(ARGS)

# The cluster section of `make bench` on its own: the put and cycle 64x16 loads over 64
# tubes on 1 Redis (--shards 1 and 16) and on a 3-node Redis Cluster (--shards 16), 2 tubeq
# processes each; CPU per job of every process and how the Lua work splits across the nodes;
# ~3 min, appends to bench/RESULTS-cluster.md. ARGS=--quick: ~1 min, bench/out/.
bench-cluster: $(BENCH_STAMP) system-deps
	$(BIN)/python -m bench.cluster_bench $(ARGS)

# The pipeline section of `make bench` on its own: archive rate, report time on a 10M-event
# archive (wall, with Spark start), df.write.format("tubeq") rate, and the fixed cost (report of
# a 1,000-event archive, archive --once of 1,000 events, each with Spark start); ~12 min, appends
# to bench/RESULTS-pipeline.md. ARGS=--quick: small sizes, a few minutes, bench/out/.
# ARGS="--base REV": the fixed cost's rows and the 10M report, REV against this tree, interleaved.
bench-pipeline: $(BENCH_STAMP) system-deps
	$(BIN)/python -m bench.pipeline_bench $(ARGS)

# A consume() worker against tubeq (push and pipelined reserves) and beanstalkd, in one run
# (~2-4 min); writes bench/RESULTS-consume.md.
bench-consume: $(BENCH_STAMP) system-deps
	$(BIN)/python -m bench.consume_bench $(ARGS)

# Start time: exec to listening and exec to the first reply, tubeq against beanstalkd,
# median of 20 runs each (~1 min); writes bench/RESULTS-start.md. ARGS=--runs 5: a quick look.
bench-start: $(BENCH_STAMP) system-deps
	$(BIN)/python -m bench.start_time --write $(ARGS)

# A change judged: the tubeq of a base revision (a `git archive` snapshot) against this tree's,
# make bench's rows run back to back, the order alternating, on fresh private Redis each; one
# CPU, one run. ARGS="--base REV" is required; --reps N (3), --only put,cycle (row prefixes).
# ~15-20 min for every row at --reps 3; writes bench/out/ab-<stamp>.md and prints the table.
bench-ab: $(BENCH_STAMP) system-deps
	$(BIN)/python -m bench.ab $(ARGS)

# greenstalk's own test suite (a fresh server per test, a 0.1 s start wait) against tubeq, as
# upstream runs it against beanstalkd (AGAINST=beanstalkd). Not in `make test`: the suite's file
# is greenstalk's and no registry carries it; GREENSTALK_TESTS is a copy of it from a checkout of
# the installed release (tests/upstream/run_greenstalk.py says which, and what it measured).
AGAINST ?= tubeq
test-greenstalk: $(STAMP) system-deps
	$(BIN)/python -m tests.upstream.run_greenstalk --against $(AGAINST) $(GREENSTALK_TESTS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
