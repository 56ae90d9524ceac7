"""The knowledge loop: what kbbot learns from being used.

- ``followups``: after a refresh that adds or changes documents, the questions it could not answer (or
  that got a 👎) are answered again, unseen; each now answered from the new documents is posted once
  where it was asked (``GapFollowUps``, a ``Refresher.after_change`` hook).
"""
