"""tubeq: a beanstalkd-compatible job queue server whose state lives in Redis."""

__version__ = "0.1.0"
