"""The checkout page in a real browser: a double click on "Pay" charges once; the naive page charges twice.

Run by scripts/contract.sh against a live `idempay dev`:

    python checkout-browser.py BASE_URL API_KEY OUT_DIR

Headless Chromium (Debian's, driven by its chromedriver through Selenium) opens BASE_URL/demo/checkout
with every host but 127.0.0.1 unresolvable, pays with the slow test card by double-clicking, and
checks the page's answers and timeline and, with API_KEY, the account's payments through the API.
Then it starts a new order in naive mode (a key per click) and checks that the same double click
makes two payments; then an order authorized now and shipped later, whose "Ship" double click
captures once under a key of its own, the timeline showing both keys. Screenshots go to
OUT_DIR/checkout.png, checkout-naive.png and checkout-ship.png. Prints what it saw; exits 1 with
the reasons when a check fails.
"""

import json
import sys
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

# A ceiling on each wait, not a timing assertion: the slow card takes what IDEMPAY_SLOW_CHARGE
# says, and a 409 is retried after Retry-After (1 s).
WAIT_SECONDS = 30


def main(base, api_key, out):
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        f"--user-data-dir={out}/checkout-profile",
        # As for /docs: an asset fetched from anywhere but the server would fail to load.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--window-size=1280,1250",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        service=Service("/usr/bin/chromedriver", log_output=f"{out}/chromedriver.log"),
        options=options,
    )
    problems = []
    try:
        driver.get(f"{base}/demo/checkout")
        wait = WebDriverWait(driver, WAIT_SECONDS)
        wait.until(lambda d: d.find_element(By.ID, "key").text, "the page made no key")

        # The session: HttpOnly (no script reads it), and the page shows no API key.
        cookies = {c["name"]: c for c in driver.get_cookies()}
        session = cookies.get("idempay_demo_session")
        if not session or not session.get("httpOnly"):
            problems.append(f"no HttpOnly demo session cookie: {cookies}")
        if "idempay_demo_session" in driver.execute_script("return document.cookie"):
            problems.append("a script can read the session cookie")
        if api_key in driver.page_source or "sk_" in driver.page_source:
            problems.append("the page shows an API key")

        # One key per intent: the double click is answered once, the second click from the same key.
        Select(driver.find_element(By.ID, "card")).select_by_value("pm_card_slow")
        order, answers = double_click_and_wait(driver, wait, expected_successes=2)
        keys = {a["key"] for a in answers}
        created = [a for a in answers if a["status"] == "201" and a["replayed"] == "false"]
        replayed = [a for a in answers if a["replayed"] == "true"]
        in_flight = [a for a in answers if a["status"] == "409"]
        print(
            f"checkout: one key per order: {len(answers)} answers "
            f"({len(created)} created, {len(in_flight)} in flight (409), {len(replayed)} replayed) "
            f"with {len(keys)} key(s)"
        )
        if len(keys) != 1:
            problems.append(f"the two clicks sent {len(keys)} keys, not one")
        if len(created) != 1:
            problems.append(f"{len(created)} answers created a payment, not one: {answers}")
        if not replayed:
            problems.append(f"the second click was not answered from the same key: {answers}")
        # The timeline: the server's view of the key, completed with the stored 201.
        wait.until(
            lambda d: timeline_state(d) == ("completed", "201"),
            "the timeline never showed one key completed with 201",
        )
        timeline = driver.find_element(By.ID, "timeline").text
        for needle in ("reserved by the first request", "completed: 201", "answers to this page"):
            if needle not in timeline:
                problems.append(f"the timeline lacks {needle!r}: {timeline}")
        payments = payments_of(base, api_key, order)
        print(f"checkout: order {order}: {len(payments)} payment(s) through the API")
        if len(payments) != 1:
            problems.append(f"order {order} has {len(payments)} payments, not one")
        wait.until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#payments tr.this-order")) == 1,
            "the page's payment list never showed the order's one payment",
        )
        driver.save_screenshot(f"{out}/checkout.png")

        # The naive page: a key per click, so the same double click pays twice.
        driver.find_element(By.ID, "new-order").click()
        driver.find_element(By.ID, "naive").click()
        order, answers = double_click_and_wait(driver, wait, expected_successes=2)
        created = [a for a in answers if a["status"] == "201" and a["replayed"] == "false"]
        payments = payments_of(base, api_key, order)
        print(
            f"checkout: naive, a key per click: {len(created)} created, "
            f"{len(payments)} payment(s) for order {order}"
        )
        if len(created) != 2 or len(payments) != 2:
            problems.append(f"the naive double click made {len(payments)} payments, not two")
        wait.until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#payments tr.this-order")) == 2,
            "the page's payment list never showed the order's two payments",
        )
        driver.save_screenshot(f"{out}/checkout-naive.png")

        # Authorize now, ship later: "Pay" holds the money; a double click on "Ship" captures it
        # once, under a key of its own; the timeline shows both keys completed.
        driver.find_element(By.ID, "naive").click()
        driver.find_element(By.ID, "new-order").click()
        driver.find_element(By.ID, "manual").click()
        Select(driver.find_element(By.ID, "card")).select_by_value("pm_card_visa")
        order = driver.find_element(By.ID, "order-ref").text
        driver.find_element(By.ID, "pay").click()
        wait.until(lambda d: d.find_element(By.ID, "ship").is_displayed(), "no Ship button")
        ActionChains(driver).double_click(driver.find_element(By.ID, "ship")).perform()
        wait.until(
            lambda d: len([a for a in answers_of(d) if a["status"] == "200"]) >= 2,
            "fewer than 2 answers 200 to the Ship double click",
        )
        captures = [a for a in answers_of(driver) if a["status"] in ("200", "409")]
        capture_keys = {a["key"] for a in captures}
        captured = [a for a in captures if a["status"] == "200" and a["replayed"] == "false"]
        payments = payments_of(base, api_key, order)
        print(
            f"checkout: ship: {len(captures)} capture answer(s) with {len(capture_keys)} key(s), "
            f"{len(captured)} captured; order {order}: "
            f"{[(p['status'], p.get('amount_captured')) for p in payments]}"
        )
        if len(capture_keys) != 1 or len(captured) != 1:
            problems.append(f"the Ship double click was not one capture under one key: {captures}")
        if [(p["status"], p.get("amount_captured")) for p in payments] != [("succeeded", 4200)]:
            problems.append(f"order {order} is not one payment captured in full: {payments}")
        wait.until(
            lambda d: key_states(d) == ["completed", "completed"],
            "the timeline never showed two keys completed (the payment's and the capture's)",
        )
        timeline = driver.find_element(By.ID, "timeline").text
        if "POST /v1/payments/{id}/capture" not in timeline:
            problems.append(f"the timeline does not name the capture's key: {timeline}")
        driver.save_screenshot(f"{out}/checkout-ship.png")
    except Exception as error:  # a wait that ran out, a missing element: the check fails, with why
        problems.append(f"{type(error).__name__}: {error}".strip())
        driver.save_screenshot(f"{out}/checkout-failed.png")
    finally:
        driver.quit()
    for problem in problems:
        print(f"checkout: {problem}", file=sys.stderr)
    return 1 if problems else 0


