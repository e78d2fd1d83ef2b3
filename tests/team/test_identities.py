"""Identities, roles and the audit log (docs/identities.md), with real parts: a users file, tokens
signed by an RSA key made here and served from a JWKS endpoint on 127.0.0.1, the demo agent and real
WebSocket masters."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time

import aiohttp
import jwt
import pytest

from gateway.config import ConfigError, load_config
from gateway.config.auth import AuthSettings, OidcSettings
from gateway.server import AUDIT, AUTH, CONFIG, SESSIONS, create_app, reload_users
from gateway.team import auth, roles
from gateway.team.audit import AuditLog
from tests.support.auth import bearer, users_config, users_toml
from tests.support.gateway_peer import (
    GatewayTestServer,
    Master,
    base_url,
    fast_demo,
    make_config,
    start_gateway,
)
from tests.support.oidc_issuer import AUDIENCE, Issuer, Key, hs256_with_public_key, unsigned_token
from tests.support.serve_process import reload_refused, serve, sighup_until
from tests.support.servers import CLI

ADMIN_TOKEN = "admin-token-0123456789"
TOKENS = {"alice": "alice-token-aaaa", "bob": "bob-token-bbbb", "olga": "olga-token-oooo"}
ROLES = {"alice": "operator", "bob": "viewer", "olga": "operator"}
CONTROL_FRAMES = {
    "control.prompt.request": {"prompt_text": "write viewer.txt"},
    "control.prompt.cancel": {"target_turn_id": "00000000-0000-4000-8000-000000000000"},
    "control.interaction.response": {"interaction_id": "x", "selected_value": "allow"},
    "control.interaction.timeout": {"interaction_id": "x"},
    "control.session.compact": {},
    "control.mode.switch": {"mode": "plan"},
    "control.file.search": {"search_id": "s", "query": "x"},
    "control.file.search.cancel": {"search_id": "s"},
}


@pytest.fixture
async def issuer():
    it = Issuer()
    await it.start()
    yield it
    await it.close()


@pytest.fixture
async def gw(tmp_path, issuer):
    users = tmp_path / "users.toml"
    users.write_text(users_toml({n: (ROLES[n], TOKENS[n]) for n in TOKENS}))
    settings = AuthSettings(
        users_file=users,
        audit_log=tmp_path / "audit" / "audit.jsonl",
        oidc=OidcSettings(issuer=issuer.url, audience=AUDIENCE),  # jwks_url from discovery
    )
    config = make_config(tmp_path, token=ADMIN_TOKEN, auth=settings, agents={"demo": fast_demo()})
    client = await start_gateway(config)
    yield client
    await client.close()


async def create(client, token: str, **body) -> dict:
    resp = await client.post("/v1/session", json={"agent": "demo", **body}, headers=bearer(token))
    assert resp.status == 201, await resp.text()
    return await resp.json()


async def audit_records(client) -> list[dict]:
    log = client.app[AUDIT]
    await log.flush()
    return [json.loads(line) for line in log.path.read_text().splitlines()]


async def error_of(resp: aiohttp.ClientResponse) -> tuple[int, str]:
    return resp.status, (await resp.json())["error_code"]


# --- credentials ------------------------------------------------------------------------------


async def test_each_credential_is_a_user_with_a_role(gw, issuer):
    """token_file: admin/admin; users file: its name and role; OIDC: the sub and the role claim
    (a list: the highest known role wins), keys found through the issuer's discovery document."""
    cases = [
        (ADMIN_TOKEN, {"user": "admin", "role": "admin"}),
        (TOKENS["alice"], {"user": "alice", "role": "operator"}),
        (TOKENS["bob"], {"user": "bob", "role": "viewer"}),
        (issuer.token("carol", "operator"), {"user": "carol", "role": "operator"}),
        (issuer.token("dave", ["viewer", "nonsense", "admin"]), {"user": "dave", "role": "admin"}),
    ]
    for token, expected in cases:
        resp = await gw.get("/v1/whoami", headers=bearer(token))
        assert resp.status == 200
        assert await resp.json() == expected
    assert issuer.fetches == 1  # the key set is cached


