"""The benchmark harness: what every scenario of bench/ measures with.

Owns: where bench/ lives and writes (paths), the servers a run starts and stops by PID
(servers), the beanstalk load generator and its batch loads (loadgen, batch_load, load_core), CPU
and memory from /proc (procstat), Redis's INFO (redisinfo), py-spy profiles (profiling), the
machine and versions a run names (machine), memory per idle connection (idle_connections), one
run's rows, scale, clock, quiet gate and records (bench), and how figures over repetitions are
summarised and tabled (summary).

Rules: the harness imports nothing of bench/ outside bench/harness/
(tests/bench/test_bench_imports.py walks it). Scenarios (bench/run.py, batch_bench,
consume_bench, cluster_bench, pipeline_bench, bench/peers/) and probes (bench/probes/) import
the harness, never the other way round.
"""
