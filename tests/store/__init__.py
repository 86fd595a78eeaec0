"""tubeq.store: every Lua script against a real Redis with a clock the test moves, events,
shards and the layout record; script assembly alone is a unit test."""
