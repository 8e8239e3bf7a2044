-- Finishes that share claims for contention.sh (docs/storage.md, "Contention on claims
-- rows"). A daemon's completer gathers the finishes of tasks from several claims into one
-- batch and has two batches on their way at once, so two finish statements often hold
-- tokens of the same claim. In today's layout they write different task rows; in the
-- proposed one both lock and update the claim's one `claims` row, and the second waits for
-- the first's commit.
--
-- Phase one (`claim_all`) claims the whole backlog in claims of `per_claim` tasks and
-- records each token in `public.pending`, in claim order. Phase two is `finish_next`, run by
-- pgbench clients at once: each takes the `n` oldest pending tokens no other client holds
-- (so neighbouring clients take tokens of the claims between their batches) and finishes
-- them in one transaction, as the completer does, recording the batch's size and time.

CREATE UNLOGGED TABLE public.pending (seq bigserial PRIMARY KEY, id bigint, token bigint);
CREATE UNLOGGED TABLE public.finished (n bigint, started timestamptz, seconds float8);

CREATE OR REPLACE PROCEDURE public.claim_all(layout text, per_claim int)
LANGUAGE plpgsql AS $$
DECLARE
    got int;
BEGIN
    LOOP
        EXECUTE format('INSERT INTO public.pending (id, token) '
                       'SELECT c.task_id, c.task_token FROM %I.claim($1, ''contention'') AS c '
                       'ORDER BY c.task_token', layout)
            USING per_claim;
        GET DIAGNOSTICS got = ROW_COUNT;
        COMMIT;
        EXIT WHEN got = 0;
    END LOOP;
END
$$;

CREATE OR REPLACE PROCEDURE public.finish_next(layout text, n int)
LANGUAGE plpgsql AS $$
DECLARE
    ids bigint[];
    tokens bigint[];
    written bigint;
    t0 timestamptz := clock_timestamp();
BEGIN
    WITH taken AS (
        DELETE FROM public.pending AS p
         WHERE p.seq = ANY (ARRAY(SELECT k.seq FROM public.pending AS k
                                   ORDER BY k.seq LIMIT n FOR UPDATE SKIP LOCKED))
        RETURNING p.id, p.token
    )
    SELECT array_agg(t.id ORDER BY t.id), array_agg(t.token ORDER BY t.id) INTO ids, tokens
      FROM taken AS t;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT count(*) FROM %I.finish($1, $2)', layout)
        INTO written USING ids, tokens;
    IF layout = 'proposed' THEN
        PERFORM proposed.sweep(ARRAY(SELECT DISTINCT t / 1024 FROM unnest(tokens) AS t));
    END IF;
    COMMIT;
    INSERT INTO public.finished (n, started, seconds)
    VALUES (written, t0, extract(epoch FROM clock_timestamp() - t0));
    COMMIT;
END
$$;
