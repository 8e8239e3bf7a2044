// An endpoint for a pgtaskd queue with `handler = "http"`, on node's own http module (no
// npm packages). Run it with `node docs/examples/endpoint.js` (PORT=8080 by default; PORT=0
// takes any free port), and point the queue's `url` at http://127.0.0.1:8080/tasks.
//
// pgtaskd posts each task's payload as the body (text/plain; charset=utf-8) with
// Pgtaskd-Task-Id, Idempotency-Key (the task's key, the same for every attempt),
// Pgtaskd-Attempt, Pgtaskd-Run, Pgtaskd-Queue, Pgtaskd-Claim and, when the task has them,
// Pgtaskd-Idempotency-Key and traceparent. What this endpoint answers decides the attempt:
//
//   200 and a body   the task SUCCEEDED; the body is its output
//   422              the task FAILED at once: retrying cannot help (an empty payload here)
//   503 Retry-After  the attempt failed; pgtaskd tries again after that many seconds
//
// The work here is a stand-in: it counts the payload's words. A real endpoint would send
// the mail, charge the card... once per Idempotency-Key: pgtaskd may post a task again (a
// failed attempt, a timeout, a lost connection, a daemon restart), and the key, the same on
// every post of one task, says which task a post is.

"use strict";

const http = require("node:http");

// Answers already given, by Idempotency-Key: a repeated post gets the same answer without
// doing the work twice. (In memory for the example; a real endpoint keeps them in its
// database, in the same transaction as the work's effects.)
const done = new Map();

// Set BUSY=1 to see pgtaskd's retries: every post answers 503 with Retry-After.
const busy = process.env.BUSY === "1";

const server = http.createServer((req, res) => {
  if (req.method !== "POST" || req.url !== "/tasks") {
    res.writeHead(404, { "Content-Type": "text/plain" });
    res.end("POST /tasks only\n");
    return;
  }
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const payload = Buffer.concat(chunks).toString("utf8");
    const key = req.headers["idempotency-key"];
    const task = req.headers["pgtaskd-task-id"];
    const attempt = req.headers["pgtaskd-attempt"];
    const queue = req.headers["pgtaskd-queue"];

    if (busy) {
      res.writeHead(503, { "Content-Type": "text/plain", "Retry-After": "5" });
      res.end("busy, come back in 5 seconds\n");
      return;
    }
    if (payload.trim() === "") {
      res.writeHead(422, { "Content-Type": "text/plain" });
      res.end(`task ${task}: the payload is empty\n`);
      return;
    }
    if (!done.has(key)) {
      const words = payload.split(/\s+/).filter((word) => word !== "").length;
      done.set(key, `task ${task} (queue ${queue}, attempt ${attempt}): ${words} words`);
    }
    res.writeHead(200, { "Content-Type": "text/plain; charset=utf-8" });
    res.end(done.get(key));
  });
});

server.listen(Number(process.env.PORT ?? 8080), "127.0.0.1", () => {
  const { address, port } = server.address();
  console.log(`listening on http://${address}:${port}/tasks`);
});
