"""The web console over plain HTTP: logins, sessions, permissions, CSRF, escaping, starts.

One node process runs in a thread with the RPC tests' users (tests/rpc_helpers.py); the
requests go over a real socket. tests/process/test_console_browser.py drives the same pages in
headless chromium.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flows.config.rpc import RpcUser
from flows.rpc.console.routes import PAGE_SIZE
from flows.rpc.console.sessions import LOGIN_COOKIE, SESSION_COOKIE
from tests.console_helpers import (
    HOSPITAL,
    STEPS,
    console_node,
    csrf_of,
    flow_status,
    logged_in,
    post_login,
    session_cookie_header,
    start_by_api,
)
from tests.rpc_cordapp import BROKEN, gate
from tests.rpc_helpers import TOKEN
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with console_node(tmp_path_factory.mktemp("console")) as (_, base):
        yield base


@pytest.fixture(scope="module")
def hospitalized(url: str) -> str:
    """A flow kept in the hospital (its effect stays broken while the module runs)."""
    key = "kept-" + uuid.uuid4().hex[:8]
    BROKEN.add(key)
    flow_id = start_by_api(url, HOSPITAL, {"key": key})
    wait_until(lambda: flow_status(url, flow_id) == "HOSPITALIZED", "the flow in the hospital")
    return flow_id


def test_a_page_without_a_session_redirects_to_the_login_form(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = http.get("/console/flows")
        assert answer.status_code == 303
        assert answer.headers["location"] == "/console/login?next=/console/flows"
        login = http.get(answer.headers["location"])
        assert login.status_code == 200 and 'name="password"' in login.text
        assert "API token only" in login.text  # token users are told they cannot log in
        assert http.post("/console/node/drain", data={"csrf": "x"}).status_code == 401


@pytest.mark.parametrize(
    ("user", "password"),
    [
        ("watcher", "not-the-password"),
        ("no-such-user", "watcher-password"),
        ("robot", TOKEN),  # a token user cannot log in, even with its token
    ],
)
def test_a_wrong_password_an_unknown_user_and_a_token_user_are_refused(
    url: str, user: str, password: str
) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = post_login(http, {"user": user, "password": password})
        assert answer.status_code == 401
        assert "wrong user name or password" in answer.text
        assert SESSION_COOKIE not in answer.cookies
        assert http.get("/console/flows").status_code == 303  # still not logged in


def test_the_session_cookie_is_http_only_strict_and_scoped_to_the_console(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = post_login(
            http, {"user": "watcher", "password": "watcher-password", "next": "/console/node"}
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/console/node"
        cookie = session_cookie_header(answer)
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/console"} <= attributes
        assert "secure" not in attributes  # plain HTTP here; TLS adds Secure


def test_a_login_posted_without_the_forms_token_is_refused(url: str) -> None:
    """Login CSRF: a page of another site can post the form but not read or send its token."""
    credentials = {"user": "watcher", "password": "watcher-password"}
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = http.post("/console/login", data=credentials)  # never fetched the form
        assert answer.status_code == 403 and "CSRF token is missing or wrong" in answer.text
        assert SESSION_COOKIE not in answer.cookies
        assert http.get("/console/flows").status_code == 303  # not logged in
    with httpx.Client(base_url=url, timeout=60) as attacker:
        stolen = csrf_of(attacker, "/console/login")  # the attacker's own form and token
    with httpx.Client(base_url=url, timeout=60) as victim:
        victim.get("/console/login")  # the victim's own cookie holds another token
        answer = victim.post("/console/login", data={**credentials, "csrf": stolen})
        assert answer.status_code == 403
        assert SESSION_COOKIE not in answer.cookies
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = post_login(http, credentials)
        assert answer.status_code == 303
        assert http.get("/console/flows").status_code == 200
        assert LOGIN_COOKIE not in http.cookies  # spent: the login removed it


def test_login_never_redirects_off_the_console(url: str) -> None:
    for target in ("https://example.com/", "//example.com/console/", "/api/node"):
        with httpx.Client(base_url=url, timeout=60) as http:
            answer = post_login(
                http, {"user": "watcher", "password": "watcher-password", "next": target}
            )
            assert answer.headers["location"] == "/console/"


PAGES = ["/console/flows", "/console/node", "/console/hospital", "/console/start"]
ALLOWED = {
    "watcher": {"/console/flows", "/console/node", "/console/hospital"},
    "starter": {"/console/start"},
    "operator": {"/console/hospital"},
    "everything": set(PAGES),
    "nobody": set(),
}


@pytest.mark.parametrize("user", sorted(ALLOWED))
def test_each_page_needs_its_permission(url: str, user: str, hospitalized: str) -> None:
    with logged_in(url, user) as http:
        for page in PAGES:
            answer = http.get(page)
            expected = 200 if page in ALLOWED[user] else 403
            assert answer.status_code == expected, (user, page, answer.text)
            if expected == 403:
                assert f"user {user} may" in answer.text
        if "/console/flows" in ALLOWED[user]:
            page = http.get(f"/console/flows/{hospitalized}")
            assert page.status_code == 200 and "HOSPITALIZED" in page.text
        else:
            assert http.get(f"/console/flows/{hospitalized}").status_code == 403


def test_buttons_only_for_operators_and_a_forged_post_is_403(url: str, hospitalized: str) -> None:
    with logged_in(url, "watcher") as http:
        page = http.get("/console/hospital")
        assert hospitalized in page.text
        assert "/retry" not in page.text and "/kill" not in page.text
        assert "may not operate" in page.text
        token = csrf_of(http)
        for action in ("retry", "kill"):
            forged = http.post(
                f"/console/flows/{hospitalized}/{action}", data={"csrf": token, "back": "/"}
            )
            assert forged.status_code == 403
            assert "user watcher may not operate" in forged.text
        assert http.post("/console/node/drain", data={"csrf": token}).status_code == 403
    with logged_in(url, "operator") as http:
        page = http.get("/console/hospital")
        assert f"/console/flows/{hospitalized}/retry" in page.text
        assert f"/console/flows/{hospitalized}/kill" in page.text
    assert flow_status(url, hospitalized) == "HOSPITALIZED"


def test_a_post_without_the_sessions_csrf_token_is_403_and_changes_nothing(
    url: str, hospitalized: str
) -> None:
    with logged_in(url, "everything") as http, logged_in(url, "operator") as other:
        others_token = csrf_of(other)
        for data in ({}, {"csrf": ""}, {"csrf": "forged"}, {"csrf": others_token}):
            for path in (
                "/console/node/drain",
                f"/console/flows/{hospitalized}/kill",
                "/console/logout",
                "/console/start",
            ):
                answer = http.post(path, data=data)
                assert answer.status_code == 403, (path, data)
                assert "CSRF token is missing or wrong" in answer.text
        assert http.get("/console/flows").status_code == 200  # logout was refused too
        assert http.get("/api/node").status_code == 401  # a console session is no API login
    assert flow_status(url, hospitalized) == "HOSPITALIZED"


def test_an_operator_retries_a_healed_flow_from_the_hospital(url: str) -> None:
    key = "healed-" + uuid.uuid4().hex[:8]
    BROKEN.add(key)
    flow_id = start_by_api(url, HOSPITAL, {"key": key})
    wait_until(lambda: flow_status(url, flow_id) == "HOSPITALIZED", "the flow in the hospital")
    BROKEN.discard(key)
    with logged_in(url, "operator") as http:
        answer = http.post(
            f"/console/flows/{flow_id}/retry",
            data={"csrf": csrf_of(http, "/console/hospital"), "back": "/console/hospital"},
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/console/hospital"
        assert f"retry {flow_id}: ok" in http.get("/console/hospital").text
    wait_until(lambda: flow_status(url, flow_id) == "COMPLETED", "the retried flow to complete")


def test_a_start_form_is_idempotent_and_its_flow_page_shows_it(url: str) -> None:
    step = "console-" + uuid.uuid4().hex[:8]
    with logged_in(url, "starter") as http:
        page = http.get("/console/start")
        assert STEPS in page.text and 'name="arg.steps"' in page.text
        assert "tests.rpc_cordapp.TypedFlow" not in page.text  # not in starter's list
        request_id = re.search(
            rf'name="class" value="{STEPS}">\s*<input type="hidden" name="client_request_id" '
            r'value="([^"]+)"',
            page.text,
        )
        assert request_id is not None
        form = {
            "csrf": csrf_of(http),
            "class": STEPS,
            "client_request_id": request_id.group(1),
            "arg.steps": f'["{step}"]',
        }
        first = http.post("/console/start", data=form)
        # starter may not observe: it goes back to the start forms, told the flow's id
        assert first.status_code == 303 and first.headers["location"] == "/console/start"
        started = re.search(r"started \S+ as flow (rpc-[0-9a-f]+)", http.get("/console/start").text)
        assert started is not None
        flow_id = started.group(1)
        again = http.post("/console/start", data=form)  # the same form sent twice
        assert again.status_code == 303
        assert f"this form was sent before: it started flow {flow_id}" in (
            http.get("/console/start").text
        )
        flow_page = f"/console/flows/{flow_id}"
    wait_until(lambda: flow_status(url, flow_id) == "SUSPENDED", "the flow to wait at its gate")
    with logged_in(url, "watcher") as http:
        shown = http.get(flow_page).text
        assert STEPS in shown and step in shown and "SUSPENDED" in shown
        gate(step).set()
        wait_until(lambda: "COMPLETED" in http.get(flow_page).text, "the page to show the end")
        assert "&#34;" + step in http.get(flow_page).text  # the result, escaped JSON


def test_a_bad_start_is_refused_on_the_form_with_one_line(url: str) -> None:
    with logged_in(url, "starter") as http:
        token = csrf_of(http)

        def start(flow_class: str, **arguments: str) -> httpx.Response:
            form = {"csrf": token, "class": flow_class, "client_request_id": uuid.uuid4().hex}
            return http.post("/console/start", data=form | arguments)

        not_json = start(STEPS, **{"arg.steps": "[one"})
        assert not_json.status_code == 400 and "argument &#39;steps&#39;: not JSON" in (
            not_json.text
        )
        mistyped = start(STEPS, **{"arg.steps": "3"})
        assert mistyped.status_code == 400 and "argument &#39;steps&#39;" in mistyped.text
        missing = start(STEPS)
        assert missing.status_code == 400 and "is missing" in missing.text
        refused = start("tests.rpc_cordapp.TypedFlow")
        assert refused.status_code == 403 and "may not start" in refused.text


def test_a_failed_flows_page_shows_its_error_and_traceback_escaped(url: str) -> None:
    flow_id = start_by_api(url, "tests.rpc_cordapp.FailingFlow", {"message": "<b>no</b> good"})
    wait_until(lambda: flow_status(url, flow_id) == "FAILED", "the flow to fail")
    with logged_in(url, "watcher") as http:
        page = http.get(f"/console/flows/{flow_id}").text
        assert "&lt;b&gt;no&lt;/b&gt; good" in page and "<b>no</b>" not in page
        traceback = re.search(r'<pre id="traceback">(.*?)</pre>', page, re.DOTALL)
        assert traceback is not None
        assert "Traceback" in traceback.group(1) and "raise ValueError" in traceback.group(1)
        assert 'id="failure-class"' in page and "ValueError" in page
        assert "reloads every" not in page  # an ended flow's page stays still


def test_the_flow_list_filters_by_status_class_and_show(url: str, hospitalized: str) -> None:
    done = start_by_api(url, STEPS, {"steps": []})
    wait_until(lambda: flow_status(url, done) == "COMPLETED", "a flow to complete")
    with logged_in(url, "watcher") as http:
        every = http.get("/console/flows").text
        assert hospitalized in every and done in every
        kept = http.get("/console/flows", params={"status": "HOSPITALIZED"}).text
        assert hospitalized in kept and done not in kept
        live = http.get("/console/flows", params={"show": "live"}).text
        assert hospitalized in live and done not in live
        finished = http.get("/console/flows", params={"show": "finished"}).text
        assert done in finished and hospitalized not in finished
        by_class = http.get("/console/flows", params={"class": "StepsFlow"}).text
        assert done in by_class and hospitalized not in by_class
        assert http.get("/console/flows", params={"status": "BOGUS"}).status_code == 400
        assert http.get("/console/flows", params={"show": "some"}).status_code == 400


def test_untrusted_text_is_escaped(url: str) -> None:
    with logged_in(url, "everything") as http:
        token = csrf_of(http)
        answer = http.post(
            "/console/start",
            data={"csrf": token, "class": "<script>alert(1)</script>", "client_request_id": "x"},
        )
        assert answer.status_code == 400
        assert "&lt;script&gt;alert(1)&lt;/script&gt; is not a flow" in answer.text
        assert "<script>alert" not in answer.text
        missing = http.get("/console/flows/%3Cb%3Ebold")
        assert missing.status_code == 404 and "no flow &lt;b&gt;bold on" in missing.text


def test_every_page_has_a_strict_content_security_policy_and_no_outside_url(
    url: str, hospitalized: str
) -> None:
    with logged_in(url, "everything") as http, httpx.Client(base_url=url) as anonymous:
        for page in [*PAGES, f"/console/flows/{hospitalized}", "/console/login"]:
            answer = (anonymous if page == "/console/login" else http).get(page)
            assert answer.status_code == 200, page
            policy = answer.headers["content-security-policy"]
            assert policy.startswith("default-src 'none';") and "frame-ancestors 'none'" in policy
            assert answer.headers["cache-control"] == "no-store"
            # every link, form, script and style is the page's own (error text may name URLs)
            assert (
                re.findall(r"""(?:src|href|action)\s*=\s*["']?(?:https?:)?//""", answer.text) == []
            )
            assert "@import" not in answer.text and "url(" not in answer.text