async def test_a_token_with_no_known_role_is_forbidden(gw, issuer):
    resp = await gw.get("/v1/whoami", headers=bearer(issuer.token("erin", "superuser")))
    assert await error_of(resp) == (403, "FORBIDDEN")


async def test_refused_tokens_are_401_and_audited_without_the_token(gw, issuer):
    """Expired, wrong audience, wrong issuer, alg none, HS256 signed with the public key, a key the
    issuer does not have, a users-file token nobody has: each 401 UNAUTHORIZED; the audit log
    says why, and never holds the token."""
    now = int(time.time())
    claims = {"sub": "mallory", "aud": AUDIENCE, "iss": issuer.url, "exp": now + 300,
              "rawp_role": "admin"}  # fmt: skip
    stranger = Key("key-1")  # the issuer's kid, another key
    bad = {
        "expired": issuer.token("mallory", "admin", exp_in=-3600),
        "wrong audience": issuer.token("mallory", "admin", aud="someone-else"),
        "wrong issuer": issuer.token("mallory", "admin", iss="https://evil.example"),
        "alg none": unsigned_token(claims, "key-1"),
        "hs256 with the public key": hs256_with_public_key(claims, issuer.keys[0]),
        "signed by another key": issuer.token("mallory", "admin", key=stranger),
        "unknown users-file token": "not-a-users-token",
    }
    for name, token in bad.items():
        resp = await gw.post("/v1/session", json={"agent": "demo"}, headers=bearer(token))
        assert await error_of(resp) == (401, "UNAUTHORIZED"), name
    assert (await (await gw.get("/v1/sessions", headers=bearer(ADMIN_TOKEN))).json()) == {
        "sessions": []
    }
    records = await audit_records(gw)
    failed = [r for r in records if r["action"] == "auth.failed"]
    assert len(failed) == len(bad)
    reasons = [r["detail"]["reason"] for r in failed]
    assert reasons[:4] == ["token expired", "wrong audience", "wrong issuer",
                           "algorithm 'none' not allowed"]  # fmt: skip
    assert reasons[4] == "algorithm 'HS256' not allowed"
    assert reasons[5].startswith("invalid token")  # the signature does not verify
    assert all(r["result"] == "refused" and r["peer"] == "127.0.0.1" for r in failed)
    text = gw.app[AUDIT].path.read_text()
    for token in bad.values():
        assert token not in text
    assert ADMIN_TOKEN not in text


async def test_key_rotation(gw, issuer):
    """A token of a second key the cached set does not have yet refetches the set; once the first
    key is gone from the issuer, its tokens are refused."""
    old = issuer.token("carol", "operator")
    assert (await gw.get("/v1/whoami", headers=bearer(old))).status == 200
    assert issuer.fetches == 1
    issuer.keys.append(Key("key-2"))
    new = issuer.token("carol", "operator", key=issuer.keys[1])
    assert (await gw.get("/v1/whoami", headers=bearer(new))).status == 200
    assert issuer.fetches == 2
    del issuer.keys[0]
    assert (await gw.get("/v1/whoami", headers=bearer(new))).status == 200
    assert issuer.fetches == 2  # key-2 is known: no fetch
    # key-1's token still verifies against the cached set until a refetch learns it is gone...
    gone = issuer.token("carol", "operator", key=Key("key-3"))
    assert (await gw.get("/v1/whoami", headers=bearer(gone))).status == 401
    assert issuer.fetches == 3
    # ... which it now has: the old key's tokens are refused.
    assert (await gw.get("/v1/whoami", headers=bearer(old))).status == 401


async def test_unknown_kids_refetch_a_bounded_number_of_times(gw, issuer):
    """Random kids cannot make the gateway fetch the issuer's keys on every request."""
    for i in range(2 * auth.MAX_KID_REFETCHES + 1):
        token = issuer.token("carol", "operator", key=Key(f"random-{i}"))
        assert (await gw.get("/v1/whoami", headers=bearer(token))).status == 401
    assert issuer.fetches <= 1 + auth.MAX_KID_REFETCHES


