# herdfence — `make up` runs the embedded stack, `make test` runs the whole suite.
# Both begin with `make setup`, which installs only what is missing (idempotent, fast when done).
PY      ?= $(shell command -v python3.11 || command -v python3)
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.herdfence-installed
UI_DIR  := api/ui

.PHONY: setup up test test-fast demo clean system-packages venv ui-assets

setup: system-packages venv ui-assets

system-packages:
	@missing=""; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	command -v redis-cli >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	command -v wrk >/dev/null 2>&1 || missing="$$missing wrk"; \
	$(PY) -c "import ensurepip, venv" >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "setup: installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(BIN)/python:
	@$(PY) -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null || { echo "setup: Python 3.11 is required"; exit 1; }
	$(PY) -m venv $(VENV)

# the runtime (requirements.lock, all the images install) and the test and bench extras' pins
LOCKS   := requirements.lock requirements-test.lock requirements-bench.lock

# uv installs the pinned locks in less than half of pip's time (it links from its cache). Bytecode is
# compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set no process would ever write it,
# and each would compile pandas, pyspark... again. It is compiled on both cores while the class archive
# (deploy/jvm_archive.py, one core, ~25-45 s) is dumped; a file that does not compile is left to its
# import, as uv leaves it. pip stays the fallback.
UV_VERSION := 0.13.9

$(STAMP): $(BIN)/python $(LOCKS) pyproject.toml
	@if $(BIN)/pip install -q uv==$(UV_VERSION); then \
	  $(BIN)/uv pip install -q --python $(BIN)/python $(addprefix -r ,$(LOCKS)) && \
	  $(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e . && \
	  { $(BIN)/python -m deploy.jvm_archive & archive=$$!; \
	    $(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
	      >/dev/null || true; wait $$archive; }; \
	else \
	  $(BIN)/pip install -q $(addprefix -r ,$(LOCKS)) && $(BIN)/pip install -q --no-deps -e .; \
	fi
	@touch $(STAMP)

# the project's bytecode (what changed since), pyspark.zip with bytecode, and the class archive the
# Spark JVM starts from (deploy/jvm_archive.py: built once, ~45 s; a JVM start then costs 6 core-s, not 13)
venv: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 ingest fencing api deploy loadgen
	@$(BIN)/python -m deploy.pyspark_bytecode
	@$(BIN)/python -m deploy.jvm_archive

$(UI_DIR)/node_modules/.installed: $(UI_DIR)/package.json
	cd $(UI_DIR) && npm install --no-audit --no-fund --loglevel=error
	@touch $@

ui-assets: $(UI_DIR)/node_modules/.installed

up: setup
	$(BIN)/herdfence up

# the whole suite as two runs side by side (tests/suite.py): the shared stack's, and the disposable and
# cluster stacks' (tests/conftest.py orders each)
test: setup
	$(BIN)/python -m tests.suite

# the edit loop: unit tests and the flows on one stack
test-fast: setup
	$(BIN)/python -m pytest -q tests/unit tests/stack/test_flow.py

demo: setup
	$(BIN)/herdfence demo

clean:
	-$(BIN)/herdfence down
	rm -rf .herdfence
