"""The playground: a page, its stylesheet and its scripts (bridge/server/playground/, shipped as package data),
read once when the app is made and served under headers that let the page reach nothing but this server."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from ...head.errors import ClefError

# Scripts, styles, fetches only from this origin, no inline code; `data:` images for the empty favicon
# (it spares the browser a /favicon.ico 404), `blob:` for the previews of the files a person picks.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; media-src 'self' blob:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}
FILES = {"playground": ("index.html", "text/html"), "playground_css": ("playground.css", "text/css"),
         "playground_js": ("playground.js", "text/javascript"),  # route name -> file, content type
         "playground_view_js": ("playground-view.js", "text/javascript"),
         "playground_code_js": ("playground-code.js", "text/javascript")}


@dataclass(frozen=True)
class Page:
    body: bytes
    content_type: str


def load_playground() -> dict[str, Page]:
    """The playground's files by route name."""
    folder = resources.files(__package__).joinpath("playground")
    try:
        return {name: Page(folder.joinpath(file).read_bytes(), content_type)
                for name, (file, content_type) in FILES.items()}
    except OSError as exc:
        raise ClefError(f"the playground's files are missing from the installed package ({exc}); reinstall "
                        "clef-bridge (`pip install .`), whose package data ships bridge/server/playground/") from None
