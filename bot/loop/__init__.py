"""The knowledge loop: what happens after a refresh changed the knowledge, and where gaps go.

- ``changes``: what one refresh changed (``KnowledgeChanges``), as its hooks receive it;
- ``recheck``: approved answers whose sources changed are answered again and held for a reviewer;
- ``golden``: the golden set (``config/golden.yaml``) replayed, its last result kept for every replica;
- ``owners``: who owns the document nearest to each gap (the weekly digest's lists per owner);
- ``hook``: ``KnowledgeLoop.after_refresh``, the one function a refresh calls.
"""