def double_click_and_wait(driver, wait, expected_successes):
    """Double-clicks Pay; waits until the page shows `expected_successes` 2xx answers."""
    order = driver.find_element(By.ID, "order-ref").text
    ActionChains(driver).double_click(driver.find_element(By.ID, "pay")).perform()
    wait.until(
        lambda d: len(successes(answers_of(d))) >= expected_successes,
        f"fewer than {expected_successes} successful answers",
    )
    return order, answers_of(driver)


def answers_of(driver):
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#answers li'), li => ({...li.dataset}))"
    )


def successes(answers):
    return [a for a in answers if a["status"] in ("200", "201")]


def key_states(driver):
    """The state of each key block in the timeline; None while the timeline is being redrawn (a
    block found, then replaced before it was read: seen on a loaded machine)."""
    try:
        return [b.get_attribute("data-state") for b in driver.find_elements(By.CSS_SELECTOR, "#timeline .key-block")]
    except StaleElementReferenceException:
        return None


def timeline_state(driver):
    blocks = driver.find_elements(By.CSS_SELECTOR, "#timeline .key-block")
    if len(blocks) != 1:
        return None
    return (blocks[0].get_attribute("data-state"), blocks[0].get_attribute("data-response-status"))


def payments_of(base, api_key, order):
    """The account's payments for `order`, through the API (the newest 100 hold them)."""
    request = urllib.request.Request(
        f"{base}/v1/payments?limit=100", headers={"Authorization": f"Bearer {api_key}"}
    )
    with urllib.request.urlopen(request, timeout=WAIT_SECONDS) as response:
        listed = json.load(response)
    return [p for p in listed["data"] if p.get("order") == order]


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
