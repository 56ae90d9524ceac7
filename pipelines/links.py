"""Which links an answer may carry, judged on what the renderers make of its Markdown.

A planted document can talk the model into writing a link of its choosing (phishing in the bot's
name), so an answer keeps only links to the hosts of its own sources. Whether a piece of text is a
link, and where it leads, is what a renderer decides, not a pattern: markdown-it (the reference
CommonMark parser, as the HTTP API's chat clients and Slack read Markdown) turns
``[b](<https://evil.example/a b>)``, ``[c](https&#58;//evil.example/x)``, ``[d](https:\\/\\/evil.example/x)``,
``[e](//evil.example/x)`` and a reference definition ``[1]: <https://evil.example/a b>`` into links, and
Telegram's renderer (``telegramify_markdown``, CommonMark too) makes ``text_link`` entities of them.
So the links are found by parsing (markdown-it's own link, image and autolink rules, recording
where each sits in the text), judged on the destination the parser decoded, and removed at that
spot; a link written as a bare URL (Telegram and most chat clients link those) is judged on the text
as rendered, with character references and escapes decoded; raw HTML on the URLs its tags lead to or
load (every URL-carrying attribute: ``href``, ``src``, ``srcset``, ``data``, ``poster``, ``action``,
``formaction``, ``background``, ``xlink:href``, a meta refresh, CSS ``url()``, …): an inline tag goes,
its text stays. What still renders as a forbidden link after that (a construct whose spot could not be
found, an HTML block) costs its block: the lines are replaced by ``[link removed]``.

A link is allowed only when it is an absolute ``http``/``https`` URL whose host is one of the
allowed hosts, read the way a browser reads it: other schemes (``javascript:``, ``data:``,
``mailto:``), scheme-relative (``//host``) and relative links are refused, and so is a host hidden
behind user info (``https://ok.example@evil.example``), a backslash or percent-encoding.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urlsplit

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline, autolink, image, link
from markdown_it.token import Token

REMOVED = "[link removed]"

# Slack's ``<url|text>`` (and ``<url>``): Slack renders it as a link, CommonMark as an autolink.
_SLACK_LINK = re.compile(r"<(https?://[^\s|>]+)(?:\|([^>\n]{0,500}))?>", re.I)
# Slack's mentions and commands (``<!here>``, ``<@U123>``, ``<#C123|x>``, ``<!subteam^S1|@team>``): the
# adapters defuse them; as Markdown the ones with an "@" read as e-mail autolinks, never web links.
_SLACK_SPECIAL = ("<!", "<@", "<#")
# A URL written out: chat clients (Telegram, Slack, GFM renderers) link these by themselves.
_BARE_URL = re.compile(r"(?<![\w/.-])(?:https?://|www\.)[^\s<>()\[\]{}\"'`|\\]+", re.I)
_TRAILING = ".,;:!?*_~"
# Where a URL's authority ends; what may not be in it for the host to be read one way only.
_AUTHORITY_END = re.compile(r"[/?#]")
_HIDDEN_HOST = re.compile(r"[@\\%\s\x00-\x1f\x7f]")
# ``- ``, ``1. ``, ``> `` before a line's text: kept when the line is replaced, so the list or quote stays.
_CONTAINER_PREFIX = re.compile(r"^(?:[ \t]*(?:>[ \t]?|[-+*][ \t]+|\d{1,9}[.)][ \t]+))*")
# Attributes a browser loads or follows as a URL (HTML, SVG, MathML); the lists of them (``srcset``); and an
# animation's values, which set another attribute (``<set attributeName="href" to="…">``).
_URL_ATTRIBUTES = frozenset({
    "href", "src", "action", "formaction", "data", "poster", "background", "cite", "codebase", "longdesc",
    "lowsrc", "dynsrc", "usemap", "manifest", "icon", "ping", "profile", "classid", "archive", "itemtype",
    "xlink:href", "xml:base"})
_URL_LIST_ATTRIBUTES = frozenset({"srcset", "imagesrcset"})
_ANIMATION_VALUES = ("from", "to", "values", "by")
# ``<meta http-equiv="refresh" content="0; url=…">``; CSS's ``url(…)`` in a style attribute or element.
_REFRESH_URL = re.compile(r"""url\s*=\s*['"]?([^'"\s;]*)""", re.I)
_CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]*)""", re.I)
# Nothing here can make a link or hide one: the common case skips the parser.
_LINK_SIGNS = ("](", "]:", "<", "://", "&", "\\", "www.")


def web_link_host(url: str) -> str | None:
    """The host an absolute ``http(s)`` link leads to, lower-cased; None for any other link."""
    # Browsers drop tabs and newlines anywhere in a URL and blanks or controls around it.
    url = re.sub(r"[\t\n\r]", "", url).strip("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0b\x0c\x0e\x0f\x10\x11"
                                              "\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f ")
    scheme = re.match(r"https?://", url, re.I)
    if scheme is None:
        return None
    authority = _AUTHORITY_END.split(url[scheme.end():], maxsplit=1)[0]
    if not authority or _HIDDEN_HOST.search(authority):
        return None
    try:
        host = urlsplit("http://" + authority).hostname
    except ValueError:
        return None
    return host.rstrip(".").lower() if host else None


def link_allowed(url: str, allowed_hosts: set[str]) -> bool:
    """Whether ``url`` is an absolute http(s) link to one of ``allowed_hosts`` (lower-case names)."""
    host = web_link_host(url)
    return host is not None and host in allowed_hosts


def link_host(url: str) -> str | None:
    """The host of a source's URL or path (None for a file); a bare ``www.`` name counts as http."""
    try:
        host = urlsplit(url if "://" in url else "http://" + url).hostname
    except ValueError:
        return None
    return host.rstrip(".").lower() if host else None


