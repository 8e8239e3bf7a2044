-- pgtaskd schema, version 43: a missing ref named within bounds (docs/dependencies.md,
-- "Graphs").
--
-- `pgtaskd.enqueue_graph` refused a task waiting for a ref that no task of the graph has by
-- naming both refs whole: a ref of a megabyte made an error of a megabyte, in the producer's
-- log and in every client that prints it. Both are now cut to 100 characters, as a cycle's
-- and a duplicate's refs are since schema 42, and the task named is the first one in the
-- graph's order (it was whichever the scan met first).
--
-- Locks: none but the function's replacement.

SELECT pg_catalog.set_config('lock_timeout', '10s', true)
 WHERE pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.=) interval '0'
    OR pg_catalog.current_setting('lock_timeout')::interval OPERATOR(pg_catalog.>) interval '10 seconds';

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
    pred      int[];
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
    -- The first ten refs named twice or more, each cut to 100 characters (schema 42).
    SELECT string_agg(left(d.ref, 100), ', ' ORDER BY d.ref) FILTER (WHERE d.k <= 10)
           || CASE WHEN count(*) > 10 THEN format(' and %s more', count(*) - 10) ELSE '' END
      INTO bad
      FROM (SELECT e.node ->> 'ref' AS ref, row_number() OVER (ORDER BY e.node ->> 'ref') AS k
              FROM jsonb_array_elements(enqueue_graph.graph) AS e(node)
             GROUP BY e.node ->> 'ref' HAVING count(*) > 1) AS d;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue_graph: more than one task has ref %', bad USING ERRCODE = '22023';
    END IF;
    -- ref -> position, 1 to n.
    SELECT jsonb_object_agg(e.node ->> 'ref', e.ord) INTO ords
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord);
    -- The first task waiting for a ref no task has, both refs cut to 100 characters
    -- (schema 43).
    SELECT format('task %s waits for ref %s, which the graph does not name',
                  left(e.node ->> 'ref', 100), left(a.ref #>> '{}', 100))
      INTO bad
      FROM jsonb_array_elements(enqueue_graph.graph) WITH ORDINALITY AS e(node, ord),
           jsonb_array_elements(coalesce(e.node -> 'after', '[]')) WITH ORDINALITY AS a(ref, k)
     WHERE jsonb_typeof(a.ref) = 'string' AND NOT ords ? (a.ref #>> '{}')
     ORDER BY e.ord, a.k
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
        -- Every task left waits for another task left: its first such parent (the edges are
        -- in parent order), found in one pass over the edges (schema 42: one search of all
        -- the edges a step made a cycle of 100,000 tasks take most of an hour). Follow them
        -- from the first task left until a task comes round again.
        pred := array_fill(0, ARRAY[n]);
        FOR i IN 1 .. coalesce(array_length(e_child, 1), 0) LOOP
            IF pred[e_child[i]] = 0 AND indegree[e_child[i]] > 0
               AND indegree[e_parent[i]] > 0 THEN
                pred[e_child[i]] := e_parent[i];
            END IF;
        END LOOP;
        u := (SELECT min(g) FROM generate_series(1, n) AS g WHERE indegree[g] > 0);
        seen := array_fill(0, ARRAY[n]);
        walk := '{}';
        WHILE seen[u] = 0 LOOP
            seen[u] := coalesce(array_length(walk, 1), 0) + 1;
            walk := walk || u;
            u := pred[u];
        END LOOP;
        walk := walk[seen[u]:] || u;
        -- A long cycle is named by its first and last ten steps, and each ref by its first
        -- 100 characters: the error stays a line.
        i := array_length(walk, 1);
        IF i > 21 THEN
            walk := walk[1:10] || 0 || walk[i - 9:i];
        END IF;
        RAISE EXCEPTION 'cycle: %',
            (SELECT string_agg(CASE WHEN w.o = 0 THEN format('(%s more)', i - 20)
                                    ELSE left(enqueue_graph.graph -> (w.o - 1) ->> 'ref', 100)
                               END, ' -> ' ORDER BY w.k)
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
