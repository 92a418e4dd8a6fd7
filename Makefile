# `make lab`: set up .venv and open the workbook.  `make test`: set up .venv and run every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU setup by default; GPU users: `make setup CONSTRAINTS=` keeps the CUDA torch/triton pip picks.
CONSTRAINTS ?= constraints-cpu.txt

.PHONY: setup lab test chromium
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test]'
	touch $@

lab: setup
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) notebooks/

test: setup chromium
	$(BIN)/python -m pytest tests notebooks --nbval --nbval-current-env

# The browser tests drive Debian's Chromium (never a downloaded browser). As root on Debian, install it;
# elsewhere they are skipped with a message (in CI they fail instead).
chromium:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: no /usr/bin/chromium; install Debian's chromium to run tests/test_browser.py"; fi; }
