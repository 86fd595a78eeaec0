"""The HTTP listener with an access file (bearer tokens into namespaces), put-with's options
over HTTP, and HTTPS with the protocol listener's certificate: real sockets, the session's Redis."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import trustme

from tests.support.http_support import running_server
from tubeq.server.access import AccessConfig
from tubeq.server.listeners import TlsFiles

BILLING = "billing-token-0123456789"
EMAILS = "emails-token-0123456789a"
OPERATOR = "operator-token-0123456789"  # the default namespace's: /metrics takes it
ACCESS = AccessConfig(tokens={BILLING: "billing", EMAILS: "emails", OPERATOR: "default"})


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_tokens_choose_the_namespace_and_none_is_a_401(redis_url: str) -> None:
    async with running_server(redis_url, access=ACCESS) as server, aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{server.http_port}"
        async with http.post(f"{base}/api/tubes/jobs/jobs", data=b"x") as r:
            assert r.status == 401
            assert (await r.json())["error"].startswith("this server requires a token")
        async with http.post(f"{base}/api/tubes/jobs/jobs", data=b"x",
                             headers=_bearer("wrong-token-0123456789")) as r:
            assert (r.status, await r.json()) == (401, {"error": "unknown token"})
        async with http.post(f"{base}/api/tubes/jobs/jobs", data=b"invoice",
                             headers=_bearer(BILLING)) as r:
            assert r.status == 201 and (await r.json())["id"] == 1
        async with http.post(f"{base}/api/tubes/jobs/jobs", data=b"welcome",
                             headers=_bearer(EMAILS)) as r:
            assert r.status == 201 and (await r.json())["id"] == 1  # its own namespace's ids
        # Consuming through each token sees its own job only; the dashboard takes ?token=.
        for token, body in ((BILLING, "invoice"), (EMAILS, "welcome")):
            async with http.post(f"{base}/api/tubes/jobs/reserve?timeout=1",
                                 headers=_bearer(token)) as r:
                assert r.status == 200 and (await r.json())["body"] == body
        async with http.get(f"{base}/?token={BILLING}") as r:
            assert r.status == 200 and "billing" in await r.text()
        async with http.get(f"{base}/") as r:
            assert r.status == 401


async def test_a_token_in_the_query_is_no_option_on_any_route(redis_url: str) -> None:
    async with running_server(redis_url, access=ACCESS) as server, aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{server.http_port}"
        t = f"token={BILLING}"
        async with http.post(f"{base}/api/tubes/e/jobs?{t}&pri=5", data=b"raw") as r:
            assert r.status == 201, await r.text()
        async with http.post(f"{base}/api/tubes/e/jobs?{t}", json={"body": "json"}) as r:
            assert r.status == 201, await r.text()
        async with http.get(f"{base}/api/tubes/e/jobs?{t}&state=ready") as r:
            assert r.status == 200, await r.text()
            assert [j["body"] for j in (await r.json())["jobs"]] == ["raw", "json"]
        async with http.post(f"{base}/api/tubes/e/reserve?{t}&timeout=1") as r:
            assert r.status == 200, await r.text()
            got = await r.json()
        async with http.delete(f"{base}/api/jobs/{got['id']}?{t}&"
                               f"reservation={got['reservation']}") as r:
            assert r.status == 200, await r.text()
        async with http.post(f"{base}/api/tubes/e/kick?{t}&bound=5") as r:
            assert r.status == 200, await r.text()
        async with http.post(f"{base}/api/tubes/e/pause?{t}", json={"delay": 0}) as r:
            assert r.status == 200, await r.text()
        # The token picked the namespace: billing holds the job left, emails has no tube e.
        async with http.get(f"{base}/api/tubes/e?token={EMAILS}") as r:
            assert r.status == 404
        async with http.get(f"{base}/api/tubes/e?{t}") as r:
            assert (await r.json())["current-jobs-ready"] == 1
        # In a JSON body "token" is not the credential, so it stays an unknown option.
        async with http.post(f"{base}/api/tubes/e/kick?{t}", json={"token": BILLING}) as r:
            assert r.status == 400 and "unknown option 'token'" in (await r.json())["error"]


async def test_put_with_options_over_http(redis_url: str) -> None:
    async with running_server(redis_url) as server, aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{server.http_port}"
        url = f"{base}/api/tubes/orders/jobs"
        async with http.post(url, json={"body": "close 42", "key": "close:42",
                                        "delay-ms": 1500, "max-tries": 3}) as r:
            assert r.status == 201
            first = await r.json()
            assert first["state"] == "delayed"
        async with http.post(url + "?key=close:42", data=b"again") as r:
            assert (r.status, await r.json()) == (
                200, {"id": first["id"], "tube": "orders", "duplicate": True})
        for query, name in (("max-tries=-1", "max-tries"), ("on-expire=archive", "on-expire"),
                            ("key=a%20b", "key")):
            async with http.post(f"{url}?{query}", data=b"x") as r:
                assert r.status == 400
                assert name in (await r.json())["error"]
        async with http.post(url + "?delay=2&delay-ms=100", data=b"x") as r:
            assert r.status == 400


async def test_https_with_the_protocol_certificate(redis_url: str, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    tls = TlsFiles(tmp_path / "cert.pem", tmp_path / "key.pem")
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    async with running_server(redis_url, tls=tls) as server, aiohttp.ClientSession() as http:
        async with http.get(f"https://127.0.0.1:{server.http_port}/api/stats",
                            ssl=client_tls) as r:
            assert r.status == 200 and "current-jobs-ready" in await r.json()
        try:
            async with http.get(f"http://127.0.0.1:{server.http_port}/api/stats") as r:
                plain = r.status
        except aiohttp.ClientError:
            plain = None
        assert plain != 200  # plain HTTP at an HTTPS listener is not served


async def test_requests_past_the_rate_get_429_per_client(redis_url: str) -> None:
    async with running_server(redis_url, access=ACCESS, http_rate=5) as server, \
            aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{server.http_port}"
        statuses = []
        for _ in range(8):  # a burst: the bucket holds 5
            async with http.get(f"{base}/api/stats", headers=_bearer(BILLING)) as r:
                statuses.append(r.status)
                if r.status == 429:
                    assert int(r.headers["Retry-After"]) >= 1
                    assert "too many requests" in (await r.json())["error"]
        assert statuses.count(200) >= 5 and statuses[-1] == 429
        async with http.get(f"{base}/api/stats", headers=_bearer(EMAILS)) as r:
            assert r.status == 200  # another token has a bucket of its own
        for _ in range(8):
            async with http.get(f"{base}/metrics", headers=_bearer(OPERATOR)) as r:
                assert r.status == 200  # scrapes are never limited


def test_a_bucket_refills_at_its_rate() -> None:
    from tubeq.http.ratelimit import RateLimiter

    now = [100.0]
    limiter = RateLimiter(2, clock=lambda: now[0])
    assert [limiter.take("a"), limiter.take("a")] == [0.0, 0.0]
    assert limiter.take("a") == 0.5  # empty: the next token in half a second
    now[0] += 0.5
    assert limiter.take("a") == 0.0
    assert limiter.take("b") == 0.0  # clients do not share
