"""tubeq: a beanstalkd-compatible job queue server whose state lives in Redis.

Owns :data:`__version__`, the release's version and its one source (pyproject.toml reads it from
here). It moves with every release; the data layout a build writes in Redis has a version of
its own (tubeq.store.keys.LAYOUT_VERSION), which moves only when that layout changes.
"""

__version__ = "0.3.0.dev0"
