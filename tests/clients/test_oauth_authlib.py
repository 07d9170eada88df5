"""authlib (a third-party OAuth client library) against the real `kiln --runtime cloud`, unmodified (issue #13).

Usage: test_oauth_authlib.py <path to kiln>. Creates a user with `kiln user add`, starts the contract proxy on
its own port and kiln with the proxy's URL as `--issuer` (clients compare the issuer with the URL they use), then:
- the RFC 8414 metadata passes authlib's `AuthorizationServerMetadata.validate()`;
- a public client registered by hand (RFC 7591) runs the authorization-code flow with `AsyncOAuth2Client`
  (S256 PKCE, `resource`), the consent driver below playing the browser, `fetch_token(authorization_response=…)`;
- the access token verifies with the JWKS through joserfc: ES256, `typ` at+jwt, `iss` = issuer, `aud` =
  <issuer>/mcp, and opens an MCP session;
- `refresh_token` rotates the refresh token; once the successor was used, the old one is `invalid_grant`.

AUTHLIB_INSECURE_TRANSPORT=1: the issuer is loopback http.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path
from urllib.parse import parse_qs, urljoin, urlparse

import httpx
from authlib.common.security import generate_token
from authlib.integrations.base_client import OAuthError
from authlib.integrations.httpx_client import AsyncOAuth2Client
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from authlib.oauth2.rfc8414 import AuthorizationServerMetadata
from joserfc import jwt
from joserfc.jwk import KeySet

# authlib reads it on each check: the issuer is loopback http.
os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"
KILN = sys.argv.pop(1) if len(sys.argv) > 1 else "target/debug/kiln"
PROXY = os.environ.get("KILN_CONTRACT_PROXY", "target/debug/kiln-contract-proxy")
PASSWORD = "a long enough password"
SCOPES = "kiln:read kiln:run"
SESSION_COOKIE = "__Host-comfy_session"
REDIRECT_URI = "http://127.0.0.1:53690/callback"


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_address(process: subprocess.Popen, what: str) -> tuple[str, list[str], threading.Thread]:
    """Reads the process's log until it says where it listens; then collects the rest of it in the background.
    Answers the address, the list the rest goes to, and the thread that fills it."""
    for line in process.stderr:
        if "listening on http://" in line:
            rest: list[str] = []
            reader = threading.Thread(target=rest.extend, args=(process.stderr,), daemon=True)
            reader.start()
            return "http://" + line.split("listening on http://")[1].strip(), rest, reader
    raise RuntimeError(f"{what} exited before listening")


class CloudKiln:
    """`kiln --runtime cloud --issuer <proxy URL>` on a fresh data directory, behind kiln-contract-proxy in its
    cloud mode; the proxy starts first on its own port, forwarding to the port kiln then takes."""

    def __init__(self, data_dir: Path) -> None:
        subprocess.run(
            [KILN, "user", "add", "alice", "--workspace", "default", "--role", "owner", "--data-dir", str(data_dir)],
            input=PASSWORD + "\n", text=True, check=True, stdout=subprocess.DEVNULL,
        )
        port = free_port()
        self.proxy = None
        self.issuer = f"http://127.0.0.1:{port}"
        if os.environ.get("KILN_MCP_DIRECT") != "1":  # as in tests/mcp/kiln.mjs: 1 skips the proxy
            self.proxy = subprocess.Popen([PROXY, f"127.0.0.1:{port}", "cloud"], stderr=subprocess.PIPE, text=True)
            self.issuer, self.proxy_log, self.proxy_reader = listening_address(self.proxy, "kiln-contract-proxy")
        command = [KILN, "--runtime", "cloud", "--port", str(port), "--issuer", self.issuer,
                   "--disable-front-end", "--data-dir", str(data_dir)]
        self.kiln = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        listening_address(self.kiln, "kiln")

    def stop(self) -> None:
        """Stops both; raises AssertionError with the proxy's report if any answer broke the contract."""
        report, code = "", 0
        if self.proxy:
            self.proxy.send_signal(signal.SIGTERM)
            code = self.proxy.wait(timeout=30)
        self.kiln.kill()
        self.kiln.wait()
        if self.proxy:
            self.proxy_reader.join(timeout=10)
            report = "".join(self.proxy_log)
            print(report.strip().splitlines()[0] if report.strip() else "contract: no report")
        if code != 0:
            raise AssertionError(f"kiln sent answers the spec does not describe:\n{report}")


