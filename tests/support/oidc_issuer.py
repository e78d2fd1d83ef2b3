"""An OIDC issuer on 127.0.0.1 for the identity tests: RSA keys made here (``cryptography``), a
discovery document and a JWKS endpoint served by aiohttp, and tokens signed with PyJWT.

The key set is a list the test changes (rotation: a second key appears, the first disappears);
``fetches`` counts the JWKS requests, so a test can see that the gateway caches and refetches.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any

import jwt
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

AUDIENCE = "rawp-gateway"


@dataclass
class Key:
    kid: str
    private: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    def jwk(self) -> dict[str, Any]:
        jwk = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "use": "sig", "alg": "RS256"}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


class Issuer:
    def __init__(self) -> None:
        self.keys: list[Key] = [Key("key-1")]
        self.fetches = 0
        self.asked = asyncio.Event()  # a JWKS request arrived
        self.hold: asyncio.Event | None = None  # set: JWKS requests wait for it
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        app.router.add_get("/jwks", self._jwks)
        self.server = TestServer(app, host="127.0.0.1")

    async def start(self) -> None:
        await self.server.start_server()

    async def close(self) -> None:
        await self.server.close()

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def _discovery(self, request: web.Request) -> web.Response:
        return web.json_response({"issuer": self.url, "jwks_uri": f"{self.url}/jwks"})

    async def _jwks(self, request: web.Request) -> web.Response:
        self.asked.set()
        if self.hold is not None:
            await self.hold.wait()
        self.fetches += 1
        return web.json_response({"keys": [k.jwk() for k in self.keys]})

    def token(
        self,
        sub: str = "carol",
        role: Any = "operator",
        *,
        key: Key | None = None,
        aud: str = AUDIENCE,
        iss: str | None = None,
        exp_in: float = 300,
        **claims: Any,
    ) -> str:
        key = key or self.keys[0]
        now = int(time.time())
        body = {"sub": sub, "aud": aud, "iss": iss or self.url, "iat": now, "exp": now + exp_in}
        if role is not None:
            body["rawp_role"] = role
        body.update(claims)
        return jwt.encode(body, key.private, algorithm="RS256", headers={"kid": key.kid})


def _part(obj: dict[str, Any]) -> str:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unsigned_token(claims: dict[str, Any], kid: str) -> str:
    """``alg: none``: a header and claims with an empty signature (what an attacker sends)."""
    part = _part
    return f"{part({'alg': 'none', 'typ': 'JWT', 'kid': kid})}.{part(claims)}."


def hs256_with_public_key(claims: dict[str, Any], key: Key) -> str:
    """The algorithm-confusion attack: HS256 "signed" with the issuer's public key as the secret.
    PyJWT refuses to make it from a PEM, so the HMAC is computed here as an attacker would."""
    part = _part
    signing_input = f"{part({'alg': 'HS256', 'typ': 'JWT', 'kid': key.kid})}.{part(claims)}"
    mac = hmac.new(key.public_pem(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"
