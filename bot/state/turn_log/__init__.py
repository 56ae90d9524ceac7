"""The turn log: every turn recorded (what was asked, where, the outcome, what was cited), in SQLite or Redis."""
