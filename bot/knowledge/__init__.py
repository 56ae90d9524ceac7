"""Knowledge kept fresh, and its loop: refresh and its schedule (``refresh``, ``scheduler``), the knowledge loop
(``loop``: gaps answered, approvals re-checked, expert replies, the golden set), insights (``insights``: the
report and the weekly digest) and ``kbbot status`` (``status``)."""
