"""The HTML analysis report in a real headless browser (selenium driving Debian's chromium).

A report with a failing check whose findings hold very long ids, a warning and passing checks
is rendered (from the report's plain data: no Spark), opened from its file and screenshotted
(the PNG stays in the test's tmp_path). The verdict must be in the first viewport, the cards
failing first, each card must link to its check's section and bring it into view, and no
table may be wider than the page. Without chromium, chromedriver or selenium the test skips
naming what is missing; with FIBERFLOW_REQUIRE_SERVICES=1 it fails instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from persistence.analytics.check_results import FAIL, INFO, OK, STATUS_ORDER, WARN
from persistence.analytics.report import AnalysisReport, CheckReport, Table
from persistence.analytics.report_html import write_html
from tests.browser import browser_problem, headless_chromium
from tests.conftest import require_service

LONG = "O=" + "VeryLongOrganisationName" * 6 + ",L=London,C=GB"
SESSION = "s-" + "9f8e7d6c5b4a" * 12
SHOWN = ["node", "session_id", "role", "counterparty", "counterpart_flow_id", "problem"]


@pytest.fixture
def browser() -> Iterator[Any]:
    require_service("a headless browser", browser_problem())
    with headless_chromium((1024, 768)) as driver:
        yield driver


def _check(name: str, status: str, table: Table, extras: dict[str, Table] | None = None) -> Any:
    title = name.replace("_", " ").capitalize()
    summary = f"{table.total} findings" if table.total else "nothing found"
    return CheckReport(name, title, status, summary, table.total, "", table, extras or {}, 0.5)


def a_report_with_long_findings() -> AnalysisReport:
    orphans = Table(
        [*SHOWN[:5], "evidence", "since_ms", "problem"],
        [
            [
                LONG,
                f"{SESSION}{i}",
                "initiator",
                LONG,
                "f" * 64,
                "checkpoint,consumed,outbox",
                1_800_000_000_000,
                f"no flow {'f' * 64} on {LONG} holds the other end",
            ]
            for i in range(12)
        ],
        12,
    )
    stuck = Table(["node", "flow_id", "waited_ms"], [[LONG, "a" * 80, 7_200_000]], 1)
    counts = Table(["node", "flow_class", "status", "flows"], [[LONG, "x.Flow", "COMPLETED", 3]], 1)
    checks = [
        _check("flow_counts", INFO, counts),
        _check("stuck_flows", WARN, stuck),
        _check("session_consistency", FAIL, orphans, {"summary": Table(["o", "n"], [], 0)}),
        _check("exactly_once_audit", OK, Table(["node", "detail"], [], 0)),
    ]
    node = {
        "name": LONG,
        "url": "sqlite:///" + "/very/long/path" * 10 + "/alice.db",
        "path": "jdbc",
        "detail": "read through JDBC in 4 partitions " + "x" * 150,
        "snapshot": "backup copy",
        "named_by": "argument",
        "rows": {"checkpoints": 3, "message_ids": 4, "outbox": 0, "results": 1, "exceptions": 0},
    }
    spark = {"master": "local[*]", "version": "4.0"}
    settings = {"as_of_ms": None, "grace_ms": 60_000}
    return AnalysisReport(0, 0, FAIL, settings, [node], 0, spark, 1.0, checks)


def test_the_report_shows_its_verdict_failing_first_links_and_fits(
    browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    report = a_report_with_long_findings()
    page = tmp_path / "report.html"
    write_html(report, str(page))
    browser.get(page.as_uri())
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 0

    verdict = browser.find_element(By.ID, "verdict")
    assert verdict.is_displayed()
    assert verdict.text.startswith("FAIL: 4 checks, 1 failed (Session consistency)")
    bottom = browser.execute_script(
        "return arguments[0].getBoundingClientRect().bottom <= window.innerHeight", verdict
    )
    assert bottom is True

    cards = browser.find_elements(By.CSS_SELECTOR, "a.card")
    targets = [card.get_attribute("href").rsplit("#", 1)[1] for card in cards]
    statuses = {check.name: check.status for check in report.checks}
    assert sorted(targets) == sorted(statuses)
    assert targets[0] == "session_consistency"
    order = [STATUS_ORDER[statuses[name]] for name in targets]
    assert order == sorted(order, reverse=True)
    sections = [
        s.get_attribute("id") for s in browser.find_elements(By.CSS_SELECTOR, "main>section[id]")
    ]
    assert sections == targets  # the findings in the cards' order

    for card, target in zip(cards, targets, strict=True):
        browser.execute_script("window.scrollTo(0, 0)")
        card.click()
        assert browser.execute_script("return location.hash") == f"#{target}"
        section = browser.find_element(By.ID, target)
        top = browser.execute_script("return arguments[0].getBoundingClientRect().top", section)
        inner = browser.execute_script("return window.innerHeight")
        assert 0 <= top < inner, (target, top)

    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth"
    )
    widths = browser.execute_script(
        "return [...document.querySelectorAll('table')].map(t => "
        "[t.getBoundingClientRect().width, t.parentElement.clientWidth])"
    )
    assert len(widths) >= 3
    assert all(table <= box + 0.5 for table, box in widths), widths
    orphans = browser.find_element(By.ID, "session_consistency")
    headers = [th.text for th in orphans.find_elements(By.CSS_SELECTOR, "th")]
    assert headers == [*SHOWN, "more"]
    details = orphans.find_element(By.CSS_SELECTOR, "details")
    assert "evidence" not in details.text  # folded until opened
    details.find_element(By.TAG_NAME, "summary").click()
    assert "evidence" in details.text and "2027-01-15 08:00:00.000Z" in details.text
    fetched = browser.execute_script(
        "return [...document.querySelectorAll('[href],[src]')]"
        ".map(e => e.getAttribute('href') || e.getAttribute('src'))"
    )
    assert all(link.startswith("#") for link in fetched), fetched
