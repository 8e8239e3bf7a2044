-- pgtaskd schema, version 23: the daemons connected say which handler runs each queue they
-- serve, so that two daemons that would run one queue's tasks differently are seen.
--
-- `pgtaskd.daemons.handlers` is parallel to `queues`: the k-th entry is how the daemon runs
-- the k-th queue: `text-stats`, or `exec:` / `http:` followed by a fingerprint of the command
-- or the URL (eight hex digits of a hash: the URL itself may carry a key, and is not
-- written). NULL for a daemon of schema 21 or 22, which did not say.
--
-- A daemon that would run a queue with the built-in text-stats (it has no `[queues.NAME]`
-- section) while a live daemon runs that queue with a handler of its own refuses to start:
-- it would mark the queue's tasks SUCCEEDED with word counts and never run their work. Other
-- differences (another command, another handler) are logged by each daemon that sees them,
-- as a rolling change of a queue's handler goes through them.

ALTER TABLE pgtaskd.daemons ADD COLUMN handlers text[];

COMMENT ON COLUMN pgtaskd.daemons.handlers IS
    'pgtaskd: how the daemon runs each of its queues (parallel to queues): text-stats, exec:FINGERPRINT or http:FINGERPRINT';