async def test_jwks_fetch_does_not_block_the_event_loop(gw, issuer):
    """While the issuer takes its time answering, the gateway serves other requests."""
    issuer.hold = asyncio.Event()
    waiting = asyncio.ensure_future(
        gw.get("/v1/whoami", headers=bearer(issuer.token("carol", "viewer")))
    )
    await issuer.asked.wait()  # the gateway's fetch reached the issuer, which holds it
    for _ in range(3):
        assert (await gw.get("/v1/whoami", headers=bearer(TOKENS["bob"]))).status == 200
    assert not waiting.done()
    issuer.hold.set()
    assert (await (await waiting).json())["user"] == "carol"


def test_config_refuses_none_and_hmac_algorithms(tmp_path):
    for algs in ('["none"]', '["HS256"]', '["RS256", "HS512"]'):
        cfg = tmp_path / "gw.toml"
        cfg.write_text(
            f'[server]\nworkspace_root = "{tmp_path}"\n[auth.oidc]\nissuer = "https://id.x"\n'
            f'audience = "a"\nalgorithms = {algs}\n'
        )
        with pytest.raises(ConfigError, match="not allowed"):
            load_config(cfg, environ={})


def test_config_reads_auth_and_bounds_the_leeway(tmp_path):
    users = tmp_path / "users.toml"
    users.write_text(users_toml({"alice": ("operator", "t")}))
    cfg = tmp_path / "gw.toml"
    cfg.write_text(
        f'[server]\nworkspace_root = "{tmp_path}"\n[auth]\nusers_file = "{users}"\n'
        f'audit_log = "{tmp_path}/a.jsonl"\naudit_keep = 3\n'
        '[auth.oidc]\nissuer = "https://id.x"\naudience = "a"\nleeway_sec = 30\n'
    )
    config = load_config(cfg, environ={})
    assert config.auth.users_file == users and config.auth.audit_keep == 3
    assert config.auth.oidc is not None and config.auth.oidc.leeway_sec == 30
    assert config.authenticated
    cfg.write_text(cfg.read_text().replace("leeway_sec = 30", "leeway_sec = 3600"))
    with pytest.raises(ConfigError, match="leeway_sec"):
        load_config(cfg, environ={})


async def test_users_file_reload_keeps_the_old_users_when_the_new_file_is_bad(gw, caplog):
    path = gw.app[CONFIG].auth.users_file
    authenticator = gw.app[AUTH]
    path.write_text(users_toml({"zoe": ("viewer", "zoe-token")}))
    assert authenticator.reload_users()
    assert (await gw.get("/v1/whoami", headers=bearer("zoe-token"))).status == 200
    assert (await gw.get("/v1/whoami", headers=bearer(TOKENS["alice"]))).status == 401
    path.write_text('[[users]]\nname = "zoe"\nrole = "emperor"\ntoken_sha256 = "00"\n')
    with caplog.at_level(logging.ERROR, logger="rawp_gateway.auth"):
        assert not authenticator.reload_users()
    [line] = [r.getMessage() for r in caplog.records if r.name == "rawp_gateway.auth"]
    assert "not reloaded" in line and "role must be one of" in line
    assert (await gw.get("/v1/whoami", headers=bearer("zoe-token"))).status == 200


async def test_a_reload_closes_the_websockets_of_users_it_removed_or_changed(gw):
    """What SIGHUP runs: alice (removed) and olga (now a viewer) lose their open WebSockets, which
    were opened under their old roles; bob (unchanged) keeps his."""
    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    await gw.patch(
        f"/v1/session/{sid}",
        json={"members": {"bob": "viewer", "olga": "operator"}},
        headers=bearer(TOKENS["alice"]),
    )
    masters = {
        name: await Master.attach(gw, sid, headers=bearer(TOKENS[name]))
        for name in ("alice", "bob", "olga")
    }
    path = gw.app[CONFIG].auth.users_file
    path.write_text(
        users_toml({"bob": ("viewer", TOKENS["bob"]), "olga": ("viewer", TOKENS["olga"])})
    )
    reload_users(gw.app)
    for name in ("alice", "olga"):
        await masters[name].drain_until_closed()
        assert masters[name].end is not None and masters[name].end.data == 1008, name
    assert not masters["bob"].ws.closed


# --- roles and ownership ----------------------------------------------------------------------


