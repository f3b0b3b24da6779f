"""Stands in for `python -m oscar_zoo.calibrate.runner JOB.json OUT_DIR` in the worker tests:
the same event protocol and SIGTERM handling (SIGTERM -> a stop asked -> {"event": "cancelled"},
exit 3 at the next step), without loading a model."""

import json
import os
import signal
import sys
import time

events = os.fdopen(os.dup(1), "w", buffering=1)
stop = {"asked": False}
signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
for i in range(10_000):
    if stop["asked"]:
        events.write(json.dumps({"event": "cancelled"}) + "\n")
        sys.exit(3)
    events.write(json.dumps({"event": "progress", "phase": "pass1", "done": i, "total": 10_000,
                             "layer": i % 30}) + "\n")
    time.sleep(0.1)
