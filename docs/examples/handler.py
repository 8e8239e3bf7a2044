#!/usr/bin/env python3
"""A pgtaskd `exec` handler in Python.

The payload arrives on stdin: a JSON object {"text": "...", "shout": false}. The answer,
written to stdout, is a JSON object with the text's word count (and the text in capitals
when asked). What goes to stderr is for people: its last 4 KiB become the task's error if
the attempt fails.

    exit 0    done: stdout is the task's output (valid UTF-8, at most max_output bytes)
    exit 65   the payload is bad: the task FAILS at once, no retry (EX_DATAERR)
    other     the attempt failed: retried after the queue's backoff while attempts remain

[queues.words]
handler = "exec"
command = ["/usr/local/lib/pgtaskd/handler.py"]
"""

import json
import os
import signal
import sys

EX_DATAERR = 65


def on_term(_signum, _frame):
    # A timeout or a cancel: pgtaskd sends SIGTERM to the process group, then SIGKILL
    # kill_after later. Clean up and end; the attempt is not counted as done.
    print("stopping: SIGTERM", file=sys.stderr)
    sys.exit(143)


def main():
    signal.signal(signal.SIGTERM, on_term)
    task = os.environ["PGTASKD_TASK_ID"]
    attempt = int(os.environ["PGTASKD_ATTEMPT"])
    # The same for every attempt of this task: the idempotency key to give any side effect
    # (an API call, a row written elsewhere), so that the task's work is applied once
    # however often it runs.
    key = os.environ["PGTASKD_TASK_KEY"]
    # Every start of the task's work counts; above 1, a run before this one may have done
    # some of it (a failed attempt, a lost lease, a shutdown that stopped it).
    run = int(os.environ["PGTASKD_RUN"])
    print(f"task {task}, attempt {attempt}, run {run}, key {key}", file=sys.stderr)

    try:
        payload = json.loads(sys.stdin.buffer.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        print(f"the payload is not JSON: {error}", file=sys.stderr)
        return EX_DATAERR
    text = payload.get("text") if isinstance(payload, dict) else None
    if not isinstance(text, str):
        print('the payload has no "text" string', file=sys.stderr)
        return EX_DATAERR

    answer = {"task": int(task), "words": len(text.split())}
    if payload.get("shout"):
        answer["text"] = text.upper()
    json.dump(answer, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