async def test_sessions_belong_to_their_creator_and_are_shared_by_patch(gw):
    """Only what the caller may see is listed; the owner (not a viewer member) shares; a shared
    user's role is the lower of their own and the one the session gives; delete and rename are
    the admin's."""
    viewer_made = await gw.post(
        "/v1/session", json={"agent": "demo"}, headers=bearer(TOKENS["bob"])
    )
    assert await error_of(viewer_made) == (403, "FORBIDDEN")
    s = await create(gw, TOKENS["alice"], name="alice's")
    sid = s["session_id"]
    assert s["owner"] == "alice" and s["members"] == {}

    async def listed(token):
        body = await (await gw.get("/v1/sessions", headers=bearer(token))).json()
        return [x["session_id"] for x in body["sessions"]]

    assert await listed(TOKENS["alice"]) == [sid]
    assert await listed(ADMIN_TOKEN) == [sid]
    assert await listed(TOKENS["bob"]) == []
    assert await error_of(await gw.get(f"/v1/session/{sid}", headers=bearer(TOKENS["bob"]))) == (
        404,
        "SESSION_NOT_FOUND",
    )
    # Bob cannot share it with himself, nor see it to try.
    resp = await gw.patch(
        f"/v1/session/{sid}", json={"members": {"bob": "operator"}}, headers=bearer(TOKENS["bob"])
    )
    assert await error_of(resp) == (404, "SESSION_NOT_FOUND")
    resp = await gw.patch(
        f"/v1/session/{sid}",
        json={"members": {"bob": "operator", "olga": "viewer"}},
        headers=bearer(TOKENS["alice"]),
    )
    assert resp.status == 200
    assert (await resp.json())["members"] == {"bob": "operator", "olga": "viewer"}
    assert await listed(TOKENS["bob"]) == [sid]
    # Bob is a viewer: operator on the session gives him no more. Olga, a member, is no owner.
    for token in (TOKENS["bob"], TOKENS["olga"]):
        resp = await gw.patch(f"/v1/session/{sid}", json={"members": {}}, headers=bearer(token))
        assert await error_of(resp) == (403, "FORBIDDEN")
    for token in (TOKENS["alice"], TOKENS["olga"]):
        resp = await gw.patch(f"/v1/session/{sid}", json={"name": "x"}, headers=bearer(token))
        assert await error_of(resp) == (403, "FORBIDDEN")
        resp = await gw.delete(f"/v1/session/{sid}", headers=bearer(token))
        assert await error_of(resp) == (403, "FORBIDDEN")
    got = await (await gw.get(f"/v1/session/{sid}", headers=bearer(ADMIN_TOKEN))).json()
    assert got["name"] == "alice's" and got["state"] != "TERMINATED"
    resp = await gw.patch(
        f"/v1/session/{sid}", json={"name": "renamed"}, headers=bearer(ADMIN_TOKEN)
    )
    assert (await resp.json())["name"] == "renamed"
    resp = await gw.delete(f"/v1/session/{sid}", headers=bearer(ADMIN_TOKEN))
    assert (await resp.json())["state"] == "TERMINATED"
    records = await audit_records(gw)
    actions = [(r["user"], r["action"], r["result"]) for r in records if r["session_id"] == sid]
    assert ("alice", "session.create", "ok") in actions
    assert ("alice", "session.share", "ok") in actions
    assert ("olga", "session.share", "refused") in actions
    assert ("alice", "session.delete", "refused") in actions
    assert ("admin", "session.rename", "ok") in actions
    assert ("admin", "session.delete", "ok") in actions
    assert ("bob", "session.create", "refused") in [
        (r["user"], r["action"], r["result"]) for r in records
    ]


async def test_members_are_validated(gw):
    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    for members in ({"bob": "admin"}, {"": "viewer"}, ["bob"], {"bob": 1}):
        resp = await gw.patch(
            f"/v1/session/{sid}", json={"members": members}, headers=bearer(TOKENS["alice"])
        )
        assert await error_of(resp) == (400, "INVALID_REQUEST"), members
    got = await (await gw.get(f"/v1/session/{sid}", headers=bearer(TOKENS["alice"]))).json()
    assert got["members"] == {}


