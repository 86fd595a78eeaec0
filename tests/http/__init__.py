"""tubeq.http against a real tubeq: the JSON API, access and TLS, /metrics, the dashboard in
a headless browser, and a hypothesis fuzz of malformed requests."""
