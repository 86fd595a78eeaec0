"""bench/: every benchmark module still imports (make bench is not part of make test)."""