async def test_a_viewers_control_frames_are_refused_and_go_nowhere(gw):
    """Every control.* type a viewer sends: session.error FORBIDDEN (recoverable) on the viewer's
    connection, not relayed to the operator's, nothing changed (no turn, same mode)."""
    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    await gw.patch(
        f"/v1/session/{sid}", json={"members": {"bob": "operator"}}, headers=bearer(TOKENS["alice"])
    )
    alice = await Master.attach(gw, sid, headers=bearer(TOKENS["alice"]))
    bob = await Master.attach(gw, sid, headers=bearer(TOKENS["bob"]))
    sent = {}
    for type_, payload in CONTROL_FRAMES.items():
        sent[(await bob.send(type_, payload))["message_id"]] = type_
    rename = await bob.send("session.renamed", {"session_id": sid, "name": "bob's",
                                                "renamed_by": "master"})  # fmt: skip
    sent[rename["message_id"]] = "session.renamed"
    errors = []
    while len(errors) < len(sent):
        frame = await bob.until("session.error")
        errors.append(frame)
    assert {e["parent_id"] for e in errors} == set(sent)
    assert all(e["payload"]["error_code"] == "FORBIDDEN" for e in errors)
    assert all(e["payload"]["fatal"] is False for e in errors)
    # Alice prompts; her turn is all she sees (and bob sees her prompt, stamped with her name).
    prompt = await alice.send("control.prompt.request", {"prompt_text": "hello"})
    await alice.until("session.usage")
    relayed = await bob.until("control.prompt.request")
    assert relayed["message_id"] == prompt["message_id"]
    assert relayed["metadata"]["rawp_user"] == "alice"
    assert not {f.get("message_id") for f in alice.frames} & set(sent)
    assert not [f for f in alice.frames if f["type"] == "session.error"]
    got = await (await gw.get(f"/v1/session/{sid}", headers=bearer(ADMIN_TOKEN))).json()
    assert got["turn_index"] == 1 and got["mode"] == "default" and got["name"] is None
    records = await audit_records(gw)
    refused = [r for r in records if r["user"] == "bob" and r["result"] == "refused"]
    assert {r["action"] for r in refused} >= {"prompt", "cancel", "permission", "mode",
                                              "compact", "session.rename"}  # fmt: skip
    assert all(r["role"] == "viewer" and r["session_id"] == sid for r in refused)


async def test_a_viewers_upload_is_forbidden(gw):
    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    await gw.patch(
        f"/v1/session/{sid}", json={"members": {"bob": "viewer"}}, headers=bearer(TOKENS["alice"])
    )
    resp = await gw.put(
        f"/v1/session/{sid}/files?name=a.txt", data=b"secret bytes", headers=bearer(TOKENS["bob"])
    )
    assert await error_of(resp) == (403, "FORBIDDEN")
    assert not gw.app[SESSIONS][sid].files.files
    ok = await gw.put(
        f"/v1/session/{sid}/files?name=a.txt", data=b"secret bytes", headers=bearer(TOKENS["alice"])
    )
    assert ok.status == 201
    stored = await ok.json()
    # A viewer may download what the session holds.
    got = await gw.get(stored["file_url"], headers=bearer(TOKENS["bob"]))
    assert got.status == 200 and await got.read() == b"secret bytes"
    # Someone the session is not shared with gets nothing, as if there were no session.
    got = await gw.get(stored["file_url"], headers=bearer(TOKENS["olga"]))
    assert await error_of(got) == (404, "TRANSFER_NOT_FOUND")
    records = await audit_records(gw)
    uploads = [(r["user"], r["result"]) for r in records if r["action"] == "upload"]
    assert uploads == [("bob", "refused"), ("alice", "ok")]
    assert "secret bytes" not in gw.app[AUDIT].path.read_text()


