"""The chat page at GET /, driven in headless Chromium (Debian's chromium through playwright, no browser download):
send a message, see the streamed reply with its reasoning folded away, the model's name and the speed, and keep a
screenshot ($STRATA_BUILD_DIR/serve-page.png); stop a long reply and see the server free its slot."""
from __future__ import annotations

import shutil

import pytest
import requests

from script_model import EXPECTED, write_script_model
from serve_util import Server, wait_for


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    return None


def test_page_is_self_contained(strata_bin, tmp_path):
    model = write_script_model(tmp_path / "script-json.gguf", "json")
    s = Server(strata_bin, model, tmp_path / "page.log", "--parallel", "1")
    try:
        r = requests.get(s.url + "/", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        page = r.text
        assert "/v1/chat/completions" in page and "reasoning_content" in page
        for external in ("http://", "https://", "src=\"//", "<link "):  # no external assets
            assert external not in page, external
    finally:
        s.stop()


def test_chat_page_in_headless_chromium(strata_bin, build_dir, tmp_path):
    exe = chromium()
    if exe is None:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it)")
    from playwright.sync_api import expect, sync_playwright

    model = write_script_model(tmp_path / "script-json.gguf", "json")
    s = Server(strata_bin, model, tmp_path / "page.log", "--parallel", "1")
    shot = build_dir / "serve-page.png"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1000, "height": 640})
            page.goto(s.url + "/")
            expect(page.locator("#model")).to_have_text("script-json.gguf", timeout=10000)
            page.fill("#input", "What is the weather in Paris?")
            page.click("#send")
            reply = page.locator(".msg.assistant").first
            expect(reply.locator(".content")).to_contain_text("get_weather", timeout=20000)
            expect(reply.locator(".stats")).to_contain_text("tokens", timeout=20000)
            # Reasoning is there, folded.
            details = reply.locator("details")
            expect(details).to_be_visible()
            assert details.get_attribute("open") is None
            assert details.locator("div").text_content() == EXPECTED["json"]["reasoning"]
            expect(page.locator("#speed")).to_contain_text("tok/s")
            expect(page.locator(".msg.user").first).to_have_text("What is the weather in Paris?")
            expect(page.locator("#send")).to_be_enabled()
            expect(page.locator("#stop")).to_be_disabled()
            details.locator("summary").click()  # unfold it for the picture
            page.screenshot(path=str(shot))
            browser.close()
        assert shot.stat().st_size > 10000
        assert s.metrics()["strata_requests_finished_total"] >= 1
    finally:
        s.stop()


def test_stop_button_ends_a_long_reply_and_frees_the_slot(strata_bin, tmp_path):
    exe = chromium()
    if exe is None:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it)")
    from playwright.sync_api import expect, sync_playwright

    model = write_script_model(tmp_path / "script-endless.gguf", "endless")  # writes until told to stop
    s = Server(strata_bin, model, tmp_path / "stop.log", "--parallel", "1", "--ctx-size", "32768")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            page.goto(s.url + "/")
            expect(page.locator("#model")).to_have_text("script-endless.gguf", timeout=10000)
            page.fill("#maxtok", "30000")  # about half a minute of generation here
            page.fill("#input", "Tell me about the river.")
            page.click("#send")
            reply = page.locator(".msg.assistant").first
            content = reply.locator(".content")
            expect(content).to_contain_text("market. The river", timeout=20000)  # streaming, once round the loop
            assert s.metrics()["strata_requests_running"] == 1

            page.click("#stop")
            # The stream ends on the page: the reply is marked stopped and a new message can be sent.
            expect(reply.locator(".stats")).to_contain_text("stopped", timeout=5000)
            expect(page.locator("#send")).to_be_enabled()
            expect(page.locator("#stop")).to_be_disabled()
            # The server noticed the closed connection: the job was cancelled and the only slot is free.
            assert wait_for(lambda: s.metrics()["strata_requests_cancelled_total"] == 1, 5)
            m = s.metrics()
            assert m["strata_requests_running"] == 0
            assert m["strata_generated_tokens_total"] < 30000
            # The partial reply stays, and nothing more arrives.
            partial = content.text_content()
            assert partial.startswith("The river runs on and on, past the market. The river")
            page.wait_for_timeout(500)
            assert content.text_content() == partial

            # The next message is answered at once, with the partial reply in its history.
            page.fill("#maxtok", "5")
            page.fill("#input", "Go on.")
            page.click("#send")
            second = page.locator(".msg.assistant").nth(1)
            expect(second.locator(".stats")).to_contain_text("5 tokens", timeout=10000)
            expect(second.locator(".content")).to_have_text("The river runs on and on, past the market.")  # 5 pieces
            expect(content).to_have_text(partial)
            browser.close()
        assert s.metrics()["strata_requests_finished_total"] == 1
    finally:
        s.stop()


def test_markdown_is_rendered_without_html_injection_and_code_can_be_copied(strata_bin, tmp_path):
    """A reply with Markdown and HTML in it: the Markdown becomes elements, the HTML stays text (no <img> element, its
    onerror never runs), the code block has a copy button that copies the code, and no page text is unescaped."""
    exe = chromium()
    if exe is None:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it)")
    from playwright.sync_api import expect, sync_playwright

    model = write_script_model(tmp_path / "script-markdown.gguf", "markdown")
    s = Server(strata_bin, model, tmp_path / "md.log", "--parallel", "1")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
            context = browser.new_context()
            context.grant_permissions(["clipboard-read", "clipboard-write"], origin=s.url)
            page = context.new_page()
            page.goto(s.url + "/")
            expect(page.locator("#model")).to_have_text("script-markdown.gguf", timeout=10000)
            page.fill("#input", "Show me.")
            page.click("#send")
            reply = page.locator(".msg.assistant").first
            expect(reply.locator(".stats")).to_contain_text("tokens", timeout=20000)
            content = reply.locator(".content")
            expect(content.locator("strong")).to_have_text("bold")
            expect(content.locator("p code")).to_have_text("code")
            assert content.locator("img").count() == 0
            assert page.evaluate("window.pwned") is None
            expect(content.locator("p").first).to_contain_text('<img src=x onerror="window.pwned=1">')
            code = content.locator(".codeblock pre code")
            expect(code).to_have_text("print('<b>hi</b>')")
            assert content.locator("b").count() == 0
            expect(content.locator(".codeblock .bar span")).to_have_text("python")
            expect(content.locator("p").last).to_have_text("done")
            content.locator(".codeblock button.copy").click()
            expect(content.locator(".codeblock button.copy")).to_have_text("Copied")
            assert page.evaluate("navigator.clipboard.readText()") == "print('<b>hi</b>')"
            stats = reply.locator(".stats").text_content()
            assert "stopped" not in stats and " ·  · " not in stats and not stats.startswith(" ·")
            browser.close()
    finally:
        s.stop()
