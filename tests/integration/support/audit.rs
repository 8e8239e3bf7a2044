//! Test-only SQL installed into a test database: an audit trail of every status transition
//! (the state rows of `pgtaskd.task_state`, the only rows the daemon updates, schema 36),
//! and a switch that makes the database refuse the finishes of chosen attempts (a daemon
//! that cannot finish keeps its claim, as one that lost the database would).

use tokio_postgres::Client;

const INSTALL: &str = "
CREATE TABLE public.audit (
    seq         bigserial PRIMARY KEY,
    id          bigint NOT NULL,
    old_status  text NOT NULL,
    new_status  text NOT NULL,
    old_attempt int NOT NULL,
    new_attempt int NOT NULL,
    old_owner   text
);
CREATE FUNCTION public.audit_tasks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IS DISTINCT FROM NEW.status THEN
        INSERT INTO public.audit (id, old_status, new_status, old_attempt, new_attempt, old_owner)
        VALUES (OLD.id, OLD.status, NEW.status, OLD.attempt, NEW.attempt, OLD.lease_owner);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit AFTER UPDATE ON pgtaskd.task_state
    FOR EACH ROW EXECUTE FUNCTION public.audit_tasks();

CREATE TABLE public.refused_attempts (attempt int PRIMARY KEY);
CREATE FUNCTION public.refuse_finish() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'RUNNING' AND NEW.status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
       AND EXISTS (SELECT 1 FROM public.refused_attempts WHERE attempt = OLD.attempt) THEN
        RAISE EXCEPTION 'test: finishes of attempt % are refused', OLD.attempt;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_finish BEFORE UPDATE ON pgtaskd.task_state
    FOR EACH ROW EXECUTE FUNCTION public.refuse_finish();
";

/// Install the audit trail and the finish switch.
pub async fn install(client: &Client) {
    client
        .batch_execute(INSTALL)
        .await
        .expect("install the test audit");
}

/// Make the database refuse finishes of claims with this attempt number.
pub async fn refuse_finishes_of_attempt(client: &Client, attempt: i32) {
    client
        .execute(
            "INSERT INTO public.refused_attempts VALUES ($1) ON CONFLICT DO NOTHING",
            &[&attempt],
        )
        .await
        .unwrap();
}

/// Accept every finish again.
pub async fn accept_all_finishes(client: &Client) {
    client
        .execute("DELETE FROM public.refused_attempts", &[])
        .await
        .unwrap();
}

/// Transitions out of a terminal state: must always be zero.
pub async fn transitions_out_of_terminal(client: &Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM public.audit WHERE old_status IN ('SUCCEEDED', 'FAILED', 'CANCELED')",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Tasks that reached a terminal state more than once: must always be zero.
pub async fn tasks_finished_twice(client: &Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM (
                SELECT id FROM public.audit
                 WHERE new_status IN ('SUCCEEDED', 'FAILED', 'CANCELED')
                 GROUP BY id HAVING count(*) > 1) twice",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}