def _bare_url_allowed(url: str, allowed: set[str]) -> bool:
    url = url.rstrip(_TRAILING)
    return link_allowed(url if "://" in url else "http://" + url, allowed)


# --- the parser ---------------------------------------------------------------------------------
def _recording(rule: Any) -> Any:
    """markdown-it's inline ``rule``, noting on the link or image token it makes where in the
    block's text the whole construct lies (``meta["span"]``) and where its label does (``meta["label"]``)."""

    def run(state: StateInline, silent: bool) -> bool:
        start, count = state.pos, len(state.tokens)
        if not rule(state, silent):
            return False
        if not silent:
            for token in state.tokens[count:]:
                if token.type in ("link_open", "image"):
                    token.meta["span"] = (start, state.pos)
                    token.meta["label"] = _label_span(state, start, token)
                    break
        return True

    return run


def _label_span(state: StateInline, start: int, token: Token) -> tuple[int, int] | None:
    if token.markup == "autolink":
        return None
    opening = start + 1 if token.type == "image" else start  # ``![`` / ``[``
    saved = state.pos
    end = state.md.helpers.parseLinkLabel(state, opening, token.type == "link_open")
    state.pos = saved
    return (opening + 1, end) if end >= 0 else None


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"inline_definitions": True}).enable(["table", "strikethrough"])
    # Every link construct must show up, including those markdown-it would not render (javascript:):
    # other renderers (Telegram's) do render them.
    md.validateLink = lambda url: True  # type: ignore[method-assign]
    for name, rule in (("link", link), ("image", image), ("autolink", autolink)):
        md.inline.ruler.at(name, _recording(rule))
    return md


_MD = _parser()


@dataclass
class _Finding:
    """A forbidden link as parsed: its destination and the lines of its block; ``source`` is the
    construct's own text when it can be looked for there (then ``replacement`` takes its place), and
    ``definition`` marks a reference definition (its lines go)."""

    url: str
    lines: tuple[int, int]
    source: str | None = None
    replacement: str = REMOVED
    definition: bool = False


def _inline_findings(block: Token, allowed: set[str]) -> Iterator[_Finding]:
    lines = (block.map[0], block.map[1]) if block.map else (0, 0)
    for child in block.children or []:
        if child.type in ("link_open", "image"):
            url = str(child.attrs.get("href" if child.type == "link_open" else "src") or "")
            if link_allowed(url, allowed):
                continue
            span, label = child.meta.get("span"), child.meta.get("label")
            source = block.content[span[0]:span[1]] if span else None
            if source and source.startswith(_SLACK_SPECIAL):
                continue
            if label:
                text = block.content[label[0]:label[1]]
            elif source and url.lower().startswith("mailto:"):  # an e-mail address: shown, not linked
                text = source[1:-1]
            else:
                text = REMOVED
            yield _Finding(url, lines, source, text)
        elif child.type == "text":  # as rendered: "https&#58;//evil.example" reads as a URL here
            for match in _BARE_URL.finditer(child.content):
                url = match.group(0).rstrip(_TRAILING)
                if not _bare_url_allowed(url, allowed):
                    yield _Finding(url, lines, source=url)  # found as written, or its block goes
        elif child.type == "html_inline":  # one tag: it goes, the text around it stays
            yield from _html_findings(child.content, lines, allowed, source=child.content)


