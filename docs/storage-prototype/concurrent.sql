-- One worker's cycle for concurrent.sh (docs/storage.md, "The prototype"): claim up to n tasks
-- in one transaction, finish them as SUCCEEDED in the next, as a daemon's claim loop and
-- completer do (without the analyzer between). Called by pgbench clients with CALL, outside
-- any transaction block, so that the procedure may commit.
CREATE OR REPLACE PROCEDURE public.drain_cycle(layout text, n int)
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    tokens bigint[];
    written bigint;
    t0 timestamptz := clock_timestamp();
BEGIN
    EXECUTE format('SELECT array_agg(c.task_id ORDER BY c.task_id), '
                   'array_agg(c.task_token ORDER BY c.task_id) '
                   'FROM %I.claim($1, ''pgbench'') AS c WHERE c.task_payload IS NOT NULL', layout)
        INTO ids, tokens USING n;
    COMMIT;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT count(*) FROM %I.finish($1, $2)', layout)
        INTO written USING ids, tokens;
    IF layout = 'proposed' THEN
        PERFORM proposed.sweep(ARRAY(SELECT DISTINCT t / 1024 FROM unnest(tokens) AS t));
    END IF;
    COMMIT;
    INSERT INTO public.drained (n, started, seconds)
    VALUES (written, t0, extract(epoch FROM clock_timestamp() - t0));
    COMMIT;
END
$$;
