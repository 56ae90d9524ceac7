"""Microsoft Teams (issue 41): so far its Bot Framework auth (``auth``); the platform comes with the
platform contract of ``bot.platform``."""
