"""`make bench`: runs every benchmark of this folder and prints its table."""

import runpy
import sys

for name in ("bench.indexing", "bench.retrieval", "bench.turn", "bench.streaming"):
    print(f"== {name}", flush=True)
    sys.argv = [name]
    runpy.run_module(name, run_name="__main__")
