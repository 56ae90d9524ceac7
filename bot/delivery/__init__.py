"""Delivery: one owner of a chat turn's life, platform-free."""
