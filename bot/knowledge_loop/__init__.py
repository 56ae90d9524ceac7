"""The knowledge loop: what kbbot learns from being used.

- ``followups``: after a refresh that adds or changes documents, the questions it could not answer (or
  that got a 👎) are answered again, unseen; each now answered from the new documents is posted once
  where it was asked (``GapFollowUps``, a ``Refresher.after_change`` hook);
- ``expert`` and ``expert_store``: a person's reply in a thread kbbot could not answer (or whose answer got
  a 👎) is kept for the reviewers, whose clicks save it as the approved answer or write it into the
  knowledge base (``insights.capture_source``: a Markdown file, or a Confluence draft page).
"""
