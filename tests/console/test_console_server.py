"""The server side of the browser console (docs/browser-console.md): the page and its files, the
one-time WebSocket tickets, the Origin check on upgrades, ``[server] allowed_origins``, and the
files shipped in a non-editable install. The page itself is driven in tests/console/test_browser_console.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import aiohttp
import pytest

from gateway import console
from gateway.config import ConfigError, load_config
from gateway.server import TICKETS
from tests.support.gateway_peer import (
    Master,
    create_session,
    demo_config,
    fast_demo,
    make_config,
    start_gateway,
)
from tests.support.paths import REPO

TOKEN = "console-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def gw(tmp_path):
    client = await start_gateway(make_config(tmp_path, token=TOKEN, agents={"demo": fast_demo()}))
    yield client
    await client.close()


async def ticket_for(gw, session_id: str) -> str:
    resp = await gw.post(f"/v1/session/{session_id}/ws-ticket", headers=AUTH)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["expires_in"] == 30
    return body["ticket"]


async def upgrade_status(gw, session_id: str, **kw) -> int:
    try:
        ws = await gw.ws_connect(f"/v1/session/{session_id}/ws", protocols=("rawp-dps-1.0",), **kw)
    except aiohttp.WSServerHandshakeError as err:
        return err.status
    await ws.close()
    return 101


# --- the page ------------------------------------------------------------------------------------


async def test_root_redirects_to_the_page_which_needs_no_token(gw):
    resp = await gw.get("/", allow_redirects=False)
    assert resp.status == 302 and resp.headers["Location"] == "/ui"
    page = await gw.get("/ui")
    assert page.status == 200
    assert page.headers["Content-Type"].startswith("text/html")
    html = await page.text()
    assert '<script type="module" src="ui/app.js">' in html  # relative: under a route_prefix too
    # Nothing from elsewhere: every script, style and connection is the gateway's own.
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "http" not in html.replace("http-equiv", "")
    # The data is still behind the token.
    assert (await gw.get("/v1/sessions")).status == 401


@pytest.mark.parametrize(
    ("name", "content_type"),
    [("app.js", "text/javascript"), ("view.js", "text/javascript"), ("style.css", "text/css")],
)
async def test_static_files(gw, name, content_type):
    resp = await gw.get(f"/ui/{name}")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith(content_type)
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert (REPO / "gateway" / "console" / "ui" / name).read_bytes() == await resp.read()


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/..%2Fserver.py", "/ui/%2e%2e%2fconfig.py"])
async def test_only_the_console_files_are_served(gw, path):
    resp = await gw.get(path)
    assert resp.status == 404
    assert (await resp.json())["error_code"] == "NOT_FOUND"


def test_the_wheel_ships_the_console(tmp_path):
    """A non-editable install has the page: the wheel holds gateway/console/ui, and load_static reads it
    from the installed copy. Built from a copy of the sources, so the build leaves nothing in the
    repository."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("gateway", "parsers"):
        shutil.copytree(REPO / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp_path / "dist"), str(src)],
        check=True,
        cwd=tmp_path,
    )  # fmt: skip
    wheel = next((tmp_path / "dist").glob("rawp_gateway-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"gateway/console/ui/{p.name}" for p in (REPO / "gateway" / "console" / "ui").iterdir()
    }
    assert expected <= names and "gateway/console/ui/index.html" in names
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
         "--target", str(target), str(wheel)],
        check=True,
    )  # fmt: skip
    code = "import gateway, gateway.console as c; print(gateway.__file__); print(sorted(c.load_static()))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    ).stdout.splitlines()
    assert out[0].startswith(str(target))
    assert out[1] == str(sorted(p.name for p in (REPO / "gateway" / "console" / "ui").iterdir()))


# --- tickets -------------------------------------------------------------------------------------


async def new_session(gw) -> str:
    resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=AUTH)
    assert resp.status == 201, await resp.text()
    return (await resp.json())["session_id"]


async def test_a_ticket_opens_its_session_once(gw):
    sid = await new_session(gw)
    # Asking for a ticket needs the token like any other call.
    assert (await gw.post(f"/v1/session/{sid}/ws-ticket")).status == 401
    assert await upgrade_status(gw, sid) == 401
    ticket = await ticket_for(gw, sid)
    ws = await gw.ws_connect(
        f"/v1/session/{sid}/ws", protocols=("rawp-dps-1.0",), params={"ticket": ticket}
    )
    master = Master(ws, sid)
    assert (await master.next())["type"] == "session.capabilities"
    await ws.close()
    # Used once: the same ticket again is refused.
    assert await upgrade_status(gw, sid, params={"ticket": ticket}) == 401


async def test_a_ticket_is_for_one_session_and_for_upgrades_only(gw):
    a, b = await new_session(gw), await new_session(gw)
    ticket = await ticket_for(gw, a)
    assert await upgrade_status(gw, b, params={"ticket": ticket}) == 401
    # Shown where it does not belong, it is spent: not even its own session takes it now.
    assert await upgrade_status(gw, a, params={"ticket": ticket}) == 401
    other = await ticket_for(gw, a)
    assert (await gw.get(f"/v1/session/{a}", params={"ticket": other})).status == 401
    assert await upgrade_status(gw, a, params={"ticket": other}) == 101


