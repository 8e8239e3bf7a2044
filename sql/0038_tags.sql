-- pgtaskd schema, version 38: tags and metadata, to find tasks by (docs/sql.md, "Tags and
-- metadata").
--
-- A producer may set `tags text[]` (at most 16, each `[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}`) and
-- `metadata jsonb` (a JSON object of at most 8 KiB) in its INSERT; the view shows them, and
-- two partial GIN indexes find tasks by them (`tags @> ...`, `metadata @> ...`), which
-- untagged tasks are not in. `pgtaskd.enqueue_graph` takes them too.
--
-- Daemons of schema 37 need not be stopped: no function's signature changes. The indexes are
-- built under the migration's lock on `pgtaskd.tasks` (SHARE: producers' inserts wait); over
-- tasks without tags or metadata they are empty.

ALTER TABLE pgtaskd.tasks
    ADD COLUMN tags text[],
    ADD COLUMN metadata jsonb;
-- At most 16 tags, each a letter or digit then up to 62 of letters, digits and `_.:-` (so that
-- none holds the comma that joins them here); metadata a JSON object of at most 8 KiB. NOT
-- VALID as schema 38 added them (see above).
ALTER TABLE pgtaskd.tasks
    ADD CONSTRAINT tasks_tags_check
        CHECK (pg_catalog.cardinality(tags) OPERATOR(pg_catalog.<=) 16
               AND pg_catalog.array_position(tags, NULL) IS NULL
               AND (pg_catalog.cardinality(tags) OPERATOR(pg_catalog.=) 0
                    OR pg_catalog.array_to_string(tags, ',') OPERATOR(pg_catalog.~)
                       '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}(,[A-Za-z0-9][A-Za-z0-9_.:-]{0,62})*$')) NOT VALID,
    ADD CONSTRAINT tasks_metadata_check
        CHECK (pg_catalog.jsonb_typeof(metadata) OPERATOR(pg_catalog.=) 'object'
               AND pg_catalog.octet_length(metadata::text) OPERATOR(pg_catalog.<=) 8192) NOT VALID;

COMMENT ON COLUMN pgtaskd.tasks.tags IS
    'Labels to find the task by: at most 16, each [A-Za-z0-9][A-Za-z0-9_.:-]{0,62}.';
COMMENT ON COLUMN pgtaskd.tasks.metadata IS
    'Data to find the task by: a JSON object of at most 8 KiB.';

-- The view, with the tags and metadata at the end.
CREATE OR REPLACE VIEW pgtaskd.task_view WITH (security_invoker = true) AS
SELECT s.id, s.queue, t.payload, s.status, s.priority, s.run_at, s.attempt,
       coalesce(s.max_attempts, pgtaskd.queue_max_attempts(s.queue)) AS max_attempts,
       s.cancel_requested, s.words, s.bytes, s.runes, s.error, s.lease_owner,
       s.lease_expires_at, t.created_at, s.started_at, s.finished_at, t.idempotency_key,
       s.claim_token, s.output, t.traceparent,
       coalesce((SELECT x.id FROM pgtaskd.site AS x), 'nosite') || '-' || s.id || '-'
           || (extract(epoch FROM t.created_at) * 1000000)::bigint AS task_key,
       s.runs, s.errors, s.snoozes, s.concurrency_key, t.depends_on, t.on_dep_failure,
       t.tags, t.metadata
  FROM pgtaskd.task_state AS s
 CROSS JOIN LATERAL (SELECT x.payload, x.created_at, x.idempotency_key, x.traceparent,
                            x.depends_on, x.on_dep_failure, x.tags, x.metadata
                       FROM pgtaskd.tasks AS x
                      WHERE x.id = s.id
                     OFFSET 0) AS t;

-- Tasks found by their tags and metadata (schema 38): `tags @> ARRAY[...]`,
-- `metadata @> '{"key": "value"}'`. Untagged tasks are not in them.
CREATE INDEX tasks_tags_idx ON pgtaskd.tasks USING gin (tags) WHERE tags IS NOT NULL;
CREATE INDEX tasks_metadata_idx ON pgtaskd.tasks USING gin (metadata jsonb_path_ops)
    WHERE metadata IS NOT NULL;

