# fxpilot — the two commands of the README: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
SCENARIO ?= nominal
DEMO_PACKAGES := fonts-noto-cjk libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 fontconfig redis-server
TEST_PACKAGES := $(DEMO_PACKAGES) poppler-utils libnss3-tools openssh-server openssh-client chromium gettext iproute2 util-linux
PYTEST_ARGS ?=

.PHONY: demo test venv system-demo system-test lint clean

$(VENV)/.installed: requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	@touch $@

venv: $(VENV)/.installed

system-demo:
	@scripts/system-packages $(DEMO_PACKAGES)

system-test:
	@scripts/system-packages $(TEST_PACKAGES)

demo: system-demo venv
	$(PY) manage.py demo --scenario $(SCENARIO)

test: system-test venv
	$(PY) -m pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

clean:
	-$(PY) manage.py broker stop 2>/dev/null
	rm -rf var/ .pytest_cache
