# `make lab`: set up .venv and open the workbook.  `make test`: set up .venv and run every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU setup by default; GPU users: `make setup CONSTRAINTS=` keeps the CUDA torch/triton pip picks.
CONSTRAINTS ?= constraints-cpu.txt

.PHONY: setup lab test
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test]'
	touch $@

lab: setup
	$(BIN)/jupyter lab notebooks/

test: setup
	$(BIN)/python -m pytest tests notebooks --nbval --nbval-current-env