async def test_a_ticket_carries_its_users_role_and_is_not_for_another_user(gw):
    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    await gw.patch(
        f"/v1/session/{sid}", json={"members": {"bob": "viewer"}}, headers=bearer(TOKENS["alice"])
    )
    resp = await gw.post(f"/v1/session/{sid}/ws-ticket", headers=bearer(TOKENS["bob"]))
    ticket = (await resp.json())["ticket"]
    ws = await gw.ws_connect(
        f"/v1/session/{sid}/ws", protocols=("rawp-dps-1.0",), params={"ticket": ticket}
    )
    bob = Master(ws, sid)
    await bob.next()  # capabilities
    sent = await bob.send("control.prompt.request", {"prompt_text": "hi"})
    error = await bob.until("session.error")
    assert error["parent_id"] == sent["message_id"]
    assert error["payload"]["error_code"] == "FORBIDDEN"
    # The ticket was spent by bob's upgrade: anyone replaying it (no bearer of their own) is out.
    for headers in ({}, {"Origin": str(gw.make_url("")).rstrip("/")}):
        resp = await gw.get(f"/v1/session/{sid}/ws", params={"ticket": ticket}, headers=headers)
        assert await error_of(resp) == (401, "UNAUTHORIZED")
    got = await (await gw.get(f"/v1/session/{sid}", headers=bearer(ADMIN_TOKEN))).json()
    assert got["connections"] == 1 and got["turn_index"] == 0
    # Alice's ticket for a session bob cannot see does not exist for bob.
    other = (await create(gw, TOKENS["alice"]))["session_id"]
    resp = await gw.post(f"/v1/session/{other}/ws-ticket", headers=bearer(TOKENS["bob"]))
    assert await error_of(resp) == (404, "SESSION_NOT_FOUND")


async def test_who_answered_a_permission_is_relayed_and_audited(gw, tmp_path):
    """The answer is relayed with metadata.rawp_user, and so is the state change that records it;
    the audit log has the tool, the decision and the input."""
    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    await gw.patch(
        f"/v1/session/{sid}", json={"members": {"bob": "viewer"}}, headers=bearer(TOKENS["alice"])
    )
    alice = await Master.attach(gw, sid, headers=bearer(TOKENS["alice"]))
    bob = await Master.attach(gw, sid, headers=bearer(TOKENS["bob"]))
    await alice.send("control.prompt.request", {"prompt_text": "write granted.txt"})
    ask = await bob.until("agent.interaction.request")
    iid = ask["payload"]["interaction_id"]
    # Bob cannot answer; alice can, and a name she puts in the metadata is replaced by hers.
    await bob.send(
        "control.interaction.response", {"interaction_id": iid, "selected_value": "allow"}
    )
    assert (await bob.until("session.error"))["payload"]["error_code"] == "FORBIDDEN"
    await alice.send(
        "control.interaction.response",
        {"interaction_id": iid, "selected_value": "allow"},
        metadata={"rawp_user": "mallory"},
    )
    answer = await bob.until("control.interaction.response")
    assert answer["metadata"]["rawp_user"] == "alice"
    state = await bob.until("agent.state.changed", reason="permission_answered")
    assert state["metadata"]["rawp_user"] == "alice"
    assert state["metadata"]["interaction_id"] == iid
    await alice.until("session.usage")
    assert (tmp_path / "granted.txt").exists()
    records = await audit_records(gw)
    [decided] = [r for r in records if r["action"] == "permission" and r["result"] == "ok"]
    assert decided["user"] == "alice" and decided["role"] == "operator"
    assert decided["detail"]["tool_name"] == "Write"
    assert decided["detail"]["decision"] == "allow"
    assert "granted.txt" in decided["detail"]["input"]
    prompts = [r for r in records if r["action"] == "prompt" and r["result"] == "ok"]
    assert [r["user"] for r in prompts] == ["alice"]
    assert all({"time", "user", "role", "peer", "action", "session_id", "result", "detail"}
               <= set(r) for r in records)  # fmt: skip


async def test_no_credential_configured_is_no_local_admin(tmp_path):
    """There is always a credential: with none configured the gateway refuses every request
    without the token it made for itself (the one its user's client finds), loopback included;
    with it, the holder is admin."""
    config = make_config(tmp_path, agents={"demo": fast_demo()})
    client = await start_gateway(config)
    try:
        async with aiohttp.ClientSession() as anonymous:
            for method, path in (
                ("GET", "/v1/whoami"),
                ("GET", "/v1/sessions"),
                ("POST", "/v1/session"),
            ):
                async with anonymous.request(
                    method, base_url(client) + path, json={"agent": "demo"}
                ) as resp:
                    assert resp.status == 401, path
        assert await (await client.get("/v1/whoami")).json() == {"user": "admin", "role": "admin"}
        resp = await client.post("/v1/session", json={"agent": "demo"})
        assert (await resp.json())["owner"] == "admin"
    finally:
        await client.close()


