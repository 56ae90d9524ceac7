"""`make bench`: runs every benchmark of this folder, each in a process of its own (clean memory
figures, and spawn-based helpers find their module), and prints its table."""

import subprocess
import sys

failed = []
for name in ("bench.indexing", "bench.retrieval", "bench.turn", "bench.gate", "bench.streaming", "bench.confluence",
             "bench.load", "bench.workers"):
    print(f"== {name}", flush=True)
    if subprocess.run([sys.executable, "-m", name, *sys.argv[1:]]).returncode != 0:
        failed.append(name)
if failed:
    sys.exit(f"failed: {', '.join(failed)}")
