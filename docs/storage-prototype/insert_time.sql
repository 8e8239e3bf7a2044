-- The producer's large statement: one INSERT ... SELECT of 10,000 tasks of 1 KiB, in its own
-- transaction (commit included), :rounds times per layout, the layouts taking turns; the
-- median goes to public.results (docs/storage.md, "The prototype"). Run by run.sh after
-- schema.sql.
\set ON_ERROR_STOP on
SET client_min_messages = warning;
CREATE UNLOGGED TABLE IF NOT EXISTS public.results (
    layout text, hold int, metric text, value numeric, at timestamptz DEFAULT now());
CREATE TEMP TABLE timings (layout text, round int, seconds float8);

CREATE OR REPLACE PROCEDURE pg_temp.time_insert(rounds int)
LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    layout text;
BEGIN
    FOR r IN 1..rounds LOOP
        FOREACH layout IN ARRAY ARRAY['today', 'proposed', 'rowstate'] LOOP
            t0 := clock_timestamp();
            EXECUTE format('INSERT INTO %I.tasks (payload, queue, priority, run_at, '
                           'max_attempts, idempotency_key) '
                           'SELECT repeat(md5(g::text), 32), ''default'', 0, now(), 3, NULL '
                           'FROM generate_series(1, 10000) AS g', layout);
            COMMIT;
            INSERT INTO pg_temp.timings
            VALUES (layout, r, extract(epoch FROM clock_timestamp() - t0));
        END LOOP;
    END LOOP;
END
$$;

CALL pg_temp.time_insert(:rounds);

INSERT INTO public.results (layout, hold, metric, value)
SELECT layout, 0, 'insert_10000_median_s',
       percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds)
  FROM pg_temp.timings GROUP BY layout;
SELECT layout, round(min(seconds)::numeric, 3) AS min_s,
       round((percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds))::numeric, 3) AS median_s,
       round(max(seconds)::numeric, 3) AS max_s
  FROM pg_temp.timings GROUP BY layout ORDER BY layout;