def test_the_node_page_shows_counts_and_throughput_and_an_operator_drains(url: str) -> None:
    flow_id = start_by_api(url, STEPS, {"steps": []})
    wait_until(lambda: flow_status(url, flow_id) == "COMPLETED", "a flow to complete")
    with logged_in(url, "everything") as http:
        page = http.get("/console/node").text
        found = re.search(r"Last 60 s: (\d+) completed,\s*(\d+) failed", page)
        assert found is not None and int(found.group(1)) >= 1
        token = csrf_of(http)
        drained = http.post("/console/node/drain", data={"csrf": token})
        assert drained.status_code == 303
        page = http.get("/console/node").text
        assert "drain: draining" in page and 'id="draining">yes' in page
        assert http.post("/console/node/undrain", data={"csrf": token}).status_code == 303
        assert 'id="draining">no' in http.get("/console/node").text


def test_logging_out_ends_the_session(url: str) -> None:
    with logged_in(url, "watcher") as http:
        stolen = http.cookies[SESSION_COOKIE]
        answer = http.post("/console/logout", data={"csrf": csrf_of(http)})
        assert answer.status_code == 303 and answer.headers["location"] == "/console/login"
    with httpx.Client(base_url=url, timeout=60, cookies={SESSION_COOKIE: stolen}) as replay:
        assert replay.get("/console/flows").status_code == 303  # the old id is dead