async def test_an_app_with_no_credential_at_all_refuses_everyone(tmp_path):
    """Built with no credential (no token made for it either), the gateway has no one to let in:
    never a ``local`` admin for being on the same machine."""
    from aiohttp.test_utils import TestClient

    app = create_app(make_config(tmp_path, agents={"demo": fast_demo()}))
    async with TestClient(GatewayTestServer(app)) as client:
        assert (await client.get("/v1/whoami")).status == 401
        assert (await client.get("/healthz")).status == 200


# --- the audit log itself ---------------------------------------------------------------------


async def test_audit_log_rotates_keeping_n_files(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, max_bytes=4096, keep=2)
    log.start()
    who = roles.Identity("alice", "operator")
    for i in range(200):
        log.record("prompt", who, peer="127.0.0.1", session_id=f"s{i}")
        if i % 20 == 0:
            await log.flush()
    await log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    for p in tmp_path.iterdir():
        assert p.stat().st_size <= 4096
        for line in p.read_text().splitlines():
            assert json.loads(line)["user"] == "alice"
    newest = json.loads(path.read_text().splitlines()[-1])
    assert newest["session_id"] == "s199"


def test_audit_input_is_cut_to_1_kib():
    from gateway.team.audit import MAX_INPUT_BYTES, cut_input

    text = cut_input({"content": "é" * 5000})
    assert len(text.encode()) <= MAX_INPUT_BYTES + len("…".encode())
    assert text.endswith("…")


async def test_owner_and_members_survive_a_restart(tmp_path):
    users = {n: (ROLES[n], TOKENS[n]) for n in TOKENS}
    config = users_config(
        tmp_path, users, agents={"demo": fast_demo()}, state_dir=tmp_path / "state"
    )
    gw = await start_gateway(config)
    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    await gw.patch(
        f"/v1/session/{sid}", json={"members": {"bob": "viewer"}}, headers=bearer(TOKENS["alice"])
    )
    await gw.close()
    gw = await start_gateway(config)
    try:
        got = await (await gw.get(f"/v1/session/{sid}", headers=bearer(TOKENS["bob"]))).json()
        assert got["owner"] == "alice" and got["members"] == {"bob": "viewer"}
        resp = await gw.get(f"/v1/session/{sid}", headers=bearer(TOKENS["olga"]))
        assert await error_of(resp) == (404, "SESSION_NOT_FOUND")
    finally:
        await gw.close()


async def test_serve_reloads_the_users_file_on_sighup(tmp_path):
    """The real command: SIGHUP reads the users file again; a bad file then keeps the users
    loaded before and says so in one log line."""
    users = tmp_path / "users.toml"
    users.write_text(users_toml({"alice": ("operator", "first-token")}))
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[server]\nworkspace_root = "{tmp_path}"\n[auth]\nusers_file = "{users}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")}

    async def status(http, token: str) -> int:
        async with http.get(url + "/v1/whoami", headers=bearer(token)) as resp:
            return resp.status

    args = ("--config", str(cfg), "--log-format", "json")
    async with serve(*args, env=env) as (proc, url), aiohttp.ClientSession() as http:
        assert await status(http, "first-token") == 200
        users.write_text(users_toml({"zoe": ("viewer", "second-token")}))

        async def second_token() -> bool:
            return await status(http, "second-token") == 200

        await sighup_until(proc, second_token)
        assert await status(http, "first-token") == 401
        users.write_text("[[users]]\nname = 'zoe'\n")  # no role, no token: unusable
        why = reload_refused(proc, "users file")
    assert why.startswith("users file not reloaded, the 1 users before stay: ")
    assert "role must be one of" in why


async def test_an_issuer_that_cannot_be_reached_refuses_its_tokens_and_nothing_else(tmp_path):
    issuer = Issuer()
    await issuer.start()
    token = issuer.token("carol", "operator")
    settings = AuthSettings(
        oidc=OidcSettings(issuer=issuer.url, audience=AUDIENCE),
        audit_log=tmp_path / "audit.jsonl",
    )
    await issuer.close()  # gone before the gateway ever fetched its keys
    client = await start_gateway(make_config(tmp_path, token=ADMIN_TOKEN, auth=settings))
    try:
        for _ in range(3):
            resp = await client.get("/v1/whoami", headers=bearer(token))
            assert await error_of(resp) == (401, "UNAUTHORIZED")
        assert (await client.get("/v1/whoami", headers=bearer(ADMIN_TOKEN))).status == 200
        records = await audit_records(client)
        assert [r["detail"]["reason"] for r in records] == [
            "the issuer's keys could not be fetched"
        ] * 3
    finally:
        await client.close()


