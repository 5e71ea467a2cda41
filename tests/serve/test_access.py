"""Who may use ``dsh-agent serve``: bind, token, cookie, origin, host and path checks.

From outside, on real processes (docs/design.md#serve): a non-loopback bind without a token
never starts; with a token every API, AG-UI and report request needs it (a bearer, or the
cookie ``GET /?token=`` sets), a state-changing request from another origin is refused even
with it, a ``Host`` other than the loopback names is refused on a loopback bind (DNS
rebinding), nothing outside the static and reports folders is served, and the token is never
printed. Without the ``serve`` extra the command says what to install.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .api_helpers import WAIT, Servers, assert_error, raw_request
from .conftest import COMMAND, Served, StartServed, environment

TOKEN = "tok-" + secrets.token_urlsafe(24)
OTHER_TOKEN = "env-" + secrets.token_urlsafe(24)
SECRET = f"secret-{secrets.token_hex(8)}"
REPORT = f"report-{secrets.token_hex(8)}"
SERVER_SOURCE = '"""``serve``: run the server'


@pytest.fixture(scope="module")
def reports_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``root/reports`` (one report, one text file) beside ``root/secret.html``."""
    root = tmp_path_factory.mktemp("reports-root")
    (root / "reports").mkdir()
    (root / "reports" / "run.html").write_text(f"<html>{REPORT}</html>")
    (root / "reports" / "notes.txt").write_text(SECRET)
    (root / "secret.html").write_text(f"<html>{SECRET}</html>")
    return root


@pytest.fixture(scope="module")
def servers(module_serve_factory: StartServed) -> Servers:
    return Servers(module_serve_factory)


@pytest.fixture
def token_server(servers: Servers, reports_root: Path) -> Served:
    """A loopback server with a token and a reports folder (no worker: nothing runs)."""
    reports = str(reports_root / "reports")
    return servers.get(name="token", token=TOKEN, worker=False, extra=("--reports", reports))


@pytest.fixture
async def anonymous(token_server: Served) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the token server that sends no token."""
    async with httpx.AsyncClient(base_url=token_server.url, timeout=WAIT) as http:
        yield http


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def port_of(served: Served) -> int:
    port = httpx.URL(served.url).port
    assert port is not None
    return port