def test_a_user_with_no_permission_can_log_in_but_sees_nothing(url: str) -> None:
    with logged_in(url, "nobody") as http:
        answer = http.get("/console/")
        assert answer.status_code == 403 and "has no permission for any page" in answer.text


def test_users_of_the_tests_are_as_this_module_expects() -> None:
    from tests.process.test_rpc_api import rpc_users

    users: dict[str, RpcUser] = {u.name: u for u in rpc_users()}
    assert users["watcher"].observe and not users["watcher"].operate
    assert users["operator"].operate and not users["operator"].observe
    assert users["robot"].password_hash is None


def test_under_tls_the_session_cookie_is_secure(tmp_path: Path) -> None:
    from flows.cordapps import Cordapps
    from flows.rpc.app import build_app
    from flows.rpc.auth import Authenticator
    from flows.rpc.gateway import NodeGateway
    from persistence.store import NodeDatabase
    from tests.process.test_rpc_api import rpc_users

    database = NodeDatabase(f"sqlite:///{tmp_path / 'node.db'}")
    try:
        gateway = NodeGateway(database, "O=Alice,L=London,C=GB", Cordapps(("tests.rpc_cordapp",)))
        app = build_app(gateway, Authenticator(rpc_users()), 65536, secure_cookies=True)

        async def log_in() -> httpx.Response:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="https://testserver"
            ) as http:
                form = await http.get("/console/login")
                login_cookie = form.headers["set-cookie"]
                assert login_cookie.startswith(LOGIN_COOKIE + "=")
                assert {"secure", "httponly", "samesite=strict"} <= {
                    p.strip().lower() for p in login_cookie.split(";")
                }
                token = re.search(r'name="csrf" value="([^"]+)"', form.text)
                assert token is not None
                return await http.post(
                    "/console/login",
                    data={
                        "user": "watcher",
                        "password": "watcher-password",
                        "csrf": token.group(1),
                    },
                )

        answer = asyncio.run(log_in())
        assert answer.status_code == 303
        attributes = {p.strip().lower() for p in session_cookie_header(answer).split(";")}
        assert {"secure", "httponly", "samesite=strict"} <= attributes
    finally:
        database.close()


def test_the_flow_list_pages_through_every_flow_once(url: str) -> None:
    """More flows than a page: the next-page links reach every one, none twice, filters kept."""
    flow_class = "tests.rpc_cordapp.StepsFlow"
    started = {start_by_api(url, flow_class, {"steps": []}) for _ in range(PAGE_SIZE + 5)}
    wait_until(
        lambda: all(flow_status(url, f) == "COMPLETED" for f in started), "the flows to finish"
    )
    seen: list[str] = []
    pages = 0
    with logged_in(url, "watcher") as http:
        page: str | None = f"/console/flows?show=finished&class={flow_class}&refresh=off"
        while page is not None:
            answer = http.get(page.replace("&amp;", "&"))
            assert answer.status_code == 200, answer.text
            rows = re.findall(r'<tr data-flow="([^"]+)">', answer.text)
            assert len(rows) <= PAGE_SIZE
            seen += rows
            pages += 1
            link = re.search(r'<a href="([^"]+)" id="next">', answer.text)
            page = link.group(1) if link else None
            if page is not None:
                assert "show=finished" in page and "StepsFlow" in page  # the filters stay
    assert started <= set(seen)
    assert len(seen) == len(set(seen))  # no flow on two pages
    assert pages >= 2
