"""bridge/server/pages.py: the playground's files, read from the package, served under a locked-down policy."""

from __future__ import annotations

import re

import pytest
from clef_bridge.bridge.server import pages
from clef_bridge.bridge.server.pages import CSP, FILES, PAGE_HEADERS, Page, load_playground
from clef_bridge.head.errors import ClefError

pytestmark = pytest.mark.unit


def test_every_file_is_read_with_its_content_type():
    loaded = load_playground()
    assert set(loaded) == set(FILES)
    for name, (file, content_type) in FILES.items():
        page = loaded[name]
        assert isinstance(page, Page) and page.content_type == content_type and page.body, file
    assert loaded["playground"].body.lstrip().lower().startswith(b"<!doctype html>")


def test_everything_the_page_and_its_scripts_load_is_served():
    """The page's stylesheet and scripts and the scripts' imports are files the server has routes for."""
    loaded = load_playground()
    served = {file for file, _ in FILES.values()}
    html = loaded["playground"].body.decode()
    wanted = set(re.findall(r'<(?:script|link)\b[^>]*(?:src|href)="(?!data:)([^"]+)"', html))
    for name, (file, content_type) in FILES.items():
        if content_type == "text/javascript":
            wanted |= set(re.findall(r"from '\./([^']+)'", loaded[name].body.decode()))
    assert {"playground.css", "playground.js", "playground-view.js", "playground-code.js"} <= wanted
    assert wanted <= served, sorted(wanted - served)


def test_the_page_has_no_inline_code_the_policy_would_block():
    html = load_playground()["playground"].body.decode()
    assert not re.search(r"<script\b(?![^>]*\bsrc=)[^>]*>", html)  # every script from a file
    assert not re.search(r"\son[a-z]+=", html) and "<style" not in html


def test_the_scripts_write_text_never_markup():
    """Names, answers and errors reach the page as text (textContent, text nodes, attributes): nothing parses a
    string as HTML, so a name like <img onerror=...> is shown, never run (tests/test_playground.py shows it)."""
    for name, (file, content_type) in FILES.items():
        if content_type == "text/javascript":
            code = load_playground()[name].body.decode()
            assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|DOMParser|"
                                 r"createContextualFragment|srcdoc|\beval\(|new Function", code), file


def test_the_policy_allows_only_this_origin():
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    for name in ("script-src", "style-src", "connect-src"):
        assert directives[name] == "'self'", name
    assert "unsafe" not in CSP and "*" not in CSP and "http" not in CSP
    assert PAGE_HEADERS["Content-Security-Policy"] == CSP and PAGE_HEADERS["X-Frame-Options"] == "DENY"


def test_missing_package_data_is_an_error_that_says_to_reinstall(monkeypatch, tmp_path):
    (tmp_path / "playground").mkdir()

    class Empty:
        @staticmethod
        def files(package):
            return tmp_path

    monkeypatch.setattr(pages, "resources", Empty)
    with pytest.raises(ClefError, match="reinstall"):
        load_playground()
