"""The console: ``kbbot ask`` and ``make demo``'s terminal conversation, answers streamed as they come."""
