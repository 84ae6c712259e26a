#!/usr/bin/env python3
"""Check every relative link of the built documentation site (mdBook's HTML in target/book/):
each `href`/`src` that is not a URL must name a file of the book, and each `#anchor` an `id` in
that file. A link that leaves the book (`../../crates/...` from a page) must name a file of the
repository, resolved from the page's Markdown source in docs/. No network.

    scripts/check-links.py [BOOK_DIR]     # default target/book
"""

import html.parser
import pathlib
import sys
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) is not None:
                self.links.append(a[key])


def parse(path, cache={}):
    if path not in cache:
        p = Page()
        p.feed(path.read_text(encoding="utf-8", errors="replace"))
        cache[path] = p
    return cache[path]


def main():
    book = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "target" / "book").resolve()
    if not (book / "index.html").is_file():
        sys.exit(f"check-links: no built book at {book} (run mdbook build docs)")
    # The pages written from Markdown (mdBook's own print page, search and 404 are skipped:
    # they repeat the pages' links).
    pages = [p for p in book.rglob("*.html")
             if p.name not in ("print.html", "404.html", "toc.html")
             and (DOCS / p.relative_to(book).with_suffix(".md")).is_file()
             or p.relative_to(book).as_posix() == "index.html"]
    broken = []
    checked = 0
    for page in sorted(pages):
        for link in parse(page).links:
            url = urllib.parse.urlsplit(link)
            if url.scheme or link.startswith("//") or link.startswith("mailto:"):
                continue
            path = urllib.parse.unquote(url.path)
            target = (page.parent / path).resolve() if path else page
            checked += 1
            try:
                target.relative_to(book)
            except ValueError:
                # Out of the book: a file of the repository, from the Markdown source's place.
                source = DOCS / page.relative_to(book).with_suffix(".md")
                repo_target = (source.parent / path).resolve()
                if not repo_target.exists():
                    broken.append(f"{page.relative_to(book)}: {link} (no such file in the repository)")
                continue
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(book)}: {link} (no such file)")
                continue
            if url.fragment and target.suffix == ".html":
                if urllib.parse.unquote(url.fragment) not in parse(target).ids:
                    broken.append(f"{page.relative_to(book)}: {link} (no #{url.fragment} there)")
    for b in broken:
        print(f"check-links: broken: {b}", file=sys.stderr)
    print(f"check-links: {len(pages)} pages, {checked} relative links, {len(broken)} broken")
    print(f"links: {checked - len(broken)} passed, {len(broken)} failed")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
