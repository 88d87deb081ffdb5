"""The web console in a real headless browser (selenium driving Debian's chromium).

A node process runs in a thread with the RPC tests' users; chromium logs in, starts a flow
from the form and watches its page reload until it has finished, retries a hospitalized
flow with its button, and is refused where its user lacks the permission. Waits are explicit
(WebDriverWait on what the page shows), never sleeps. Without chromium, chromedriver or
selenium the tests skip naming what is missing; with FIBERFLOW_REQUIRE_SERVICES=1 (CI) they
fail instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser import browser_problem, headless_chromium
from tests.conftest import require_service
from tests.console_helpers import (
    HOSPITAL,
    STEPS,
    console_node,
    flow_document,
    flow_status,
    start_by_api,
)
from tests.rpc_cordapp import BROKEN, gate
from tests.rpc_helpers import PASSWORDS
from tests.waiting import wait_until

WAIT_SECONDS = 60


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_service("a headless browser", browser_problem())
    with console_node(tmp_path_factory.mktemp("console-browser")) as (_, base):
        yield base


@pytest.fixture
def browser(url: str) -> Iterator[Any]:
    with headless_chromium() as driver:
        yield driver


def wait(driver: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_SECONDS)


def text_of(driver: Any, element_id: str) -> str:
    """The text of the element with this id, or "" (the page may be reloading)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.ID, element_id).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def log_in(driver: Any, url: str, user: str, password: str | None = None) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/console/login")
    driver.find_element(By.ID, "user").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(
        PASSWORDS[user] if password is None else password
    )
    driver.find_element(By.ID, "login").click()
    if password is None:
        wait(driver).until(lambda d: d.find_elements(By.ID, "logout"))


def test_log_in_start_a_flow_and_see_it_finish(browser: Any, url: str) -> None:
    from selenium.webdriver.common.by import By

    step = "browser-" + uuid.uuid4().hex[:8]
    log_in(browser, url, "everything")
    browser.find_element(By.LINK_TEXT, "Start a flow").click()
    form = wait(browser).until(
        lambda d: d.find_element(By.CSS_SELECTOR, f'form[data-class="{STEPS}"]')
    )
    form.find_element(By.NAME, "arg.steps").send_keys(f'["{step}"]')
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(browser).until(lambda d: "/console/flows/rpc-" in d.current_url)
    assert f"started {STEPS} as flow" in text_of(browser, "note")
    assert text_of(browser, "class") == STEPS
    flow_id = text_of(browser, "flow-id")
    wait(browser).until(lambda d: text_of(d, "progress") == step)  # the page reloads itself
    assert text_of(browser, "status") == "SUSPENDED"
    assert text_of(browser, "waiting") == flow_document(url, flow_id)["waiting_on"]
    gate(step).set()
    wait(browser).until(lambda d: text_of(d, "status") == "COMPLETED")
    assert step in text_of(browser, "result")
    browser.get(f"{url}/console/flows?show=finished")
    wait(browser).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-flow="{flow_id}"] .status')
    )
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-flow="{flow_id}"] .status')
    assert row.text == "COMPLETED"


def test_an_operator_retries_a_hospitalized_flow_with_its_button(browser: Any, url: str) -> None:
    from selenium.webdriver.common.by import By

    key = "browser-" + uuid.uuid4().hex[:8]
    BROKEN.add(key)
    flow_id = start_by_api(url, HOSPITAL, {"key": key})
    wait_until(lambda: flow_status(url, flow_id) == "HOSPITALIZED", "the flow in the hospital")
    log_in(browser, url, "everything")
    browser.get(f"{url}/console/hospital?refresh=off")
    retry = wait(browser).until(
        lambda d: d.find_element(By.CSS_SELECTOR, f'button.retry[data-flow="{flow_id}"]')
    )
    assert browser.find_elements(By.CSS_SELECTOR, f'button.kill[data-flow="{flow_id}"]')
    BROKEN.discard(key)
    retry.click()
    wait(browser).until(lambda d: f"retry {flow_id}: ok" in text_of(d, "note"))
    browser.get(f"{url}/console/flows/{flow_id}")
    wait(browser).until(lambda d: text_of(d, "status") == "COMPLETED")
    assert f"healed {key}" in text_of(browser, "result")


def test_a_user_without_operate_gets_no_button_and_a_forged_post_is_refused(
    browser: Any, url: str
) -> None:
    from selenium.webdriver.common.by import By

    key = "kept-" + uuid.uuid4().hex[:8]
    BROKEN.add(key)
    flow_id = start_by_api(url, HOSPITAL, {"key": key})
    wait_until(lambda: flow_status(url, flow_id) == "HOSPITALIZED", "the flow in the hospital")
    log_in(browser, url, "watcher")
    browser.get(f"{url}/console/hospital?refresh=off")
    wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-flow="{flow_id}"]'))
    assert browser.find_elements(By.CSS_SELECTOR, "button.retry, button.kill") == []
    browser.get(f"{url}/console/flows/{flow_id}?refresh=off")
    assert text_of(browser, "status") == "HOSPITALIZED"
    assert browser.find_elements(By.CSS_SELECTOR, "#actions button") == []
    # forge the retry form, with the watcher's own valid CSRF token
    browser.execute_script(
        """
        const form = document.createElement("form");
        form.method = "post";
        form.action = "/console/flows/" + encodeURIComponent(arguments[0]) + "/retry";
        const token = document.querySelector("input[name=csrf]").cloneNode();
        form.appendChild(token);
        document.body.appendChild(form);
        form.submit();
        """,
        flow_id,
    )
    wait(browser).until(lambda d: "may not operate" in text_of(d, "message"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "403"
    assert flow_status(url, flow_id) == "HOSPITALIZED"


def test_a_wrong_password_is_refused(browser: Any, url: str) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, url, "watcher", "not-the-password")
    wait(browser).until(lambda d: text_of(d, "error") == "wrong user name or password")
    assert browser.get_cookie("fiberflow_console") is None
    assert browser.find_elements(By.ID, "logout") == []
    browser.get(f"{url}/console/flows")
    wait(browser).until(lambda d: "/console/login" in d.current_url)


def test_the_pages_fetch_nothing_from_outside_the_machine(browser: Any, url: str) -> None:
    start_by_api(url, STEPS, {"steps": []})
    log_in(browser, url, "everything")
    for page in ("flows", "hospital", "node", "start"):
        browser.get(f"{url}/console/{page}?refresh=off")
        wait(browser).until(lambda d: d.execute_script("return document.readyState") == "complete")
        fetched = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
        assert [name for name in fetched if not name.startswith(url)] == [], page
        links = browser.execute_script(
            "return [...document.querySelectorAll('[href],[src],[action]')]"
            ".map(e => e.href || e.src || e.action)"
        )
        assert links and all(link.startswith(url) for link in links), (page, links)