async def test_a_ticket_is_spent_only_by_a_successful_upgrade(gw):
    """An upgrade refused for another reason (no subprotocol: 400) and a plain GET of the
    WebSocket path leave the ticket usable; the upgrade that succeeds spends it."""
    sid = await new_session(gw)
    ticket = await ticket_for(gw, sid)
    no_protocol = await gw.get(
        f"/v1/session/{sid}/ws",
        params={"ticket": ticket},
        headers={
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    assert no_protocol.status == 400
    assert (await no_protocol.json())["error_code"] == "SUBPROTOCOL_REQUIRED"
    plain = await gw.get(
        f"/v1/session/{sid}/ws",
        params={"ticket": ticket},
        headers={"Sec-WebSocket-Protocol": "rawp-dps-1.0"},
    )
    assert plain.status == 400
    assert await upgrade_status(gw, sid, params={"ticket": ticket}) == 101
    assert await upgrade_status(gw, sid, params={"ticket": ticket}) == 401


async def test_tickets_are_bounded_per_credential(gw):
    """One credential cannot take every ticket: past per_owner unused ones its requests are 429
    while the total has room, and spending one makes room again."""
    sid = await new_session(gw)
    gw.app[TICKETS].per_owner = 2
    first = await ticket_for(gw, sid)
    await ticket_for(gw, sid)
    resp = await gw.post(f"/v1/session/{sid}/ws-ticket", headers=AUTH)
    assert resp.status == 429 and (await resp.json())["error_code"] == "TOO_MANY_TICKETS"
    assert len(gw.app[TICKETS]) == 2 < gw.app[TICKETS].capacity
    assert await upgrade_status(gw, sid, params={"ticket": first}) == 101
    await ticket_for(gw, sid)


def test_ticket_store_bounds_each_owner_apart():
    store = console.TicketStore(ttl_sec=30, capacity=10, per_owner=2)
    a = [store.issue("s", now=0.0, owner="a") for _ in range(3)]
    assert a[0] and a[1] and a[2] is None
    assert store.issue("s", now=0.0, owner="b") is not None  # another credential is not locked out
    assert store.valid(a[0], "s", now=1.0) and store.spend(a[0])
    assert store.issue("s", now=1.0, owner="a") is not None
    assert store.issue("s", now=31.0, owner="a") is not None  # expired ones count no more


async def test_unknown_session_has_no_ticket(gw):
    resp = await gw.post("/v1/session/00000000-0000-4000-8000-000000000000/ws-ticket", headers=AUTH)
    assert resp.status == 404
    assert (await resp.json())["error_code"] == "SESSION_NOT_FOUND"


async def test_tickets_are_bounded(gw):
    sid = await new_session(gw)
    gw.app[TICKETS].capacity = 2
    await ticket_for(gw, sid)
    kept = await ticket_for(gw, sid)
    resp = await gw.post(f"/v1/session/{sid}/ws-ticket", headers=AUTH)
    assert resp.status == 429
    assert (await resp.json())["error_code"] == "TOO_MANY_TICKETS"
    # Refusing a new one lost none of the old ones.
    assert await upgrade_status(gw, sid, params={"ticket": kept}) == 101


def test_ticket_store_expiry_and_capacity():
    store = console.TicketStore(ttl_sec=30, capacity=2)
    t1 = store.issue("s1", now=0.0)
    assert t1 is not None and store.issue("s1", now=1.0) is not None
    assert store.issue("s1", now=2.0) is None  # full
    assert store.valid(t1, "s1", now=29.9) and store.spend(t1)
    assert not store.valid(t1, "s1", now=29.9) and not store.spend(t1)  # once
    late = store.issue("s2", now=10.0)
    assert late is not None
    assert not store.valid(late, "s2", now=40.0)  # expired at 40
    assert len(store) == 0  # expired ones are dropped, so the space is free again
    assert store.issue("s3", now=50.0) is not None


# --- Origin ----------------------------------------------------------------------------------------


async def test_upgrades_from_other_origins_are_refused(tmp_path):
    config = demo_config(tmp_path, allowed_origins=frozenset({"https://ok.example"}))
    gw = await start_gateway(config)
    try:
        sid = (await create_session(gw))["session_id"]
        own = f"http://{gw.host}:{gw.port}"
        assert await upgrade_status(gw, sid) == 101  # no Origin: a non-browser master
        assert await upgrade_status(gw, sid, headers={"Origin": own}) == 101
        assert await upgrade_status(gw, sid, headers={"Origin": "https://OK.example/"}) == 101
        for origin in ("https://evil.example", "null", f"https://{gw.host}:{gw.port}"):
            resp = await gw.get(
                f"/v1/session/{sid}/ws",
                headers={
                    "Origin": origin,
                    "Connection": "Upgrade",
                    "Upgrade": "websocket",
                    "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                    "Sec-WebSocket-Protocol": "rawp-dps-1.0",
                },
            )
            assert resp.status == 403, origin
            assert (await resp.json())["error_code"] == "ORIGIN_FORBIDDEN"
    finally:
        await gw.close()


def test_allowed_origins_config(tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text('[server]\nallowed_origins = ["https://Console.example:8443/", "http://a.b"]\n')
    config = load_config(path, environ={})
    assert config.server.allowed_origins == {"https://console.example:8443", "http://a.b"}
    for bad in ('["ftp://x"]', '["https://x/path"]', '["x"]', "[1]", '"https://x"'):
        path.write_text(f"[server]\nallowed_origins = {bad}\n")
        with pytest.raises(ConfigError, match="allowed_origins"):
            load_config(path, environ={})
    many = ", ".join(f'"https://h{i}.example"' for i in range(65))
    path.write_text(f"[server]\nallowed_origins = [{many}]\n")
    with pytest.raises(ConfigError, match="at most 64"):
        load_config(path, environ={})
