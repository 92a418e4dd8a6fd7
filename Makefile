# `make lab`: set up .venv and open the workbook.  `make test`: set up .venv and run every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Which torch goes into .venv (README, "Two commands"): auto (a CUDA build where nvidia-smi lists a GPU, else the
# CPU pins), cpu, cuda, or system (a venv that sees $(PYTHON)'s site-packages, keeping the torch found there).
TORCH ?= auto
BUILD := $(shell $(PYTHON) tools/torch_build.py $(TORCH))
ifeq ($(BUILD),)
$(error no torch build chosen for TORCH=$(TORCH) with PYTHON=$(PYTHON): see the message above)
endif
VENV_FLAGS_system := --system-site-packages
CONSTRAINTS_cpu := constraints-cpu.txt
CONSTRAINTS_cuda := constraints-cuda.txt
CONSTRAINTS_system := constraints.txt
# Where PyPI has no CUDA wheel for the platform, the cuda build stops here rather than leave the kernels to
# Triton's interpreter.
CHECK_cuda := $(BIN)/python -c 'import sys, torch; torch.version.cuda or sys.exit("pip installed torch " \
  + torch.__version__ + ", a build without CUDA: install a CUDA build of torch, then use TORCH=system")'
STAMP := $(VENV)/.installed-$(BUILD)

.PHONY: setup lab test chromium
setup: $(STAMP)

# The stamp names the build the venv was made for. A venv made for another build is cleared and made again: pip
# would keep its torch, which satisfies the same requirement. Older Makefiles' `.installed` counts as cpu (their
# default), so a CPU venv is updated in place.
OTHER_STAMPS = $(filter-out $@ $(if $(filter cpu,$(BUILD)),$(VENV)/.installed),$(wildcard $(VENV)/.installed*))
$(STAMP): pyproject.toml constraints.txt $(CONSTRAINTS_$(BUILD))
	$(PYTHON) -m venv $(VENV_FLAGS_$(BUILD)) $(if $(OTHER_STAMPS),--clear) $(VENV)
	$(BIN)/python -m pip install --quiet $(addprefix -c ,$(CONSTRAINTS_$(BUILD))) -e '.[test]'
	$(CHECK_$(BUILD))
	$(BIN)/python -m preshuffle --version
	touch $@

# Jupyter also reads tools/jupyter_server_config.py, which saves every notebook with canonical metadata.
lab: setup
	JUPYTER_CONFIG_PATH=$(CURDIR)/tools$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH} \
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
