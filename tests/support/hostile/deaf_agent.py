"""A hostile stream-json agent that never reads its stdin: it says it started, then ends a turn
every 20 ms (a Claude Code result line), forever, so prompts keep being accepted and written."""

import json
import time

print(json.dumps({"type": "system", "subtype": "init", "session_id": "deaf", "tools": []}))
result = {"type": "result", "subtype": "success", "is_error": False, "stop_reason": "end_turn"}
while True:
    print(json.dumps(result), flush=True)
    time.sleep(0.02)