# --- starting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [{}, {"DSH_AGENT_TOKEN": "  \t "}])
def test_non_loopback_host_without_token_never_starts(tmp_path: Path, env: dict[str, str]) -> None:
    store = f"sqlite:///{tmp_path / 'refused.db'}"
    args = ["serve", "--store", store, "--host", "0.0.0.0", "--port", "0"]
    done = subprocess.run(
        [*COMMAND, *args],
        cwd=tmp_path,
        env=environment(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "serving" not in done.stdout
    message = done.stderr.strip()
    assert "--token" in message, message
    assert "0.0.0.0" in message, message
    assert "Traceback" not in message


# ``None`` in ``sys.modules``: ``import`` raises ModuleNotFoundError and ``find_spec`` finds
# nothing, as when the packages are not installed.
BLOCK_SERVE_EXTRA = """
import sys
for name in ("starlette", "hypercorn", "ag_ui"):
    sys.modules[name] = None
from dsh_agent_loop.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def test_serve_without_the_extra_says_what_to_install(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'plain.db'}"
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_SERVE_EXTRA, "serve", "--store", store, "--port", "0"],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert "serving" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "dsh-agent-loop[serve]" in lines[0]


async def test_non_loopback_host_with_a_token_from_the_environment(servers: Servers) -> None:
    served = servers.get(
        name="open",
        worker=False,
        host="0.0.0.0",
        env={"DSH_AGENT_TOKEN": f"  {OTHER_TOKEN}\n"},  # surrounding whitespace is no part of it
    )
    assert served.url.startswith("http://0.0.0.0:")
    base = f"http://127.0.0.1:{port_of(served)}"
    async with httpx.AsyncClient(base_url=base, timeout=WAIT) as http:
        assert_error(await http.get("/api/sessions"), 401, "UNAUTHORIZED")
        wrong = await http.get("/api/sessions", headers=bearer(TOKEN))  # the other server's
        assert_error(wrong, 401, "UNAUTHORIZED")
        right = await http.get("/api/sessions", headers=bearer(OTHER_TOKEN))
        assert right.status_code == 200, right.text
    assert served.server is not None
    assert OTHER_TOKEN not in served.server.stdout() + served.server.stderr()


# --- the token ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/sessions"),
        ("GET", "/api/agents"),
        ("GET", "/api/fleet"),
        ("GET", "/api/reports"),
        ("GET", "/api/sessions/anything/events"),
        ("GET", "/reports/run.html"),
        ("POST", "/api/sessions"),
        ("POST", "/agui"),
    ],
)
async def test_no_token_is_401(anonymous: httpx.AsyncClient, method: str, path: str) -> None:
    body: Any = {} if method == "POST" else None
    response = await anonymous.request(method, path, json=body)
    assert_error(response, 401, "UNAUTHORIZED")
    assert REPORT not in response.text


@pytest.mark.parametrize(
    "headers",
    [
        bearer("wrong-" + TOKEN[6:]),
        bearer(TOKEN[:-1]),
        bearer(TOKEN + "x"),
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer"},
        {"Cookie": f"dsh_token={TOKEN[:-1]}"},
        {"Cookie": f"other={TOKEN}"},
    ],
)
async def test_wrong_token_is_401(anonymous: httpx.AsyncClient, headers: dict[str, str]) -> None:
    assert_error(await anonymous.get("/api/sessions", headers=headers), 401, "UNAUTHORIZED")


async def test_bearer_opens_the_api_and_the_reports(anonymous: httpx.AsyncClient) -> None:
    listed = await anonymous.get("/api/sessions", headers=bearer())
    assert listed.status_code == 200
    assert "sessions" in listed.json()
    reports = (await anonymous.get("/api/reports", headers=bearer())).json()["reports"]
    assert [r["name"] for r in reports] == ["run.html"]
    assert reports[0]["size"] == len(f"<html>{REPORT}</html>")
    report = await anonymous.get("/reports/run.html", headers=bearer())
    assert report.status_code == 200
    assert REPORT in report.text
    assert report.headers["content-type"].startswith("text/html")
    text_file = await anonymous.get("/reports/notes.txt", headers=bearer())
    assert text_file.status_code == 404
    assert SECRET not in text_file.text


async def test_token_in_the_address_becomes_a_cookie(token_server: Served) -> None:
    async with httpx.AsyncClient(base_url=token_server.url, timeout=WAIT) as http:
        response = await http.get("/", params={"token": TOKEN})
        assert response.status_code in (302, 303, 307), response.text
        location = response.headers["location"]
        assert location in ("/", f"{token_server.url}/"), location
        assert TOKEN not in location
        assert "token" not in location
        cookie = response.headers["set-cookie"]
        attributes = {a.strip().lower() for a in cookie.split(";")}
        assert cookie.startswith(f"dsh_token={TOKEN};"), cookie
        assert "httponly" in attributes, cookie
        assert "samesite=strict" in attributes, cookie
        # The client keeps the cookie: it now reaches the API without a header.
        assert http.cookies.get("dsh_token") == TOKEN
        listed = await http.get("/api/sessions")
        assert listed.status_code == 200, listed.text
        page = await http.get("/")
        assert page.status_code == 200
        assert "<html" in page.text.lower()
    async with httpx.AsyncClient(base_url=token_server.url, timeout=WAIT) as http:
        wrong = await http.get("/", params={"token": TOKEN[:-1]})
        assert "set-cookie" not in wrong.headers or TOKEN[:-1] not in wrong.headers["set-cookie"]
        assert_error(await http.get("/api/sessions"), 401, "UNAUTHORIZED")


# --- origin and host -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "http://127.0.0.1:1", "https://127.0.0.1", "null"]
)
async def test_foreign_origin_is_403_even_with_the_token(
    anonymous: httpx.AsyncClient, token_server: Served, origin: str
) -> None:
    sid = f"origin-{secrets.token_hex(4)}"
    body = {"agent": "talker", "session_id": sid}
    refused = await anonymous.post(
        "/api/sessions", json=body, headers={**bearer(), "Origin": origin}
    )
    assert_error(refused, 403, "FORBIDDEN_ORIGIN")
    # Refused before anything happened: the same create from the same origin is the first.
    same = await anonymous.post(
        "/api/sessions", json=body, headers={**bearer(), "Origin": token_server.url}
    )
    assert same.status_code == 201, same.text
    assert same.json()["id"] == sid


async def test_cross_site_fetch_is_403_even_without_origin(anonymous: httpx.AsyncClient) -> None:
    headers = {**bearer(), "Sec-Fetch-Site": "cross-site"}
    refused = await anonymous.post("/api/sessions", json={"agent": "talker"}, headers=headers)
    assert_error(refused, 403, "FORBIDDEN_ORIGIN")
    headers["Sec-Fetch-Site"] = "same-origin"
    allowed = await anonymous.post("/api/sessions", json={"agent": "talker"}, headers=headers)
    assert allowed.status_code == 201, allowed.text


async def test_host_other_than_loopback_is_403(
    anonymous: httpx.AsyncClient, token_server: Served
) -> None:
    port = port_of(token_server)
    for path in ("/api/sessions", "/", "/static/index.html"):
        response = await anonymous.get(path, headers={**bearer(), "Host": "evil.example"})
        assert_error(response, 403, "FORBIDDEN_HOST")
        response = await anonymous.get(path, headers={**bearer(), "Host": f"evil.example:{port}"})
        assert_error(response, 403, "FORBIDDEN_HOST")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        allowed = await anonymous.get("/api/sessions", headers={**bearer(), "Host": host})
        assert allowed.status_code == 200, (host, allowed.text)


# --- paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/static/../server.py",
        "/static/..%2fserver.py",
        "/static/%2e%2e/server.py",
        "/static/%2e%2e%2fserver.py",
        "/static/..%5cserver.py",
        "/static/..%2f..%2f_serve%2fserver.py",
        "/static//etc/passwd",
        "/static/%2fetc%2fpasswd",
        "/reports/../secret.html",
        "/reports/..%2fsecret.html",
        "/reports/%2e%2e/secret.html",
        "/reports/%2e%2e%2fsecret.html",
        "/reports/..%5csecret.html",
        "/reports/%2fetc%2fpasswd",
        "/reports/notes.txt",
        "/reports/notes.txt%00.html",
    ],
)
async def test_nothing_outside_the_folders_is_served(token_server: Served, path: str) -> None:
    host = f"127.0.0.1:{port_of(token_server)}"
    head = f"GET {path} HTTP/1.1\nHost: {host}\nAuthorization: Bearer {TOKEN}"
    response = await raw_request(token_server.url, head)
    body = response.body.decode(errors="replace")
    for leaked in (SECRET, SERVER_SOURCE, "root:x:"):
        assert leaked not in body, path
    assert response.status in (400, 403, 404), (path, response.status, body[:200])


async def test_static_files_are_served(anonymous: httpx.AsyncClient) -> None:
    page = await anonymous.get("/static/index.html")  # the page itself needs no token
    assert page.status_code == 200
    assert "<html" in page.text.lower()


# --- last: what the server printed -----------------------------------------------------------


async def test_token_never_printed(anonymous: httpx.AsyncClient, token_server: Served) -> None:
    # Requests that carry the token in the places a log might echo: query, header, cookie.
    await anonymous.get("/", params={"token": TOKEN})
    await anonymous.get("/api/nowhere", params={"token": TOKEN}, headers=bearer())
    await anonymous.get("/api/sessions", headers={"Host": "evil.example", **bearer()})
    await anonymous.post("/api/sessions", content=b"{", headers=bearer())
    await anonymous.get("/api/sessions", headers={"Cookie": f"dsh_token={TOKEN}x"})
    assert token_server.server is not None
    assert token_server.server.stop() == 0  # SIGTERM: a clean stop
    printed = token_server.server.stdout() + token_server.server.stderr()
    assert "serving http://127.0.0.1:" in printed
    assert TOKEN not in printed
    assert TOKEN[4:] not in printed