class ConsentDriver:
    """The person in the browser (the same steps as tests/mcp/consent.mjs): signs in, opens the authorization
    URL without following redirects, reads the consent challenge, allows, and answers Kiln's `redirect_to`.

    The session cookie is `Secure`, so httpx's cookie jar would never send it over http: the driver keeps its
    value and sends the `Cookie` header itself."""

    def __init__(self, issuer: str, http: httpx.AsyncClient) -> None:
        self.issuer = issuer
        self.http = http
        self.cookie = ""

    async def sign_in(self, username: str, password: str) -> None:
        answer = await self.http.post(f"{self.issuer}/api/auth/session", json={"username": username, "password": password},
                                      headers={"Origin": self.issuer})
        assert answer.status_code == 200, f"sign-in answered {answer.status_code}: {answer.text}"
        cookies = [v for v in answer.headers.get_list("set-cookie") if v.startswith(SESSION_COOKIE + "=")]
        assert cookies, "sign-in set no session cookie"
        self.cookie = cookies[0].split(";")[0]

    async def allow(self, authorization_url: str) -> str:
        authorize = await self.http.get(authorization_url, headers={"Cookie": self.cookie}, follow_redirects=False)
        assert authorize.status_code == 303, f"authorize answered {authorize.status_code}: {authorize.text}"
        consent = urlparse(urljoin(self.issuer, authorize.headers["location"]))
        assert f"{consent.scheme}://{consent.netloc}{consent.path}" == f"{self.issuer}/oauth/consent", consent
        request_id = parse_qs(consent.query)["oauth_request_id"][0]
        challenge = await self.http.get(f"{self.issuer}/oauth/authorize", params={"oauth_request_id": request_id},
                                        headers={"Cookie": self.cookie, "Accept": "application/json"})
        assert challenge.status_code == 200, f"the challenge answered {challenge.status_code}: {challenge.text}"
        body = challenge.json()
        decided = await self.http.post(
            f"{self.issuer}/oauth/authorize",
            json={"oauth_request_id": request_id, "csrf_token": body["csrf_token"], "decision": "allow",
                  "workspace_id": body["workspaces"][0]["id"]},
            headers={"Cookie": self.cookie, "X-CSRF-Token": body["csrf_token"], "Origin": self.issuer},
        )
        assert decided.status_code == 200, f"the decision answered {decided.status_code}: {decided.text}"
        return decided.json()["redirect_to"]


async def mcp_initialize_status(http: httpx.AsyncClient, issuer: str, access_token: str) -> int:
    """The status of an MCP `initialize` POSTed to /mcp with `access_token`."""
    answer = await http.post(
        f"{issuer}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "kiln-authlib-test", "version": "1.0.0"}}},
        headers={"Authorization": f"Bearer {access_token}", "Accept": "application/json, text/event-stream"},
    )
    return answer.status_code


