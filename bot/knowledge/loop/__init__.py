"""The knowledge loop: what kbbot learns from being used (issue 29).

After a refresh run that added, changed or removed documents, the refresher runs its
``after_change`` hooks with the run's ``RefreshChanges`` (``bot.knowledge.refresh``), once its lock is released:

- ``followups``: the questions it could not answer (or that got a 👎) are answered again, unseen; each
  now answered from the new documents is posted once where it was asked (``GapFollowUps``);
- ``recheck`` and ``hook``: approved answers whose sources changed are answered again and held for a
  reviewer, and the golden set (``golden``, ``config/golden.yaml``) is replayed, its last result kept
  for every replica (``KnowledgeLoop.after_refresh``).

And apart from refreshes:

- ``expert`` and ``expert_store``: a person's reply in a thread kbbot could not answer (or whose answer got
  a 👎) is kept for the reviewers, whose clicks save it as the approved answer or write it into the
  knowledge base (``insights.capture_source``: a Markdown file, or a Confluence draft page);
- ``owners``: who owns the document nearest to each gap (the weekly digest's lists per owner).
"""
