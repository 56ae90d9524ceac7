"""The Teams app package: the manifest filled with the bot's app id, and its two icons, zipped for upload
(Teams admin center, or "Upload a custom app" in Teams).

    uv run python -m adapters.teams.manifest --app-id <TEAMS_APP_ID> [--name kbbot] [--out kbbot-teams.zip]

The manifest (schema 1.25) declares the bot in personal chats, teams and group chats, its commands, and
the resource-specific permissions kbbot uses, granted by the team's or chat's owner at install:
``ChannelMessage.Read.Group`` (a reply chain's messages without an @mention: follow-ups and experts'
replies), ``ChannelMember.Read.Group`` (a private channel's roster: who may read an answer there) and
``ChatMember.Read.Chat`` (a group chat's); ``supportsChannelFeatures`` lets it into private and shared
channels.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import uuid
import zipfile
import zlib
from pathlib import Path
from typing import Any

SCHEMA = "https://developer.microsoft.com/json-schemas/teams/v1.25/MicrosoftTeams.schema.json"
#: The commands Teams offers in its compose box (what kbbot reads as commands: adapters/teams/platform.py).
COMMANDS = [("help", "What I answer and how"), ("new", "Start a new conversation here"),
            ("prefs", "How I answer you: concise, detailed, language"), ("status", "Knowledge status (admins)"),
            ("refresh", "Refresh a source now (admins)")]
PERMISSIONS = ["ChannelMessage.Read.Group", "ChannelMember.Read.Group", "ChatMember.Read.Chat"]


def manifest(app_id: str, *, name: str = "kbbot", developer: str = "kbbot", website: str = "https://example.com",
             privacy: str = "https://example.com/privacy", terms: str = "https://example.com/terms",
             version: str = "1.0.0") -> dict[str, Any]:
    """The manifest of the app whose bot is ``app_id`` (the Azure Bot's Microsoft App ID, ``TEAMS_APP_ID``).
    The Teams app's own id is derived from it, so the same bot always makes the same app."""
    str(uuid.UUID(app_id))  # a GUID, or ValueError
    scopes = ["personal", "team", "groupChat"]
    return {
        "$schema": SCHEMA, "manifestVersion": "1.25", "version": version,
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"kbbot-teams-app:{app_id}")),
        "developer": {"name": developer, "websiteUrl": website, "privacyUrl": privacy, "termsOfUseUrl": terms},
        "name": {"short": name[:30], "full": f"{name}: answers from the knowledge base"[:100]},
        "description": {"short": "Answers from the knowledge base, with sources",
                        "full": "Ask in a personal chat, or @mention it in a channel or group chat: it answers "
                                "from the company knowledge base, cites its sources and says so when it does "
                                "not know."},
        "icons": {"outline": "outline.png", "color": "color.png"}, "accentColor": "#2F5597",
        "bots": [{"botId": app_id, "scopes": scopes, "isNotificationOnly": False, "supportsFiles": False,
                  "supportsCalling": False, "supportsVideo": False,
                  "commandLists": [{"scopes": scopes, "commands": [{"title": t, "description": d}
                                                                   for t, d in COMMANDS]}]}],
        "validDomains": [],
        "webApplicationInfo": {"id": app_id, "resource": f"api://botid-{app_id}"},
        "authorization": {"permissions": {"resourceSpecific": [{"name": p, "type": "Application"}
                                                                for p in PERMISSIONS]}},
        "supportsChannelFeatures": "tier1",
    }


def _png(size: int, rgba: tuple[int, int, int, int], *, ring: bool = False) -> bytes:
    """A square PNG of one colour (``ring``: a white ring on transparency, as Teams' outline icon wants)."""
    rows = []
    for y in range(size):
        row = bytearray([0])
        for x in range(size):
            inside = abs(x - size / 2 + 0.5) < size / 2 - 2 and abs(y - size / 2 + 0.5) < size / 2 - 2
            edge = inside and not (abs(x - size / 2 + 0.5) < size / 2 - 6 and abs(y - size / 2 + 0.5) < size / 2 - 6)
            row += bytes(rgba if (edge if ring else True) else (0, 0, 0, 0))
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows))) \
        + chunk(b"IEND", b"")


def package(app_id: str, **options: Any) -> bytes:
    """The app package: ``manifest.json``, ``color.png`` (192 px) and ``outline.png`` (32 px, white on
    transparency), zipped."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.json", json.dumps(manifest(app_id, **options), indent=2))
        archive.writestr("color.png", _png(192, (47, 85, 151, 255)))
        archive.writestr("outline.png", _png(32, (255, 255, 255, 255), ring=True))
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app-id", required=True, help="the Azure Bot's Microsoft App ID (TEAMS_APP_ID)")
    parser.add_argument("--name", default="kbbot")
    parser.add_argument("--developer", default="kbbot")
    parser.add_argument("--website", default="https://example.com")
    parser.add_argument("--out", default="kbbot-teams.zip")
    args = parser.parse_args()
    Path(args.out).write_bytes(package(args.app_id, name=args.name, developer=args.developer, website=args.website))
    print(f"{args.out}: upload it in Teams (Apps > Manage your apps > Upload an app) or the Teams admin center")


if __name__ == "__main__":
    main()