class AuthlibAgainstKiln(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.data_dir = Path(tempfile.mkdtemp(prefix="kiln-authlib-"))
        cls.kiln = CloudKiln(cls.data_dir)
        cls.issuer = cls.kiln.issuer

    @classmethod
    def tearDownClass(cls) -> None:
        cls.kiln.stop()
        shutil.rmtree(cls.data_dir, ignore_errors=True)

    async def asyncSetUp(self) -> None:
        self.http = httpx.AsyncClient(timeout=30)
        answer = await self.http.get(f"{self.issuer}/.well-known/oauth-authorization-server")
        self.assertEqual(answer.status_code, 200)
        self.metadata = AuthorizationServerMetadata(answer.json())

    async def asyncTearDown(self) -> None:
        await self.http.aclose()

    async def register(self) -> str:
        """A public client, registered by hand (RFC 7591); answers its client_id."""
        answer = await self.http.post(self.metadata["registration_endpoint"], json={
            "client_name": "Kiln black-box test (authlib)",
            "redirect_uris": [REDIRECT_URI],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        })
        self.assertEqual(answer.status_code, 201, answer.text)
        client = answer.json()
        self.assertEqual(client["token_endpoint_auth_method"], "none")
        self.assertNotIn("client_secret", client, "a public client gets no secret")
        return client["client_id"]

    async def authorized_client(self) -> AsyncOAuth2Client:
        """An authlib client through the whole authorization-code flow, holding its first tokens."""
        client = AsyncOAuth2Client(
            client_id=await self.register(),
            token_endpoint_auth_method="none",
            code_challenge_method="S256",
            redirect_uri=REDIRECT_URI,
            scope=SCOPES,
            timeout=30,
        )
        verifier = generate_token(64)
        url, state = client.create_authorization_url(
            self.metadata["authorization_endpoint"], code_verifier=verifier, resource=f"{self.issuer}/mcp",
        )
        query = parse_qs(urlparse(url).query)
        self.assertEqual(query["code_challenge"], [create_s256_code_challenge(verifier)])
        self.assertEqual(query["code_challenge_method"], ["S256"])

        driver = ConsentDriver(self.issuer, self.http)
        await driver.sign_in("alice", PASSWORD)
        redirect_to = await driver.allow(url)
        answer = parse_qs(urlparse(redirect_to).query)
        self.assertTrue(redirect_to.startswith(REDIRECT_URI + "?"), redirect_to)
        self.assertEqual(answer["state"], [state])
        self.assertEqual(answer["iss"], [self.issuer], "iss names the issuer (RFC 9207)")

        token = await client.fetch_token(
            self.metadata["token_endpoint"], authorization_response=redirect_to, state=state, code_verifier=verifier,
            resource=f"{self.issuer}/mcp",
        )
        self.assertEqual(token["token_type"].lower(), "bearer")
        self.assertEqual(sorted(token["scope"].split()), sorted(SCOPES.split()))
        self.assertIn("refresh_token", token)
        return client

    def test_metadata_validates(self) -> None:
        self.metadata.validate()
        self.assertEqual(self.metadata["issuer"], self.issuer)
        self.assertEqual(self.metadata["code_challenge_methods_supported"], ["S256"])
        self.assertTrue(self.metadata.get("authorization_response_iss_parameter_supported"))

    async def test_access_token_verifies_with_the_jwks(self) -> None:
        client = await self.authorized_client()
        self.addAsyncCleanup(client.aclose)
        access_token = client.token["access_token"]
        jwks = (await self.http.get(self.metadata["jwks_uri"])).json()
        token = jwt.decode(access_token, KeySet.import_key_set(jwks), algorithms=["ES256"])
        self.assertEqual(token.header["typ"], "at+jwt")
        claims = jwt.JWTClaimsRegistry(
            iss={"essential": True, "value": self.issuer},
            aud={"essential": True, "value": f"{self.issuer}/mcp"},
            sub={"essential": True},
            exp={"essential": True},
        )
        claims.validate(token.claims)
        self.assertEqual(token.claims["client_id"], client.client_id)
        self.assertEqual(sorted(token.claims["scope"].split()), sorted(SCOPES.split()))
        self.assertIn("workspace_id", token.claims)
        self.assertEqual(await mcp_initialize_status(self.http, self.issuer, access_token), 200)

    async def test_refresh_rotates_and_reuse_is_invalid_grant(self) -> None:
        client = await self.authorized_client()
        self.addAsyncCleanup(client.aclose)
        first = dict(client.token)
        second = dict(await client.refresh_token(self.metadata["token_endpoint"]))
        self.assertNotEqual(second["refresh_token"], first["refresh_token"], "the refresh token rotates")
        self.assertEqual(await mcp_initialize_status(self.http, self.issuer, second["access_token"]), 200)
        # The successor used, then the replaced token again: reuse, and the family is revoked.
        third = dict(await client.refresh_token(self.metadata["token_endpoint"]))
        self.assertEqual(await mcp_initialize_status(self.http, self.issuer, third["access_token"]), 200)
        replay = await self.http.post(self.metadata["token_endpoint"], data={
            "grant_type": "refresh_token", "refresh_token": first["refresh_token"], "client_id": client.client_id,
        })
        self.assertEqual(replay.status_code, 400, replay.text)
        self.assertEqual(replay.json()["error"], "invalid_grant")
        self.assertEqual(replay.headers.get("cache-control"), "no-store")
        with self.assertRaises(OAuthError) as refused:
            await client.refresh_token(self.metadata["token_endpoint"])
        self.assertEqual(refused.exception.error, "invalid_grant", "the family is revoked")
        self.assertEqual(await mcp_initialize_status(self.http, self.issuer, third["access_token"]), 401)


if __name__ == "__main__":
    unittest.main(verbosity=2)