class _Tags(HTMLParser):
    """The URLs the tags of a piece of HTML lead to or load, as a browser reads them (values decoded)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        animation = values.get("attributename", "").lower() in _URL_ATTRIBUTES
        for name, value in values.items():
            if name in _URL_ATTRIBUTES:
                self.urls.append(value)
            elif name in _URL_LIST_ATTRIBUTES:
                self.urls += [c.split()[0] for c in value.split(",") if c.strip()]
            elif animation and name in _ANIMATION_VALUES:
                self.urls += value.split(";")
            elif name == "content" and tag == "meta":
                self.urls += _REFRESH_URL.findall(value)


def _html_findings(markup: str, lines: tuple[int, int], allowed: set[str],
                   source: str | None = None) -> Iterator[_Finding]:
    tags = _Tags()
    tags.feed(markup)
    tags.close()
    decoded = html.unescape(markup)
    urls = [u for u in tags.urls + _CSS_URL.findall(decoded) if not link_allowed(u, allowed)]  # style too
    urls += [u for m in _BARE_URL.finditer(decoded) if not _bare_url_allowed(u := m.group(0).rstrip(_TRAILING), allowed)]
    for url in urls:
        yield _Finding(url, lines, source, replacement="")


def _findings(text: str, allowed: set[str]) -> list[_Finding]:
    env: dict[str, Any] = {}
    found: list[_Finding] = []
    for token in _MD.parse(text, env):
        if token.type == "inline":
            found.extend(_inline_findings(token, allowed))
        elif token.type == "definition" and token.map:
            url = str(token.meta.get("url") or "")
            if not link_allowed(url, allowed):
                found.append(_Finding(url, (token.map[0], token.map[1]), definition=True))
        elif token.type == "html_block" and token.map:
            found.extend(_html_findings(token.content, (token.map[0], token.map[1]), allowed))
    return found


# --- removing ------------------------------------------------------------------------------------
def _replace_in_lines(text: str, finding: _Finding) -> str | None:
    """``text`` with the finding's construct replaced within its block's lines; None when its text
    is not found there (it spans lines of a list or quote, whose markers the parser left out)."""
    if finding.source is None:
        return None
    lines = text.split("\n")
    start, end = finding.lines
    block = "\n".join(lines[start:end])
    at = block.find(finding.source)
    if at < 0:
        return None
    block = block[:at] + finding.replacement + block[at + len(finding.source):]
    return "\n".join(lines[:start] + [block] + lines[end:])


def _drop_lines(text: str, lines: tuple[int, int], *, marker: bool = True) -> str:
    """``text`` with the given lines replaced by one ``[link removed]`` line (keeping its list or
    quote marker), or left out (a reference definition, which shows nothing anyway)."""
    rows = text.split("\n")
    start, end = lines
    if start >= len(rows):
        return text
    replacement = []
    if marker:
        replacement = [_CONTAINER_PREFIX.match(rows[start]).group(0) + REMOVED]  # type: ignore[union-attr]
    return "\n".join(rows[:start] + replacement + rows[max(end, start + 1):])


def _remove_parsed_links(text: str, allowed: set[str], removed: list[str]) -> str:
    """Removes the forbidden links the parser finds, one at a time, until there is none left."""
    for _ in range(200):  # each round removes one link or at least one line; a bound all the same
        found = _findings(text, allowed)
        if not found:
            return text
        # A definition first: without it its uses (``[1]``, a citation marker too) are no links.
        finding = next((f for f in found if f.definition), found[0])
        removed.append(finding.url)
        if finding.definition:
            text = _drop_lines(text, finding.lines, marker=False)
            continue
        replaced = _replace_in_lines(text, finding)
        text = replaced if replaced is not None and replaced != text else _drop_lines(text, finding.lines)
    return REMOVED


def restrict_links(text: str, allowed_hosts: set[str]) -> tuple[str, list[str]]:
    """``text`` with every link that does not lead to one of ``allowed_hosts`` (the hosts of the
    answer's sources) removed, keeping a Markdown link's text; and the URLs removed."""
    allowed = {h.rstrip(".").lower() for h in allowed_hosts}
    removed: list[str] = []
    if not any(sign in text.lower() for sign in _LINK_SIGNS):
        return text, removed

    def slack_link(m: re.Match[str]) -> str:
        if _bare_url_allowed(m.group(1), allowed):
            return m.group(0)
        removed.append(m.group(1))
        return m.group(2) or REMOVED

    def bare_url(m: re.Match[str]) -> str:
        url = m.group(0)
        kept = url.rstrip(_TRAILING)
        if _bare_url_allowed(kept, allowed):
            return url
        removed.append(kept)
        return REMOVED + url[len(kept):]

    text = _SLACK_LINK.sub(slack_link, text)
    text = _remove_parsed_links(text, allowed, removed)
    text = _BARE_URL.sub(bare_url, text)
    text = _remove_parsed_links(text, allowed, removed)  # what the written-out URLs' removal may have revealed
    return text, removed
