"""The web dashboard in a real headless browser (Debian chromium + chromium-driver, driven by
selenium) against a real tubeq process: the page loads, a put shows up by itself, a buried job
is kicked, a job deleted and the tube paused by clicking; a job's page follows its failures,
progress and result, and the tubes count their jobs finished and failed."""

from __future__ import annotations

import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import redis
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys as KeyPress
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.servers import (
    ServerProcess,
    TubeqCluster,
    wait_for_http,
)
from tubeq.redisio.process import free_port
from tubeq.store.keys import JobField, Keys

# How long the page may take to show a change (it refreshes every second).
PAGE_WAIT_S = 20


class Wire:
    """A blocking text-protocol connection (selenium is synchronous, so this test is too)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def ask(self, line: bytes, body: bytes | None = None) -> bytes:
        self.sock.sendall(line + b"\r\n" + (b"" if body is None else body + b"\r\n"))
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        reply, self.buf = self.buf.split(b"\r\n", 1)
        words = reply.split()
        if words and words[0] in (b"RESERVED", b"FOUND", b"OK", b"ENDED"):
            size = int(words[-1]) + 2
            while len(self.buf) < size:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:size], self.buf[size:]
            return reply + b"\r\n" + data
        return reply + b"\r\n"

    def stat(self, line: bytes, field: bytes) -> bytes:
        for row in self.ask(line).split(b"\n"):
            if row.startswith(field + b": "):
                return row.split(b": ", 1)[1].strip()
        raise AssertionError(f"no {field!r} in {line!r}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def dashboard(tubeq_cluster: TubeqCluster) -> Iterator[tuple[ServerProcess, str]]:
    http_port = free_port("127.0.0.1")
    server = tubeq_cluster.start(label="tubeq-dashboard",
                                 flags=("--metrics", f"127.0.0.1:{http_port}"))
    wait_for_http(server, http_port)
    yield server, f"http://127.0.0.1:{http_port}"
    server.stop()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "needs Debian's chromium and chromium-driver (make system-deps)"
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900"):
        options.add_argument(arg)
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    yield chrome
    chrome.quit()


def wait_for(browser: WebDriver, css: str, text: str | None = None) -> None:
    """Until an element matching ``css`` exists (and contains ``text``)."""
    def seen(d: WebDriver) -> bool:
        return any(text is None or text in el.text
                   for el in d.find_elements(By.CSS_SELECTOR, css))

    WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.1,
                  ignored_exceptions=[StaleElementReferenceException]).until(
        seen, f"{css} {'containing ' + repr(text) if text else ''} never appeared")


def click(browser: WebDriver, element_id: str) -> None:
    """Click the element with this id; the page rebuilds its tables every second, so an
    element found a moment ago may be replaced before the click lands: find it again."""
    def clicked(d: WebDriver) -> bool:
        d.find_element(By.ID, element_id).click()
        return True

    WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.1,
                  ignored_exceptions=[StaleElementReferenceException]).until(
        clicked, f"#{element_id} could not be clicked")


def test_a_put_appears_and_a_buried_job_is_kicked_by_clicking(
        dashboard: tuple[ServerProcess, str], browser: WebDriver) -> None:
    server, url = dashboard
    wire = Wire(server.port)
    try:
        browser.get(url + "/")
        wait_for(browser, '#tubes tr[data-tube="default"]')
        assert "tubeq" in browser.title

        # A put over the protocol shows up on the open page, without a reload.
        wire.ask(b"use web")
        put = wire.ask(b"put 0 0 60 5", b"hello")
        assert put.startswith(b"INSERTED")
        wait_for(browser, '#tubes tr[data-tube="web"] td.ready', "1")
        # The servers of the namespace: this one.
        wait_for(browser, "#servers tbody tr", "(this one)")

        # Bury a job, then kick it from the tube's page.
        wire.ask(b"watch web")
        reserved = wire.ask(b"reserve-with-timeout 0")
        job_id = reserved.split()[1]
        assert wire.ask(b"bury " + job_id + b" 0") == b"BURIED\r\n"
        browser.get(f"{url}/tubes/web")
        wait_for(browser, f"#jobs-buried #kick-{job_id.decode()}")
        click(browser, f"kick-{job_id.decode()}")
        wait_for(browser, f"#jobs-ready #job-{job_id.decode()}")
        assert wire.stat(b"stats-job " + job_id, b"state") == b"ready"
        assert wire.stat(b"stats-job " + job_id, b"kicks") == b"1"

        # Peek shows the body; delete removes the job.
        click(browser, f"peek-{job_id.decode()}")
        wait_for(browser, "#peek", "hello")
        click(browser, f"delete-{job_id.decode()}")
        wait_for(browser, "#status", f"deleted job {job_id.decode()}")
        assert wire.ask(b"peek " + job_id) == b"NOT_FOUND\r\n"

        # Pause the tube from the page.
        click(browser, "pause")
        wait_for(browser, "#status", "paused for 60 s")
        assert int(wire.stat(b"stats-tube web", b"pause-time-left")) > 0
        click(browser, "resume")
        wait_for(browser, "#status", "resumed")
        assert wire.stat(b"stats-tube web", b"pause") == b"0"
    finally:
        wire.close()


def test_a_tube_link_is_percent_encoded_in_the_served_page(
        dashboard: tuple[ServerProcess, str]) -> None:
    server, url = dashboard
    wire = Wire(server.port)
    try:
        for tube in (b"a/b", b"x+y;(1)$"):
            assert wire.ask(b"use " + tube) == b"USING " + tube + b"\r\n"
            assert wire.ask(b"put 0 0 60 1", b"x").startswith(b"INSERTED ")
    finally:
        wire.close()
    with urllib.request.urlopen(f"{url}/", timeout=10) as page:  # as served, no script run
        index = page.read().decode()
    for tube, href in (("a/b", "/tubes/a%2Fb"), ("x+y;(1)$", "/tubes/x%2By%3B%281%29%24")):
        assert f'<a href="{href}">{tube}</a>' in index, index
        with urllib.request.urlopen(url + href, timeout=10) as page:
            assert page.status == 200
            assert f'<code id="tube-name">{tube}</code>' in page.read().decode()


def test_an_unknown_tube_page_says_so(dashboard: tuple[ServerProcess, str],
                                      browser: WebDriver) -> None:
    _, url = dashboard
    browser.get(f"{url}/tubes/nosuch")
    wait_for(browser, "p.error", "No tube named 'nosuch'")


def test_a_jobs_page_follows_its_failures_progress_and_result(
        dashboard: tuple[ServerProcess, str], browser: WebDriver) -> None:
    server, url = dashboard
    wire = Wire(server.port)
    try:
        assert wire.ask(b"use answers") == b"USING answers\r\n"
        job_id = wire.ask(b"put 0 0 60 8", b"question").split()[1]
        jid = job_id.decode()
        wire.ask(b"watch answers")
        assert wire.ask(b"reserve-with-timeout 0").startswith(b"RESERVED " + job_id)
        assert wire.ask(b"fail " + job_id + b" 4", b"boom") == b"FAILED\r\n"

        # Found by its id from the tube list.
        browser.get(url + "/")
        wait_for(browser, '#tubes tr[data-tube="answers"] td.failed', "1")
        wait_for(browser, '#tubes tr[data-tube="answers"] td.finished', "0")
        browser.find_element(By.ID, "find-job-id").send_keys(jid + KeyPress.ENTER)
        wait_for(browser, "#job-id", jid)
        wait_for(browser, '#job-fields tr[data-key="failures"] td', "1")
        wait_for(browser, '#job-fields tr[data-key="error"] td', "boom")
        wait_for(browser, '#job-fields tr[data-key="state"] td', "ready")
        wait_for(browser, "#body", "question")
        wait_for(browser, "#result", "not ended yet")

        # Its progress as it is reported, then its result once finished, without a reload.
        assert wire.ask(b"reserve-with-timeout 0").startswith(b"RESERVED " + job_id)
        wait_for(browser, '#job-fields tr[data-key="state"] td', "reserved")
        assert wire.ask(b"progress " + job_id + b" 3", b"1/2") == b"TOUCHED\r\n"
        wait_for(browser, "#progress", "report 1: 1/2")
        assert wire.ask(b"progress " + job_id + b" 3", b"2/2") == b"TOUCHED\r\n"
        wait_for(browser, "#progress", "report 2: 2/2")
        assert wire.ask(b"finish " + job_id + b" 6", b"answer") == b"FINISHED\r\n"
        wait_for(browser, "#job-state", "ended: finished")
        wait_for(browser, "#result", "answer")
        wait_for(browser, "#body", "gone with the job")

        # The tube list counts it finished.
        browser.get(url + "/")
        wait_for(browser, '#tubes tr[data-tube="answers"] td.finished', "1")
        wait_for(browser, '#tubes tr[data-tube="answers"] td.failed', "1")
    finally:
        wire.close()


def test_a_job_deleted_while_its_page_is_open_shows_how_it_ended(
        dashboard: tuple[ServerProcess, str], browser: WebDriver) -> None:
    """The page waits for the job (as it says): a delete's end, kept only for a job somebody
    waits for, is kept and shown."""
    server, url = dashboard
    wire = Wire(server.port)
    try:
        job_id = wire.ask(b"put 0 0 60 1", b"x").split()[1]
        browser.get(f"{url}/jobs/{job_id.decode()}")
        wait_for(browser, '#job-fields tr[data-key="state"] td', "ready")

        # Until the page's long poll is in: it marked the job (a wait of our own would too).
        job_key = Keys(server.extra["prefix"]).job(int(job_id))
        client = redis.Redis.from_url(server.extra["redis_url"])
        try:
            WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.05).until(
                lambda _: client.hget(job_key, JobField.WAITED) is not None,
                "the job page never waited for the job")
        finally:
            client.close()
        assert wire.ask(b"delete " + job_id) == b"DELETED\r\n"
        wait_for(browser, "#job-state", "ended: deleted")
        wait_for(browser, "#result", "(empty)")
    finally:
        wire.close()


def read_page(url: str) -> tuple[int, str]:
    """A page as served (no script run): its status and text."""
    try:
        with urllib.request.urlopen(url, timeout=10) as page:
            return page.status, page.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_job_page_and_the_tube_list_as_served(dashboard: tuple[ServerProcess, str]) -> None:
    server, url = dashboard
    wire = Wire(server.port)
    try:
        assert wire.ask(b"use served") == b"USING served\r\n"
        job_id = wire.ask(b"put 0 0 60 4", b"<i>?").split()[1]
        wire.ask(b"watch served")
        assert wire.ask(b"reserve-with-timeout 0").startswith(b"RESERVED " + job_id)
        assert wire.ask(b"fail " + job_id + b" 10", b"<b>bad</b>") == b"FAILED\r\n"
        jid = job_id.decode()
        status, page = read_page(f"{url}/jobs/{jid}")
        assert status == 200
        assert '<tr data-key="failures"><th>failures</th><td>1</td></tr>' in page, page
        assert '<td>&lt;b&gt;bad&lt;/b&gt;</td>' in page and "<b>bad" not in page
        assert '<pre id="body">&lt;i&gt;?</pre>' in page
        assert '<td><a href="/tubes/served">served</a></td>' in page
        assert '<pre id="result">not ended yet</pre>' in page
        # In the tube's page its id links to its own.
        _, tube_page = read_page(f"{url}/tubes/served")
        assert f'<a href="/jobs/{jid}">{jid}</a>' in tube_page

        assert wire.ask(b"reserve-with-timeout 0").startswith(b"RESERVED " + job_id)
        assert wire.ask(b"finish " + job_id + b" 7", b"<done/>") == b"FINISHED\r\n"
        status, page = read_page(f"{url}/jobs/{jid}")
        assert status == 200
        assert '<span id="job-state" class="badge">ended: finished</span>' in page
        assert '<tr data-key="ended"><th>ended</th><td>finished</td></tr>' in page
        assert '<pre id="result">&lt;done/&gt;</pre>' in page
        assert '<pre id="body">(gone with the job)</pre>' in page

        _, index = read_page(f"{url}/")
        row = index.split('<tr data-tube="served">', 1)[1].split("</tr>", 1)[0]
        assert '<td class="finished">1</td><td class="failed">1</td>' in row, row
    finally:
        wire.close()
    status, page = read_page(f"{url}/jobs/4242")
    assert status == 404 and "No job 4242, and no end of it kept." in page
    status, page = read_page(f"{url}/jobs/abc")
    assert status == 400 and "bad job id" in page


def test_a_tube_page_lists_its_held_jobs(dashboard: tuple[ServerProcess, str]) -> None:
    server, url = dashboard
    wire = Wire(server.port)
    try:
        assert wire.ask(b"use fan") == b"USING fan\r\n"
        parent = wire.ask(b"put 0 0 60 1", b"p").split()[1]
        child = wire.ask(b"put-with 0 0 60 1 after=" + parent, b"c").split()[1]
    finally:
        wire.close()
    with urllib.request.urlopen(f"{url}/tubes/fan", timeout=10) as page:
        served = page.read().decode()
    held = served[served.index('id="jobs-held"'):]
    assert f'id="job-{child.decode()}"' in held[:held.index("</table>")]


def test_a_tube_page_lists_its_groups_and_follows_them(
        dashboard: tuple[ServerProcess, str], browser: WebDriver) -> None:
    server, url = dashboard
    wire = Wire(server.port)
    try:
        assert wire.ask(b"use tenants") == b"USING tenants\r\n"
        for group in (b"a", b"a", b"b"):
            assert wire.ask(b"put-with 0 0 60 1 group=" + group, b"x").startswith(b"INSERTED")
        with urllib.request.urlopen(f"{url}/tubes/tenants", timeout=10) as page:
            served = page.read().decode()
        groups = served[served.index('id="groups"'):]
        assert '<span class="count" id="count-groups">2</span>' in groups
        assert "<tr><td>a</td><td>2</td><td>0</td></tr><tr><td>b</td><td>1</td>" in groups
        # the open page follows a new group without a reload
        browser.get(url + "/tubes/tenants")
        wait_for(browser, "#count-groups", "2")
        assert wire.ask(b"put-with 0 0 60 1 group=c", b"x").startswith(b"INSERTED")
        wait_for(browser, "#count-groups", "3")
        wait_for(browser, "#groups-busiest tbody", "c")
    finally:
        wire.close()