async def test_unsharing_closes_the_connections_of_who_can_no_longer_see(gw):
    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    await gw.patch(
        f"/v1/session/{sid}",
        json={"members": {"bob": "viewer", "olga": "operator"}},
        headers=bearer(TOKENS["alice"]),
    )
    bob = await Master.attach(gw, sid, headers=bearer(TOKENS["bob"]))
    olga = await Master.attach(gw, sid, headers=bearer(TOKENS["olga"]))
    await gw.patch(
        f"/v1/session/{sid}", json={"members": {"olga": "viewer"}}, headers=bearer(TOKENS["alice"])
    )
    await bob.drain_until_closed()
    assert bob.end is not None and bob.end.type.name == "CLOSE" and bob.end.data == 1008
    # Olga stays, now a viewer: her prompt is refused.
    sent = await olga.send("control.prompt.request", {"prompt_text": "hi"})
    error = await olga.until("session.error")
    assert error["parent_id"] == sent["message_id"]
    assert error["payload"]["error_code"] == "FORBIDDEN"


def test_serve_stops_with_one_line_when_the_audit_log_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("")
    cfg = tmp_path / "gw.toml"
    cfg.write_text(
        f'[server]\nworkspace_root = "{tmp_path}"\nport = 0\n'
        f'[auth]\naudit_log = "{tmp_path}/file/audit.jsonl"\n'
    )
    done = subprocess.run(
        [*CLI, "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("RAWP_GATEWAY_")},
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"rawp-gateway: cannot write the audit log {tmp_path}/file/audit.jsonl: File exists"
    ]


async def test_claims_by_dotted_name_and_a_token_without_exp(tmp_path, issuer):
    settings = AuthSettings(
        oidc=OidcSettings(
            issuer=issuer.url,
            audience=AUDIENCE,
            jwks_url=f"{issuer.url}/jwks",  # given: no discovery
            user_claim="preferred_username",
            role_claim="realm_access.roles",
        )
    )
    client = await start_gateway(make_config(tmp_path, auth=settings))
    try:
        token = issuer.token(
            "sub-1", None, preferred_username="dana", realm_access={"roles": ["x", "operator"]}
        )
        resp = await client.get("/v1/whoami", headers=bearer(token))
        assert await resp.json() == {"user": "dana", "role": "operator"}
        no_exp = jwt.encode(
            {"sub": "x", "aud": AUDIENCE, "iss": issuer.url, "preferred_username": "dana",
             "realm_access": {"roles": ["admin"]}},
            issuer.keys[0].private, algorithm="RS256", headers={"kid": "key-1"},
        )  # fmt: skip
        resp = await client.get("/v1/whoami", headers=bearer(no_exp))
        assert await error_of(resp) == (401, "UNAUTHORIZED")
    finally:
        await client.close()


async def test_unused_tickets_are_bounded_per_user(gw):
    from gateway.console import MAX_TICKETS_PER_OWNER

    sid = (await create(gw, TOKENS["alice"]))["session_id"]
    await gw.patch(
        f"/v1/session/{sid}", json={"members": {"bob": "viewer"}}, headers=bearer(TOKENS["alice"])
    )
    for _ in range(MAX_TICKETS_PER_OWNER):
        resp = await gw.post(f"/v1/session/{sid}/ws-ticket", headers=bearer(TOKENS["alice"]))
        assert resp.status == 200
    resp = await gw.post(f"/v1/session/{sid}/ws-ticket", headers=bearer(TOKENS["alice"]))
    assert await error_of(resp) == (429, "TOO_MANY_TICKETS")
    resp = await gw.post(f"/v1/session/{sid}/ws-ticket", headers=bearer(TOKENS["bob"]))
    assert resp.status == 200  # another user's are counted apart
