"""greenstalk's own test suite against tubeq (or beanstalkd), unmodified (issue 31, part 1).

    make test-greenstalk GREENSTALK_TESTS=path/to/test_greenstalk.py [AGAINST=beanstalkd]

The suite starts a fresh server for each test by running ``beanstalkd -l ADDR -p PORT`` (or
``-l unix:PATH``) from PATH, waits 0.1 s, connects and runs the test; a few tests time the
server's delays within 50 ms. Here ``beanstalkd`` on PATH is tests/upstream/beanstalkd, which
runs tubeq on a redis-server this runner starts, each start in an empty namespace.

The suite's file is not in this repository (it is greenstalk's) and cannot be fetched when the
tests run: no sdist of greenstalk on PyPI (0.3.0 to 2.1.1) and no Debian package carries it. So
this is not part of ``make test``: give it the file of the installed greenstalk's release, e.g.
``tests/test_greenstalk.py`` of a checkout of greenstalk at tag v2.1.1. It uses the suite's fixed
port 4444 and /tmp/greenstalk-test.sock: one run at a time.

Measured on the 2-core Intel Xeon @ 2.50GHz, greenstalk 2.1.1 (v2.1.1's tests/test_greenstalk.py):
beanstalkd 44/44; tubeq 42/44 at a load average near 1. The two that fail time their first
command from the 0.1 s start wait: ``test_delays`` (a put with delay 1 must be reservable within
1.05 s of being sent) and ``test_reserve_raises_on_timeout`` (a 1 s reserve must time out within
1.05 s); tubeq answers its first command ~0.4 s after exec (bench/RESULTS-start.md), so both
take ~1.3 s. tubeq listens ~80 ms after exec, ~60 of them Python's own start in the dev venv:
on a busier host some tests also find nothing listening at 0.1 s (connection refused; 10 of 44
in one run), and ``test_ttr`` once saw DEADLINE_SOON a little before its 1 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tubeq.redisio.process import RedisProcess

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", type=Path, help="greenstalk's tests/test_greenstalk.py")
    parser.add_argument("--against", choices=["tubeq", "beanstalkd"], default="tubeq")
    parser.add_argument("pytest_args", nargs="*", help="passed on to pytest")
    args = parser.parse_args()
    if not args.tests.is_file():
        parser.error(f"{args.tests}: no such file (see this module's header)")
    with tempfile.TemporaryDirectory(prefix="greenstalk-suite-") as tmp:
        work = Path(tmp)
        # Its own directory and an empty ini: neither tubeq's conftest nor its pytest settings.
        shutil.copy(args.tests, work / "test_greenstalk.py")
        (work / "pytest.ini").write_text("[pytest]\n")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        redis = None
        if args.against == "tubeq":
            redis = RedisProcess(work / "redis")
            redis.start()
            env.update(PATH=f"{HERE}{os.pathsep}{env.get('PATH', '')}",
                       TUBEQ_PYTHON=sys.executable, TUBEQ_REDIS_URL=redis.url,
                       PYTHONPATH=str(REPO))
        try:
            return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   "test_greenstalk.py", *args.pytest_args],
                                  cwd=work, env=env, check=False).returncode
        finally:
            if redis is not None:
                redis.stop()


if __name__ == "__main__":
    sys.exit(main())
