"""Credentials out of what people see: a service URL shown without its password, an error text
without the secrets of the URL it came from. (Logs are masked once more by ``bot.logs.SecretMasker``.)"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit


def redact_url(url: str) -> str:
    """``url`` with any password (in the authority or a ``password=`` query) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in pairs], safe="*")
        # Built by hand: urlunsplit drops the empty authority of ``unix:///path``.
        shown = f"{parts.scheme}://{netloc}{parts.path}"
        return shown + (f"?{query}" if query else "") + (f"#{parts.fragment}" if parts.fragment else "")
    except ValueError:
        return "<unparseable URL>"


def _secrets_of(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.password] if parts.password else []
    found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password" and v]
    return found


def scrub(text: str, url: str) -> str:
    """``text`` (an error message) with the secrets of ``url`` replaced by ``***``."""
    for secret in _secrets_of(url):
        text = text.replace(secret, "***")
    return text