-- Insert a whole graph of tasks in one transaction, named by local refs: `graph` is a JSON
-- array of objects {"ref", "payload", and optionally "queue", "priority", "run_at",
-- "max_attempts", "idempotency_key", "concurrency_key", "on_dep_failure", "tags",
-- "metadata" (schema 38), "after"}, where
-- "after" lists refs of the graph (strings) and ids of tasks already there (numbers). Parents
-- are inserted before their children, so each parent's id is the smaller; a cycle is refused
-- naming it (`cycle: a -> b -> a`, each waiting for the next) and nothing is inserted. With
-- the caller's rights: a producer inserts as itself. One row per task: its ref and its id.
CREATE OR REPLACE FUNCTION pgtaskd.enqueue_graph(graph jsonb)
RETURNS TABLE (ref text, task_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n         int;
    ords      jsonb;
    bad       text;
    e_parent  int[];
    e_child   int[];
    first_out int[];
    indegree  int[];
    ready     int[];
    placed    int[] := '{}';
    ids       bigint[];
    node      jsonb;
    u         int;
    v         int;
    i         int;
    head      int := 1;
    walk      int[];
    seen      int[];
    new_id    bigint;
BEGIN
    IF enqueue_graph.graph IS NULL OR jsonb_typeof(enqueue_graph.graph) <> 'array' THEN
        RAISE EXCEPTION 'enqueue_graph: the graph is a JSON array of tasks'
            USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(enqueue_graph.graph);
    IF n = 0 THEN
        RETURN;
    END IF;
    IF n > 100000 THEN
        RAISE EXCEPTION 'enqueue_graph: % tasks, at most 100000 in one graph', n
            USING ERRCODE = '54000';
    END IF;
    -- Each task an object with a ref of its own and a payload.
    SELECT format('task %s: %s', e.ord,
                  CASE WHEN jsonb_typeof(e.node) <> 'object' THEN 'not a JSON object'
                       WHEN jsonb_typeof(e.node -> 'ref') IS DISTINCT FROM 'string'
                            OR e.node ->> 'ref' = '' THEN '"ref" is not a non-empty string'
                       WHEN jsonb_typeof(e.node -> 'payload') IS DISTINCT FROM 'string'
                            THEN '"payload" is not a string'
                       ELSE '"after" is not an array of refs and ids' END)
      INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord)
     WHERE jsonb_typeof(e.node) <> 'object'
        OR jsonb_typeof(e.node -> 'ref') IS DISTINCT FROM 'string' OR e.node ->> 'ref' = ''
        OR jsonb_typeof(e.node -> 'payload') IS DISTINCT FROM 'string'
        OR (e.node ? 'after' AND (jsonb_typeof(e.node -> 'after') <> 'array'
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.node -> 'after') AS a
                        WHERE jsonb_typeof(a) NOT IN ('string', 'number'))))
     ORDER BY e.ord
     LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: %', bad USING ERRCODE = '22023';
    END IF;
    SELECT string_agg(DISTINCT e.node ->> 'ref', ', ') INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) AS e(node)
     GROUP BY e.node ->> 'ref' HAVING count(*) > 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: ref % names two tasks', bad USING ERRCODE = '22023';
    END IF;
    -- ref -> position, 1 to n.
    SELECT jsonb_object_agg(e.node ->> 'ref', e.ord) INTO ords
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord);
    SELECT format('task %s waits for ref %s, which the graph does not name',
                  e.node ->> 'ref', a #>> '{}')
      INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) AS e(node),
           jsonb_array_elements(coalesce(e.node -> 'after', '[]')) AS a
     WHERE jsonb_typeof(a) = 'string' AND NOT ords ? (a #>> '{}')
     LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: %', bad USING ERRCODE = '22023';
    END IF;
    -- The edges between refs, by parent: first_out[u] .. first_out[u + 1] - 1.
    SELECT coalesce(array_agg(x.p ORDER BY x.p, x.c), '{}'),
           coalesce(array_agg(x.c ORDER BY x.p, x.c), '{}')
      INTO e_parent, e_child
      FROM (SELECT DISTINCT (ords ->> (a #>> '{}'))::int AS p, e.ord::int AS c
              FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord),
                   jsonb_array_elements(coalesce(e.node -> 'after', '[]')) AS a
             WHERE jsonb_typeof(a) = 'string') AS x;
    indegree := array_fill(0, ARRAY[n]);
    first_out := array_fill(0, ARRAY[n + 1]);
    FOR i IN 1 .. coalesce(array_length(e_child, 1), 0) LOOP
        indegree[e_child[i]] := indegree[e_child[i]] + 1;
        first_out[e_parent[i]] := first_out[e_parent[i]] + 1;
    END LOOP;
    -- Counts to starts (prefix sums).
    v := 1;
    FOR u IN 1 .. n + 1 LOOP
        i := first_out[u];
        first_out[u] := v;
        v := v + i;
    END LOOP;
    -- Kahn's order, the graph's own order among tasks ready together.
    ready := ARRAY(SELECT g FROM generate_series(1, n) AS g WHERE indegree[g] = 0);
    WHILE head <= coalesce(array_length(ready, 1), 0) LOOP
        u := ready[head];
        head := head + 1;
        placed := placed || u;
        FOR i IN first_out[u] .. first_out[u + 1] - 1 LOOP
            indegree[e_child[i]] := indegree[e_child[i]] - 1;
            IF indegree[e_child[i]] = 0 THEN
                ready := ready || e_child[i];
            END IF;
        END LOOP;
    END LOOP;
    IF coalesce(array_length(placed, 1), 0) < n THEN
        -- Every task left waits for another task left: follow one such edge from each until
        -- a task comes round again.
        u := (SELECT min(g) FROM generate_series(1, n) AS g WHERE indegree[g] > 0);
        seen := array_fill(0, ARRAY[n]);
        walk := '{}';
        WHILE seen[u] = 0 LOOP
            seen[u] := coalesce(array_length(walk, 1), 0) + 1;
            walk := walk || u;
            SELECT min(x.p) INTO u
              FROM unnest(e_parent, e_child) AS x(p, c)
             WHERE x.c = u AND indegree[x.p] > 0;
        END LOOP;
        walk := walk[seen[u]:] || u;
        RAISE EXCEPTION 'cycle: %',
            (SELECT string_agg(enqueue_graph.graph -> (w.o - 1) ->> 'ref', ' -> ' ORDER BY w.k)
               FROM unnest(walk) WITH ORDINALITY AS w(o, k))
            USING ERRCODE = '22023';
    END IF;
    ids := array_fill(NULL::bigint, ARRAY[n]);
    FOREACH u IN ARRAY placed LOOP
        node := enqueue_graph.graph -> (u - 1);
        INSERT INTO pgtaskd.tasks (payload, queue, priority, run_at, max_attempts,
                                   idempotency_key, concurrency_key, on_dep_failure, depends_on,
                                   tags, metadata)
        VALUES (node ->> 'payload',
                coalesce(node ->> 'queue', 'default'),
                coalesce((node ->> 'priority')::smallint, 0),
                coalesce((node ->> 'run_at')::timestamptz, now()),
                (node ->> 'max_attempts')::int,
                node ->> 'idempotency_key',
                node ->> 'concurrency_key',
                node ->> 'on_dep_failure',
                nullif(ARRAY(SELECT CASE WHEN jsonb_typeof(a) = 'string'
                                         THEN ids[(ords ->> (a #>> '{}'))::int]
                                         ELSE (a #>> '{}')::bigint END
                               FROM jsonb_array_elements(coalesce(node -> 'after', '[]')) AS a),
                       '{}'),
                CASE WHEN node ? 'tags' THEN
                    ARRAY(SELECT g #>> '{}' FROM jsonb_array_elements(node -> 'tags') AS g) END,
                node -> 'metadata')
        RETURNING id INTO new_id;
        ids[u] := new_id;
        ref := node ->> 'ref';
        task_id := new_id;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Run as the schema's owner (the role that migrated). A producer inserts the columns a
-- producer chooses, reads, enqueues and cancels; never a status, a lease or a result.
CREATE OR REPLACE FUNCTION pgtaskd.grant_producer(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks, pgtaskd.task_state, pgtaskd.task_view TO %I',
                   role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent, concurrency_key, depends_on, on_dep_failure, tags, metadata) '
                   'ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint) TO %I', role_name);
    -- Graphs of tasks (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue_graph(jsonb) TO %I', role_name);
    -- Which daemons serve which queues (version 21).
    EXECUTE format('GRANT SELECT ON pgtaskd.daemons TO %I', role_name);
    -- The CLI's schema check (version 23).
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations TO %I', role_name);
    -- Which queues are paused, for `pgtaskd stats` (version 26).
    EXECUTE format('GRANT SELECT ON pgtaskd.paused_queues TO %I', role_name);
    -- The schedules (version 31).
    EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %I', role_name);
    -- The queues' limits and defaults (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
END
$$;

-- What `pgtaskd run` and the one-shot commands need; no DDL, no vacuum.
CREATE OR REPLACE FUNCTION pgtaskd.grant_daemon(role_name name) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgtaskd TO %I', role_name);
    -- Claims, finishes, heartbeats, rescues and cancels update state rows, never a task row
    -- (version 36); retention deletes finished tasks with the owner's rights; the CLI and
    -- the HTTP API insert like a producer, and steer queues like an operator; `/metrics` and
    -- `/readyz` read the vacuum health.
    EXECUTE format('GRANT SELECT ON pgtaskd.tasks TO %I', role_name);
    EXECUTE format('GRANT SELECT, UPDATE ON pgtaskd.task_state TO %I', role_name);
    EXECUTE format('GRANT INSERT (queue, payload, priority, run_at, max_attempts, idempotency_key, '
                   'traceparent, concurrency_key, depends_on, on_dep_failure, tags, metadata) '
                   'ON pgtaskd.tasks TO %I', role_name);
    -- The CLI and the HTTP API read tasks' state through the view (version 24).
    EXECUTE format('GRANT SELECT ON pgtaskd.task_view TO %I', role_name);
    EXECUTE format('GRANT SELECT ON pgtaskd.schema_migrations, pgtaskd.paused_queues TO %I',
                   role_name);
    -- Each daemon flags itself idle (version 7).
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgtaskd.idle_daemons TO %I',
                   role_name);
    -- Each daemon records itself, and forgets the long gone (version 21).
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgtaskd.daemons TO %I',
                   role_name);
    -- Each claim takes a token (version 16).
    EXECUTE format('GRANT USAGE ON SEQUENCE pgtaskd.claim_tokens TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.claim(text[], bigint, text, float8, bigint, boolean, bigint, int, bigint), '
                   'pgtaskd.finish(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[], boolean), '
                   'pgtaskd.notify_done(bigint[]), pgtaskd.vacuum_health(), '
                   'pgtaskd.prune(float8, bigint, timestamptz) '
                   'TO %I', role_name);
    -- Heartbeats, rescues, releases and re-reads of claims (version 26).
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.heartbeat(bigint[], bigint[], float8), '
                   'pgtaskd.extend_lease(bigint, bigint, float8), '
                   'pgtaskd.rescue(bigint, text), '
                   'pgtaskd.release(bigint, bigint, boolean), '
                   'pgtaskd.claim_state(bigint, boolean) '
                   'TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.enqueue(text, text, int, timestamptz, int, text), '
                   'pgtaskd.cancel(bigint), pgtaskd.request_cancel(bigint), '
                   'pgtaskd.pause_queue(text), pgtaskd.resume_queue(text), pgtaskd.retry(bigint), '
                   'pgtaskd.retry_failed(text, integer, bigint) '
                   'TO %I', role_name);
    -- A stopping daemon parks the results it cannot write; rescuers write them (version 28).
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON pgtaskd.parked_results TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.park(bigint[], bigint[], text[], bigint[], bigint[], bigint[], text[], text[], float8[]), '
                   'pgtaskd.write_parked(bigint, text) '
                   'TO %I', role_name);
    -- Schedules: read, fired, and steered like queues (version 31).
    EXECUTE format('GRANT SELECT ON pgtaskd.schedules TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION '
                   'pgtaskd.put_schedule(text, text, interval, text, text, text, text, boolean, smallint, boolean), '
                   'pgtaskd.remove_schedule(text), pgtaskd.pause_schedule(text, boolean), '
                   'pgtaskd.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz) '
                   'TO %I', role_name);
    -- Limits: read and set like queues, counted and written by the claim (version 33).
    EXECUTE format('GRANT SELECT ON pgtaskd.queue_settings TO %I', role_name);
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON pgtaskd.queue_starts TO %I', role_name);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.set_queue(text, jsonb), '
                   'pgtaskd.notify_freed(text[]) TO %I', role_name);
    -- Dependencies: each end decides its dependents; graphs, retries with dependents and the
    -- auditor (version 37).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgtaskd.end_parents(bigint[]), '
                   'pgtaskd.enqueue_graph(jsonb), pgtaskd.retry_with_dependents(bigint), '
                   'pgtaskd.check_deps() TO %I', role_name);
END
$$;

-- The roles that insert tasks by column may set tags and metadata.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT c.grantee
          FROM information_schema.column_privileges AS c
         WHERE c.table_schema OPERATOR(pg_catalog.=) 'pgtaskd'
           AND c.table_name OPERATOR(pg_catalog.=) 'tasks'
           AND c.column_name OPERATOR(pg_catalog.=) 'payload'
           AND c.privilege_type OPERATOR(pg_catalog.=) 'INSERT'
           AND c.grantee OPERATOR(pg_catalog.<>) 'PUBLIC'
           AND c.grantee::name OPERATOR(pg_catalog.<>) (SELECT pg_catalog.pg_get_userbyid(k.relowner)
                                                          FROM pg_catalog.pg_class AS k
                                                         WHERE k.oid OPERATOR(pg_catalog.=) 'pgtaskd.tasks'::pg_catalog.regclass)
    LOOP
        EXECUTE pg_catalog.format('GRANT INSERT (tags, metadata) ON pgtaskd.tasks TO %I', r.grantee);
    END LOOP;
END
$$;
