"""``python -m bench.peers``: see bench/peers/run.py."""

import sys

from bench.peers.run import main

sys.exit(main())
