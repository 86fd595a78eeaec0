"""One module per system: ``produce(settings)`` and ``consume(settings)``, each returning the
dict bench/peers/common.py describes, written with that system's idiomatic client API."""
