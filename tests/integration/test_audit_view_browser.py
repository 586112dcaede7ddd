"""The audit web view in a real browser: headless Chromium (Debian ``chromium`` and ``chromium-driver``) driven
by Selenium against ``remediator audit serve --data-dir DIR`` after the demo ran. A duty manager signs in with
an auditor token, finds the Xid 79 incident by its alert fingerprint, follows it to its timeline and its node;
what each page shows is checked against the audit records ``remediator audit show --json`` printed. A PNG of
every page is saved under the test's ``tmp_path`` and copied to ``artifacts/screenshots/`` (gitignored).

Selenium Manager downloads nothing: the browser and driver are the system's, named explicitly."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .audit_serve_support import AUDITOR_TOKEN, DemoStore, Served, audit_serve, run_demo

pytestmark = [pytest.mark.drill, pytest.mark.timeout(300)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


def _require_browser() -> None:
    missing = [f"{p} (Debian package {pkg})" for p, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver"))
               if not p.exists()]
    if missing:
        pytest.fail("the browser test needs " + " and ".join(missing) + ": apt-get install -y chromium "
                    "chromium-driver", pytrace=False)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoStore:
    return run_demo(tmp_path_factory.mktemp("audit-view") / "store")


@pytest.fixture(scope="module")
def served(demo: DemoStore) -> Iterator[Served]:
    with audit_serve(demo.path) as s:
        yield s


@pytest.fixture
def browser() -> Iterator[object]:
    _require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,900", "--no-first-run", "--disable-extensions"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: object, tmp_path: Path, name: str) -> Path:
    """A full-page PNG of what the browser shows, in ``tmp_path`` and in ``artifacts/screenshots``."""
    height = driver.execute_script("return document.documentElement.scrollHeight")  # type: ignore[attr-defined]
    driver.set_window_size(1440, min(max(int(height), 900), 6000))  # type: ignore[attr-defined]
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path)), name  # type: ignore[attr-defined]
    driver.set_window_size(1440, 900)  # type: ignore[attr-defined]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / path.name)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    return path


def test_a_duty_manager_finds_the_xid79_incident_by_fingerprint_and_reads_its_timeline(
        demo: DemoStore, served: Served, browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    d = browser
    wait = WebDriverWait(d, 30)  # type: ignore[arg-type]
    inc = demo.xid79_incident
    shown = demo.xid79_show
    fingerprint = next(r["fingerprint"] for r in shown if r["fingerprint"])

    # signing in: the list redirects to the login page, the token goes into a cookie, never into a URL
    d.get(served.base + "/audit/")  # type: ignore[attr-defined]
    wait.until(ec.presence_of_element_located((By.ID, "token")))
    assert "/audit/login" in d.current_url  # type: ignore[attr-defined]
    _shot(d, tmp_path, "01-login")
    box = d.find_element(By.ID, "token")  # type: ignore[attr-defined]
    box.send_keys(AUDITOR_TOKEN)
    box.send_keys(Keys.ENTER)
    wait.until(ec.presence_of_element_located((By.ID, "f-fingerprint")))
    assert AUDITOR_TOKEN not in d.current_url  # type: ignore[attr-defined]
    rows = d.find_elements(By.CSS_SELECTOR, "table.list tbody tr")  # type: ignore[attr-defined]
    assert len(rows) == len({r["incident"] for r in demo.records if r["incident"]})
    badge = d.find_element(By.CSS_SELECTOR, "#chain-badge .badge")  # type: ignore[attr-defined]
    assert badge.get_attribute("data-chain-ok") == "true" and "verified" in badge.text
    _shot(d, tmp_path, "02-incidents")

    # the search by alert fingerprint, from the keyboard
    field = d.find_element(By.ID, "f-fingerprint")  # type: ignore[attr-defined]
    field.send_keys(fingerprint)
    field.send_keys(Keys.ENTER)
    wait.until(ec.url_contains("fingerprint="))
    rows = d.find_elements(By.CSS_SELECTOR, "table.list tbody tr")  # type: ignore[attr-defined]
    assert [r.get_attribute("data-incident") for r in rows] == [inc]
    assert demo.xid79["node"] in rows[0].text and demo.xid79["outcome"] in rows[0].text
    _shot(d, tmp_path, "03-search-by-fingerprint")

    # following it to its timeline
    rows[0].find_element(By.LINK_TEXT, inc).click()
    wait.until(ec.presence_of_element_located((By.ID, "headline")))
    assert d.find_element(By.TAG_NAME, "h1").text == f"Incident {inc}"  # type: ignore[attr-defined]
    table = d.find_elements(By.CSS_SELECTOR, "table.records tbody tr")  # type: ignore[attr-defined]
    assert [(int(t.get_attribute("data-seq")), t.get_attribute("data-what"), t.get_attribute("data-node"))
            for t in table] == [(r["seq"], r["what"], r["node"]) for r in shown]  # every record, in order
    for row, rec in zip(table, shown, strict=True):
        assert rec["actor"] in row.text and rec["what"] in row.text
    facts = d.find_element(By.CSS_SELECTOR, "dl.facts").text  # type: ignore[attr-defined]
    gpu = next(r["gpu"] for r in shown if r["gpu"])
    trace = next(r["trace_id"] for r in shown if r["incident"] and r["trace_id"])
    for value in (demo.xid79["node"], gpu, fingerprint, trace, demo.xid79["playbook"], demo.xid79["outcome"]):
        assert value in facts
    head = d.find_element(By.ID, "headline").text  # type: ignore[attr-defined]
    decision = next(r for r in shown if r["what"] == "decision" and "handler" in r["after"])
    assert f"playbook {decision['after']['playbook']} because" in head
    for action in demo.xid79["actions"]:
        assert action in head
    drain = next(r for r in shown if r["what"] == "step_succeeded" and r["after"].get("step") == "drain")
    assert f"{len(drain['after']['evicted'])} evicted" in head
    story = d.find_elements(By.CSS_SELECTOR, "ol.story li")  # type: ignore[attr-defined]
    assert story[-1].text.endswith(f"finished: {demo.xid79['outcome']}")
    escalated = next(r for r in shown if r["what"] == "escalated")
    assert any(escalated["after"]["action"] in li.text for li in story)
    _shot(d, tmp_path, "04-incident-timeline")

    # its node: faults and actions over time, with the chain's badge
    d.find_element(By.CSS_SELECTOR, "dl.facts a").click()  # type: ignore[attr-defined]
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "svg.plot")))
    node_records = [r for r in demo.records if r["node"] == demo.xid79["node"]]
    assert len(d.find_elements(By.CSS_SELECTOR, "svg.plot circle")) == len(node_records)  # type: ignore[attr-defined]
    assert f"{len(node_records)} records verified" in d.find_element(By.TAG_NAME, "main").text  # type: ignore
    _shot(d, tmp_path, "05-node")

    # the fleet: breaker, budget, pending approvals, open incidents
    d.find_element(By.LINK_TEXT, "Fleet").click()  # type: ignore[attr-defined]
    wait.until(ec.presence_of_element_located((By.ID, "breaker")))
    fleet = httpx.get(served.base + "/v1/audit/fleet", headers={"Authorization": f"Bearer {AUDITOR_TOKEN}"},
                      timeout=30).json()
    breaker = d.find_element(By.ID, "breaker").text  # type: ignore[attr-defined]
    if fleet["breaker"] is None:  # the auditor role may not read the ledger: the page says so, never "closed"
        assert "unknown" in breaker and "closed" not in breaker and fleet["ledger_error"] in breaker
    else:
        assert ("OPEN" if fleet["breaker"]["open"] else "closed") in breaker
        assert len(d.find_elements(By.CSS_SELECTOR, "#pools tbody tr")) == max(1, len(fleet["pools"]))  # type: ignore
    assert ("No approval is pending" in d.find_element(By.ID, "pending").text) == (  # type: ignore[attr-defined]
        not fleet["pending_approvals"])
    _shot(d, tmp_path, "06-fleet")

    # keyboard: the first Tab reaches the skip link, which moves focus to the content
    d.get(served.base + "/audit/")  # type: ignore[attr-defined]
    d.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)  # type: ignore[attr-defined]
    focused = d.switch_to.active_element  # type: ignore[attr-defined]
    assert focused.get_attribute("class") == "skip"
    focused.send_keys(Keys.ENTER)
    assert d.switch_to.active_element.get_attribute("id") == "main"  # type: ignore[attr-defined]
