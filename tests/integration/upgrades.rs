//! Upgrades by particular schema versions: schema 8 sets the tables' vacuum parameters;
//! schema 14 keeps a disabled insert trigger disabled, counts the flags already live, gives
//! up on a table lock held elsewhere and applies later, and resolves nothing through the
//! migrating role's search_path; schema 18 refuses to apply over queue names longer than 128
//! bytes until they are renamed; schema 22 grants `pgtaskd.retry_failed` to the roles that may
//! retry; schema 24 gives `pgtaskd.task_view` to every role that could read the tasks; schema
//! 30 keeps tasks of every state, gives each a key and keeps the claim's grants.

use crate::migrate::database_at;
use crate::support::daemon::pgtaskd;
use crate::support::{within, TestDb, WAIT};

/// Since schema 36 the updates (and the room for them, `fillfactor = 50`) are the state
/// rows' (`pgtaskd.task_state`); `pgtaskd.tasks`, never updated, keeps the vacuum parameters
/// for retention's deletes at `fillfactor = 100`.
#[tokio::test]
async fn schema_8_sets_the_tables_vacuum_parameters() {
    let db = TestDb::new().await;
    let client = db.client().await;
    for (table, fillfactor) in [
        ("pgtaskd.task_state", "fillfactor=50"),
        ("pgtaskd.tasks", "fillfactor=100"),
    ] {
        let options: Vec<String> = client
            .query_one(
                "SELECT reloptions FROM pg_class WHERE oid = $1::text::regclass",
                &[&table],
            )
            .await
            .unwrap()
            .get(0);
        for option in [
            "autovacuum_vacuum_scale_factor=0",
            "autovacuum_vacuum_threshold=5000",
            "autovacuum_vacuum_cost_delay=0",
            "vacuum_truncate=false",
            fillfactor,
        ] {
            assert!(
                options.iter().any(|o| o == option),
                "{table}: {option}: {options:?}"
            );
        }
        assert_eq!(
            options.len(),
            5,
            "{table}: only the parameters sql/0008_autovacuum.sql, sql/0027_room_for_updates.sql and sql/0036_task_state.sql explain: {options:?}"
        );
    }
}

/// Schema 27 leaves room on each page for the updates (`fillfactor = 50`) where the table had
/// no fillfactor, and keeps one an operator had set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_27_sets_a_fillfactor_unless_the_operator_set_one() {
    let fillfactor = "SELECT o FROM pg_class AS c, unnest(c.reloptions) AS o
                      WHERE c.oid = 'pgtaskd.tasks'::regclass AND o LIKE 'fillfactor=%'";
    for (set, expected) in [
        ("", "fillfactor=50"),
        (
            "ALTER TABLE pgtaskd.tasks SET (fillfactor = 70)",
            "fillfactor=70",
        ),
    ] {
        let (_db, mut client) = database_at(26).await;
        within(WAIT, "the operator's setting", client.batch_execute(set))
            .await
            .unwrap();
        // To schema 27 only: schema 36 moves the updates to pgtaskd.task_state and leaves
        // pgtaskd.tasks, never updated again, at fillfactor 100.
        within(
            WAIT,
            "migrating",
            pgtaskd::db::migrate::migrate_to(&mut client, 27),
        )
        .await
        .unwrap();
        let found: Vec<String> = within(WAIT, "the fillfactor", client.query(fillfactor, &[]))
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(found, [expected], "after {set:?}");
    }
}

/// Schema 14 re-creates the insert trigger with its `WHEN` condition: an operator who had
/// disabled it (sites that poll) finds it still disabled, and the flags already live when
/// it was applied count for the condition at once.
#[tokio::test]
async fn schema_14_keeps_a_disabled_insert_trigger_disabled_and_counts_live_flags() {
    let trigger_state = "SELECT tgenabled::text FROM pg_trigger
         WHERE tgrelid = 'pgtaskd.tasks'::regclass AND tgname = 'tasks_notify'";
    let hint_live = "SELECT coalesce(pg_sequence_last_value('pgtaskd.idle_until')::float8
                              > date_part('epoch', now()) * 1000, false)";
    for disabled in [true, false] {
        let (_db, mut client) = database_at(13).await;
        within(
            WAIT,
            "a live flag",
            client.batch_execute(
                "INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
                 VALUES ('flagged-before', now() + interval '1 hour')",
            ),
        )
        .await
        .unwrap();
        if disabled {
            within(
                WAIT,
                "the operator's switch",
                client.batch_execute("ALTER TABLE pgtaskd.tasks DISABLE TRIGGER tasks_notify"),
            )
            .await
            .unwrap();
        }
        let applied = within(
            WAIT,
            "schema 14",
            pgtaskd::db::migrate::migrate(&mut client),
        )
        .await
        .unwrap();
        assert!(applied.contains(&14), "{applied:?}");
        let state: String = within(WAIT, "the trigger", client.query_one(trigger_state, &[]))
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            state,
            if disabled { "D" } else { "O" },
            "disabled: {disabled}"
        );
        let live: bool = within(WAIT, "the hint", client.query_one(hint_live, &[]))
            .await
            .unwrap()
            .get(0);
        assert!(live, "the flag written before schema 14 counts");
    }
}

/// Schema 14 needs `pgtaskd.tasks`'s exclusive lock for a moment. Held up (here by a
/// transaction holding the lock a vacuum takes), it gives up after about 10 s instead of
/// queueing every insert behind its request for as long, changes nothing, and applies once
/// the lock is free.
#[tokio::test]
async fn schema_14_gives_up_on_a_table_lock_held_elsewhere_and_applies_later() {
    let (db, mut client) = database_at(13).await;
    let holder = db.client().await;
    within(
        WAIT,
        "the held lock",
        holder.batch_execute("BEGIN; LOCK TABLE pgtaskd.tasks IN SHARE UPDATE EXCLUSIVE MODE"),
    )
    .await
    .unwrap();
    // The daemon's sessions (`migrate`, `run --migrate`) carry a lock timeout of
    // `database.statement_timeout`, 30 s by default: the migration shortens it too.
    within(
        WAIT,
        "the session's lock timeout",
        client.batch_execute("SET lock_timeout = '30s'"),
    )
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let err = within(
        WAIT,
        "schema 14",
        pgtaskd::db::migrate::migrate(&mut client),
    )
    .await
    .expect_err("the lock is held");
    assert!(
        format!("{err:?}").contains("lock timeout"),
        "a lock timeout: {err:?}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(25),
        "gave up after {:?}",
        started.elapsed()
    );
    let version = within(
        WAIT,
        "the version",
        pgtaskd::db::migrate::current_version(&client),
    )
    .await
    .unwrap();
    assert_eq!(version, Some(13), "nothing applied");
    within(WAIT, "the lock's release", holder.batch_execute("COMMIT"))
        .await
        .unwrap();
    let applied = within(
        WAIT,
        "schema 14 again",
        pgtaskd::db::migrate::migrate(&mut client),
    )
    .await
    .unwrap();
    assert_eq!(
        applied,
        (14..=pgtaskd::db::migrate::LATEST_VERSION).collect::<Vec<_>>()
    );
    let lock_timeout: String = within(
        WAIT,
        "the session's lock timeout",
        client.query_one("SHOW lock_timeout", &[]),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        lock_timeout, "30s",
        "the migration's own timeout ends with it"
    );
}

/// Schema 14 stores a `WHEN` condition in the insert trigger and compares catalog values:
/// operators of someone's own in `public` (on the migrating role's default search_path), for
/// exactly the argument types a comparison or product there has and pg_catalog lacks, are
/// neither run by the migration nor stored in the trigger.
#[tokio::test]
async fn schema_14_resolves_nothing_through_the_migrating_roles_search_path() {
    let (_db, mut client) = database_at(13).await;
    within(
        WAIT,
        "the traps",
        client.batch_execute(
            "CREATE TABLE public.hijacked (by text);
             CREATE FUNCTION public.trap_mul(float8, int4) RETURNS float8 LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO public.hijacked VALUES ('*'); RETURN $1 * $2::float8; END $$;
             CREATE OPERATOR public.* (LEFTARG = float8, RIGHTARG = int4, FUNCTION = public.trap_mul);
             CREATE FUNCTION public.trap_eq(oid, regclass) RETURNS boolean LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO public.hijacked VALUES ('='); RETURN $1 = $2::oid; END $$;
             CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = public.trap_eq);
             SET search_path = \"$user\", public;",
        ),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "schema 14",
        pgtaskd::db::migrate::migrate(&mut client),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "an insert",
        client.batch_execute(
            "INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
             VALUES ('flagged', now() + interval '1 hour');
             INSERT INTO pgtaskd.tasks (payload) VALUES ('through the condition');",
        ),
    )
    .await
    .unwrap();
    let hijacked = within(
        WAIT,
        "the traps' log",
        client.query_one("SELECT count(*) FROM public.hijacked", &[]),
    )
    .await
    .unwrap()
    .get::<_, i64>(0);
    assert_eq!(hijacked, 0, "no trap ran");
    let definition: String = within(
        WAIT,
        "the trigger",
        client.query_one(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger
              WHERE tgrelid = 'pgtaskd.tasks'::regclass AND tgname = 'tasks_notify'",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    assert!(
        !definition.contains("OPERATOR(public."),
        "no operator of public's in the condition: {definition}"
    );
    let path: String = within(WAIT, "the path", client.query_one("SHOW search_path", &[]))
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        path, "\"$user\", public",
        "the session's search_path is back"
    );
}

/// Schema 18 limits queue names to 128 bytes. It changes no existing name: over a task (or
/// a pause) with a longer one it refuses to apply, says how many and what to do, and leaves
/// the schema at 15; once they are renamed it applies, with the table's constraint added
/// NOT VALID (no scan under the table's lock), which VALIDATE can then mark valid.
#[tokio::test]
async fn schema_18_refuses_to_apply_over_longer_queue_names_until_they_are_renamed() {
    let (db, mut client) = database_at(15).await;
    let long = "q".repeat(129);
    client
        .batch_execute(&format!(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('a', '{long}'), ('b', '{long}'), ('c', 'ok');
             INSERT INTO pgtaskd.paused_queues (queue) VALUES ('{long}');"
        ))
        .await
        .unwrap();
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["migrate"]).await;
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("limits queue names to 1 to 128 bytes, and 2 tasks and 1 paused queues"),
        "{stderr}"
    );
    let version: i32 = client
        .query_one("SELECT max(version) FROM pgtaskd.schema_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, 15, "nothing was applied");

    client
        .batch_execute(&format!(
            "UPDATE pgtaskd.tasks SET queue = 'renamed' WHERE queue = '{long}';
             UPDATE pgtaskd.paused_queues SET queue = 'renamed' WHERE queue = '{long}';"
        ))
        .await
        .unwrap();
    let applied = within(
        WAIT,
        "migrations 16 to the latest",
        pgtaskd::db::migrate::migrate(&mut client),
    )
    .await
    .unwrap();
    assert_eq!(
        applied,
        (16..=pgtaskd::db::migrate::LATEST_VERSION).collect::<Vec<_>>()
    );
    let validated = "SELECT convalidated FROM pg_constraint WHERE conname = 'tasks_queue_name'";
    let row = client.query_one(validated, &[]).await.unwrap();
    assert!(!row.get::<_, bool>(0), "added NOT VALID");
    client
        .batch_execute("ALTER TABLE pgtaskd.tasks VALIDATE CONSTRAINT tasks_queue_name")
        .await
        .unwrap();
    let row = client.query_one(validated, &[]).await.unwrap();
    assert!(row.get::<_, bool>(0));
    let lock_timeout: String = client
        .query_one("SHOW lock_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(lock_timeout, "0", "the session's setting is as it was");
}

/// Schema 22's `pgtaskd.retry_failed` goes to the roles that may run `pgtaskd.retry`, those
/// granted before it (found by that right) and after it (by the re-created grant functions):
/// operators and daemons, not producers, not a role with nothing, not PUBLIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_22_grants_retry_failed_to_the_roles_that_may_retry() {
    let roles = Roles::new("rf");
    let (_db, owner) = upgrade_with_roles(21, &roles, "").await;
    for (kind, expected) in [
        ("old_daemon", true),
        ("new_daemon", true),
        ("old_ops", true),
        ("new_ops", true),
        ("old_app", false),
        ("new_app", false),
        ("stranger", false),
    ] {
        let sql = format!(
            "SELECT has_function_privilege('{}', 'pgtaskd.retry_failed(text, integer, bigint)', 'EXECUTE')",
            roles.name(kind)
        );
        let may: bool = within(WAIT, "a right", owner.query_one(&sql, &[]))
            .await
            .unwrap()
            .get(0);
        assert_eq!(may, expected, "{kind}");
    }
}

/// Schema 24's `pgtaskd.task_view` has every column of `pgtaskd.tasks`, in its order, with
/// its names and types, and reads the same rows (the table as it was before the upgrade:
/// schema 36 moved the state columns to `pgtaskd.task_state`, and the view kept them all);
/// every role that could read the table before the upgrade (granted by the grant functions,
/// or by hand) reads the view after it, and the grant functions give it from then on; no
/// role may write through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_24_gives_the_task_view_to_every_role_that_may_read_the_tasks() {
    let roles = Roles::new("tv");
    let setup = format!(
        "CREATE ROLE {0}; GRANT USAGE ON SCHEMA pgtaskd TO {0}; GRANT SELECT ON pgtaskd.tasks TO {0};
         INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('one', 'a'), ('two', 'b');
         UPDATE pgtaskd.tasks SET status = 'SUCCEEDED', words = 1, bytes = 3, runes = 3,
                finished_at = now(), started_at = now(), attempt = 1 WHERE payload = 'one';
         CREATE TABLE public.tasks_before_24 AS SELECT * FROM pgtaskd.tasks;",
        roles.name("by_hand")
    );
    let (_db, owner) = upgrade_with_roles(23, &roles, &setup).await;

    let columns = |relation: &str| {
        format!(
            "SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) \
               FROM pg_attribute WHERE attrelid = '{relation}'::regclass AND attnum > 0 AND NOT attisdropped"
        )
    };
    let table: String = owner
        .query_one(&columns("public.tasks_before_24"), &[])
        .await
        .unwrap()
        .get(0);
    let view: String = owner
        .query_one(&columns("pgtaskd.task_view"), &[])
        .await
        .unwrap()
        .get(0);
    // Besides the table's columns, the view has the task's key (schema 30), computed, and
    // the columns later schemas added (30, 32, 33) after it.
    let expected = format!("{table}, task_key text, ");
    assert!(
        view.starts_with(&expected),
        "the view's columns are the table's, and the key: {view} against {expected}"
    );
    let same: bool = owner
        .query_one(
            "SELECT count(*) = (SELECT count(*) FROM pgtaskd.task_view) \
                AND bool_and(coalesce(to_jsonb(v) @> to_jsonb(t), false)) \
               FROM public.tasks_before_24 AS t LEFT JOIN pgtaskd.task_view AS v USING (id)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(same, "the view reads the table's rows");

    for (kind, expected) in [
        ("old_daemon", true),
        ("new_daemon", true),
        ("old_ops", true),
        ("new_ops", true),
        ("old_app", true),
        ("new_app", true),
        ("by_hand", true),
        ("stranger", false),
    ] {
        for (privilege, may) in [
            ("SELECT", expected),
            ("INSERT", false),
            ("UPDATE", false),
            ("DELETE", false),
        ] {
            let sql = format!(
                "SELECT has_table_privilege('{}', 'pgtaskd.task_view', '{privilege}')",
                roles.name(kind)
            );
            let has: bool = within(WAIT, "a right", owner.query_one(&sql, &[]))
                .await
                .unwrap()
                .get(0);
            assert_eq!(has, may, "{kind}: {privilege}");
        }
    }
    // Read as one of them, as a producer's own status query would be.
    owner
        .batch_execute(&format!("SET ROLE {}", roles.name("old_app")))
        .await
        .unwrap();
    let row = owner
        .query_one(
            "SELECT status, words, bytes, runes, output, error FROM pgtaskd.task_view \
              WHERE payload = 'one'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "SUCCEEDED");
    assert_eq!(row.get::<_, i64>(1), 1);
    assert_eq!(row.get::<_, i64>(2), 3);

    // The view reads with the reader's rights: a row-level security policy on the table
    // holds through it.
    owner
        .batch_execute(&format!(
            "RESET ROLE;
             ALTER TABLE pgtaskd.tasks ENABLE ROW LEVEL SECURITY;
             CREATE POLICY only_queue_a ON pgtaskd.tasks FOR SELECT TO {} USING (queue = 'a');
             SET ROLE {};",
            roles.name("old_app"),
            roles.name("old_app")
        ))
        .await
        .unwrap();
    for relation in ["pgtaskd.tasks", "pgtaskd.task_view"] {
        let queues: Vec<String> = owner
            .query(&format!("SELECT queue FROM {relation} ORDER BY id"), &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(queues, ["a"], "{relation}");
    }
}

/// Schema 26's functions of the daemon's state writes go to the roles that may finish, those
/// granted before it (found by that right, by the grant function or by hand) and after it (by
/// the re-created `grant_daemon`), and not to producers, operators, a role with nothing or
/// PUBLIC; a daemon role granted before the upgrade heartbeats, re-reads, releases and
/// rescues a claim with them. Producers read `pgtaskd.paused_queues` from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_26_grants_the_state_functions_to_the_roles_that_may_finish_and_paused_queues_to_producers(
) {
    let roles = Roles::new("sf");
    let setup = format!(
        "CREATE ROLE {0}; GRANT EXECUTE ON FUNCTION pgtaskd.finish(bigint[], bigint[], text[], \
         bigint[], bigint[], bigint[], text[], text[], float8[], boolean) TO {0};",
        roles.name("finisher")
    );
    let (_db, owner) = upgrade_with_roles(25, &roles, &setup).await;
    let functions = [
        "pgtaskd.heartbeat(bigint[], bigint[], float8)",
        "pgtaskd.extend_lease(bigint, bigint, float8)",
        "pgtaskd.rescue(bigint, text)",
        "pgtaskd.release(bigint, bigint, boolean)",
        "pgtaskd.claim_state(bigint, boolean)",
    ];
    for (kind, expected) in [
        ("old_daemon", true),
        ("new_daemon", true),
        ("finisher", true),
        ("old_ops", false),
        ("new_ops", false),
        ("old_app", false),
        ("new_app", false),
        ("stranger", false),
    ] {
        for function in functions {
            let sql = format!(
                "SELECT has_function_privilege('{}', '{function}', 'EXECUTE')",
                roles.name(kind)
            );
            let may: bool = within(WAIT, "a right", owner.query_one(&sql, &[]))
                .await
                .unwrap()
                .get(0);
            assert_eq!(may, expected, "{kind}: {function}");
        }
    }

    // Producers read which queues are paused, those granted before it and after.
    for (kind, expected) in [
        ("old_app", true),
        ("new_app", true),
        ("old_daemon", true),
        ("old_ops", true),
        ("stranger", false),
    ] {
        let sql = format!(
            "SELECT has_table_privilege('{}', 'pgtaskd.paused_queues', 'SELECT')",
            roles.name(kind)
        );
        let may: bool = within(WAIT, "a right", owner.query_one(&sql, &[]))
            .await
            .unwrap()
            .get(0);
        assert_eq!(may, expected, "{kind}: SELECT on paused_queues");
    }

    // The daemon role of schema 25 uses them, with its own rights.
    let (id, token) = claim_one_as(&owner, &roles.name("old_daemon"), "sf", "x").await;
    let beat = within(
        WAIT,
        "a heartbeat",
        owner.query(
            "SELECT task_id, task_extended, task_cancel_requested \
               FROM pgtaskd.heartbeat(ARRAY[$1::bigint], ARRAY[$2::bigint], 60000)",
            &[&id, &token],
        ),
    )
    .await
    .unwrap();
    assert_eq!(beat.len(), 1);
    assert_eq!(
        (beat[0].get::<_, i64>(0), beat[0].get(1), beat[0].get(2)),
        (id, true, false)
    );
    let extended = within(
        WAIT,
        "a lease extended",
        owner.query(
            "SELECT task_cancel_requested FROM pgtaskd.extend_lease($1, $2, 60000)",
            &[&id, &token],
        ),
    )
    .await
    .unwrap();
    assert_eq!(extended.len(), 1);
    let state = within(
        WAIT,
        "a re-read",
        owner.query_one(
            "SELECT task_status, task_attempt, task_claim FROM pgtaskd.claim_state($1, false)",
            &[&id],
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        (state.get::<_, String>(0), state.get(1), state.get(2)),
        ("RUNNING".to_string(), 1, Some(token))
    );
    let rescued = within(
        WAIT,
        "a rescue",
        owner.query("SELECT task_id FROM pgtaskd.rescue(10, 'another')", &[]),
    )
    .await
    .unwrap();
    assert!(rescued.is_empty(), "a live lease is not rescued");
    let released = within(
        WAIT,
        "a release",
        owner.query_one(
            "SELECT written, current FROM pgtaskd.release($1, $2, false)",
            &[&id, &token],
        ),
    )
    .await
    .unwrap();
    // `current` is the row as the statement began (read only where nothing was written).
    assert_eq!(
        (released.get::<_, Option<String>>(0), released.get(1)),
        (Some("QUEUED".to_string()), Some("RUNNING".to_string()))
    );
    let again = within(
        WAIT,
        "a heartbeat of a released claim",
        owner.query(
            "SELECT task_id FROM pgtaskd.heartbeat(ARRAY[$1::bigint], ARRAY[$2::bigint], 60000)",
            &[&id, &token],
        ),
    )
    .await
    .unwrap();
    assert!(again.is_empty(), "a released claim is no longer held");
}

/// Schema 28 lets every role that may rescue park results and write them (those granted
/// before the upgrade, by the old `grant_daemon` or by hand, and those granted after), and no
/// producer, operator, role with nothing or PUBLIC; the daemon role of schema 27 parks a
/// result, which the rescue passes over and `write_parked` writes once the lease expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_28_lets_the_roles_that_may_rescue_park_results_and_write_them() {
    let roles = Roles::new("pr");
    let setup = format!(
        "CREATE ROLE {0}; GRANT EXECUTE ON FUNCTION pgtaskd.rescue(bigint, text) TO {0};",
        roles.name("rescuer")
    );
    let (_db, owner) = upgrade_with_roles(27, &roles, &setup).await;
    let rights = [
        "has_function_privilege('{role}', 'pgtaskd.park(bigint[], bigint[], text[], bigint[], \
         bigint[], bigint[], text[], text[], float8[])', 'EXECUTE')",
        "has_function_privilege('{role}', 'pgtaskd.write_parked(bigint, text)', 'EXECUTE')",
        "has_table_privilege('{role}', 'pgtaskd.parked_results', 'SELECT')",
        "has_table_privilege('{role}', 'pgtaskd.parked_results', 'INSERT')",
        "has_table_privilege('{role}', 'pgtaskd.parked_results', 'DELETE')",
    ];
    for (kind, expected) in [
        ("old_daemon", true),
        ("new_daemon", true),
        ("rescuer", true),
        ("old_ops", false),
        ("new_ops", false),
        ("old_app", false),
        ("new_app", false),
        ("stranger", false),
    ] {
        for right in rights {
            let sql = format!("SELECT {}", right.replace("{role}", &roles.name(kind)));
            let may: bool = within(WAIT, "a right", owner.query_one(&sql, &[]))
                .await
                .unwrap()
                .get(0);
            assert_eq!(may, expected, "{kind}: {right}");
        }
    }

    // The daemon role of schema 27 parks a result of a claim whose lease then expires.
    let (id, token) = claim_one_as(&owner, &roles.name("old_daemon"), "pr", "x y").await;
    let parked = within(
        WAIT,
        "a park",
        owner.query(
            "SELECT task_id FROM pgtaskd.park(ARRAY[$1::bigint], ARRAY[$2::bigint], \
             ARRAY['SUCCEEDED'], ARRAY[2::bigint], ARRAY[3::bigint], ARRAY[3::bigint], \
             ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::float8])",
            &[&token, &id],
        ),
    )
    .await
    .unwrap();
    assert_eq!(parked.len(), 1, "the claim's result is parked");
    let early = within(
        WAIT,
        "writing before the lease expired",
        owner.query(
            "SELECT task_id FROM pgtaskd.write_parked(10, 'another')",
            &[],
        ),
    )
    .await
    .unwrap();
    assert!(early.is_empty(), "a live lease's parked result waits");
    within(
        WAIT,
        "the lease expiring",
        owner.execute("SELECT pgtaskd.extend_lease($1, $2, -1000)", &[&id, &token]),
    )
    .await
    .unwrap();
    let rescued = within(
        WAIT,
        "a rescue",
        owner.query("SELECT task_id FROM pgtaskd.rescue(10, 'another')", &[]),
    )
    .await
    .unwrap();
    assert!(
        rescued.is_empty(),
        "a claim whose result is parked is not taken back"
    );
    let written = within(
        WAIT,
        "writing the parked result",
        owner.query(
            "SELECT task_id, task_status FROM pgtaskd.write_parked(10, 'another')",
            &[],
        ),
    )
    .await
    .unwrap();
    assert_eq!(written.len(), 1);
    assert_eq!(
        (written[0].get::<_, i64>(0), written[0].get::<_, String>(1)),
        (id, "SUCCEEDED".to_string())
    );
    let row = within(
        WAIT,
        "the task",
        owner.query_one(
            "SELECT status, attempt, words, (SELECT count(*) FROM pgtaskd.parked_results) \
               FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, i32>(1),
            row.get::<_, i64>(2),
            row.get::<_, i64>(3)
        ),
        ("SUCCEEDED".to_string(), 1, 2, 0)
    );
}

/// As `role` from now on (the session keeps it): enqueue `payload` in `queue` and claim it.
/// The task's id and the claim's token.
async fn claim_one_as(
    owner: &tokio_postgres::Client,
    role: &str,
    queue: &str,
    payload: &str,
) -> (i64, i64) {
    within(
        WAIT,
        "acting as the role",
        owner.batch_execute(&format!("SET ROLE {role}")),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "an insert",
        owner.execute(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ($1, $2)",
            &[&payload, &queue],
        ),
    )
    .await
    .unwrap();
    let owner_name = format!("{queue}-owner");
    let claimed = within(
        WAIT,
        "a claim",
        owner.query_one(
            "SELECT task_id, task_claim FROM pgtaskd.claim(ARRAY[$1::text], 1, $2, \
             60000, 1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL",
            &[&queue, &owner_name],
        ),
    )
    .await
    .unwrap();
    (claimed.get(0), claimed.get(1))
}

/// Role names of one test: `{prefix}_{kind}_{tag}`, the tag random so that the roles of
/// tests run at once on one cluster never meet.
struct Roles {
    prefix: &'static str,
    tag: String,
}

impl Roles {
    fn new(prefix: &'static str) -> Roles {
        Roles {
            prefix,
            tag: format!("{:08x}", fastrand::u32(..)),
        }
    }

    fn name(&self, kind: &str) -> String {
        format!("{}_{kind}_{}", self.prefix, self.tag)
    }

    /// The role `kind`, created and given what the grant function `function` gives.
    fn granted(&self, kind: &str, function: &str) -> String {
        format!(
            "CREATE ROLE {0}; SELECT pgtaskd.{function}('{0}');",
            self.name(kind)
        )
    }
}

/// A database at schema `from` where the grant functions gave a daemon, an operator and a
/// producer role (`old_daemon`, `old_ops`, `old_app`), with a role given nothing (`stranger`)
/// and `setup`'s statements; migrated to the latest schema, and the same three granted again
/// by the new grant functions (`new_daemon`, `new_ops`, `new_app`).
async fn upgrade_with_roles(
    from: i32,
    roles: &Roles,
    setup: &str,
) -> (TestDb, tokio_postgres::Client) {
    let (db, mut owner) = database_at(from).await;
    let before = [
        roles.granted("old_daemon", "grant_daemon"),
        roles.granted("old_ops", "grant_operator"),
        roles.granted("old_app", "grant_producer"),
        format!("CREATE ROLE {};", roles.name("stranger")),
        setup.to_string(),
    ]
    .concat();
    within(
        WAIT,
        "the roles before the upgrade",
        owner.batch_execute(&before),
    )
    .await
    .unwrap();
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    let after = [
        roles.granted("new_daemon", "grant_daemon"),
        roles.granted("new_ops", "grant_operator"),
        roles.granted("new_app", "grant_producer"),
    ]
    .concat();
    within(
        WAIT,
        "the roles after the upgrade",
        owner.batch_execute(&after),
    )
    .await
    .unwrap();
    (db, owner)
}

#[tokio::test]
async fn schema_30_keeps_tasks_of_every_state_and_gives_each_a_key_and_the_claim_its_grants() {
    let roles = Roles::new("tk");
    let (_db, mut owner) = database_at(29).await;
    within(
        WAIT,
        "a daemon role of schema 29",
        owner.batch_execute(&roles.granted("old_daemon", "grant_daemon")),
    )
    .await
    .unwrap();
    // Tasks of every state, as a daemon of schema 29 leaves them: QUEUED, a retry waiting
    // with its error, RUNNING under a live lease, SUCCEEDED, FAILED, CANCELED.
    within(
        WAIT,
        "tasks of every state",
        owner.batch_execute(
            "INSERT INTO pgtaskd.tasks (payload, queue) SELECT 'p' || n, 'up' FROM generate_series(1, 6) AS n;
             UPDATE pgtaskd.tasks SET run_at = now() + interval '1 hour', attempt = 1,
                    error = 'exited with status 3' WHERE id = 2;
             UPDATE pgtaskd.tasks SET status = 'RUNNING', attempt = 2, lease_owner = 'old',
                    lease_expires_at = now() + interval '1 hour', started_at = now(),
                    claim_token = 77 WHERE id = 3;
             UPDATE pgtaskd.tasks SET status = 'SUCCEEDED', attempt = 1, words = 1, bytes = 2,
                    runes = 2, started_at = now(), finished_at = now() WHERE id = 4;
             UPDATE pgtaskd.tasks SET status = 'FAILED', attempt = 3, error = 'bad',
                    finished_at = now() WHERE id = 5;
             UPDATE pgtaskd.tasks SET status = 'CANCELED', cancel_requested = true,
                    finished_at = now() WHERE id = 6;",
        ),
    )
    .await
    .unwrap();
    let before: Vec<String> = within(
        WAIT,
        "the rows before",
        owner.query("SELECT t::text FROM pgtaskd.tasks AS t ORDER BY id", &[]),
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect();
    within(WAIT, "migrating", pgtaskd::db::migrate::migrate(&mut owner))
        .await
        .unwrap();
    let after = within(
        WAIT,
        "the rows after",
        owner.query(
            "SELECT (v.id, v.queue, v.payload, v.status, v.priority, v.run_at, v.attempt,
                     v.max_attempts, v.cancel_requested, v.words, v.bytes, v.runes, v.error,
                     v.lease_owner, v.lease_expires_at, v.created_at, v.started_at,
                     v.finished_at, v.idempotency_key, v.claim_token, v.output,
                     v.traceparent)::text, v.runs, v.errors IS NULL, v.task_key
               FROM pgtaskd.task_view AS v ORDER BY id",
            &[],
        ),
    )
    .await
    .unwrap();
    let site: String = within(
        WAIT,
        "the site",
        owner.query_one("SELECT id FROM pgtaskd.site", &[]),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(after.len(), before.len());
    for (row, before) in after.iter().zip(&before) {
        assert_eq!(&row.get::<_, String>(0), before, "every column kept");
        assert_eq!(row.get::<_, i32>(1), 0);
        assert!(row.get::<_, bool>(2));
        let key: String = row.get(3);
        assert!(key.starts_with(&format!("{site}-")), "{key}");
    }
    // The RUNNING claim of schema 29 is given back as its daemon would, then claimed by the
    // daemon role of schema 29, whose grant on the new claim was kept: its run counts on
    // from its attempts.
    within(
        WAIT,
        "the old claim given back",
        owner.query("SELECT * FROM pgtaskd.release(3, 77, true)", &[]),
    )
    .await
    .unwrap();
    within(
        WAIT,
        "the daemon role",
        owner.batch_execute(&format!("SET ROLE {}", roles.name("old_daemon"))),
    )
    .await
    .unwrap();
    let claimed = within(
        WAIT,
        "a claim by the role of schema 29",
        owner.query(
            "SELECT task_id, task_attempt, task_run FROM pgtaskd.claim(ARRAY['up'], 10, 'new', \
             60000, 1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL ORDER BY 1",
            &[],
        ),
    )
    .await
    .unwrap();
    let claimed: Vec<(i64, i32, i32)> = claimed
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        claimed,
        [(1, 1, 1), (3, 2, 2)],
        "the due tasks only (the retry waits an hour); the given-back one at run 2"
    );
}

/// Runs `sql` on `client` as `role`, then goes back to the session's own role.
async fn as_role(
    client: &tokio_postgres::Client,
    role: &str,
    sql: &str,
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    within(
        WAIT,
        "acting as the role",
        client.batch_execute(&format!("SET ROLE {role}")),
    )
    .await
    .unwrap();
    let answer = within(WAIT, "a statement as the role", client.query(sql, &[])).await;
    within(
        WAIT,
        "the own role back",
        client.batch_execute("RESET ROLE"),
    )
    .await
    .unwrap();
    answer
}

#[tokio::test]
async fn schema_33_keeps_every_row_and_its_attempts_and_gives_the_old_roles_the_limits() {
    let roles = Roles::new("ql");
    // Tasks of schema 32 in every state, one with its own max_attempts, one RUNNING.
    let setup = "INSERT INTO pgtaskd.tasks (payload, queue) SELECT 'p' || n, 'up' FROM generate_series(1, 5) AS n;
         UPDATE pgtaskd.tasks SET max_attempts = 5 WHERE id = 1;
         UPDATE pgtaskd.tasks SET status = 'RUNNING', attempt = 1, lease_owner = 'old',
                lease_expires_at = now() + interval '1 hour', started_at = now(),
                claim_token = 77 WHERE id = 2;
         UPDATE pgtaskd.tasks SET status = 'SUCCEEDED', attempt = 1, words = 1, bytes = 2,
                runes = 2, started_at = now(), finished_at = now() WHERE id = 3;
         UPDATE pgtaskd.tasks SET status = 'FAILED', attempt = 3, error = 'bad',
                finished_at = now() WHERE id = 4;
         UPDATE pgtaskd.tasks SET status = 'CANCELED', cancel_requested = true,
                finished_at = now() WHERE id = 5;
         CREATE TABLE before_33 AS SELECT id, to_jsonb(t) AS row FROM pgtaskd.tasks AS t;";
    let (_db, owner) = upgrade_with_roles(32, &roles, setup).await;

    // Every column of every row is kept; none has a key; the attempts given are kept.
    let changed: i64 = within(
        WAIT,
        "the rows compared",
        owner.query_one(
            "SELECT count(*) FROM before_33 AS b JOIN pgtaskd.task_view AS v USING (id)
              WHERE to_jsonb(v) - 'concurrency_key' - 'task_key' - 'depends_on'
                        - 'on_dep_failure' - 'tags' - 'metadata'
                        - 'progress' - 'progress_at' - 'batch_id' <> b.row
                 OR v.concurrency_key IS NOT NULL",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(changed, 0, "a row of schema 32 changed in the migration");
    let attempts: Vec<(i64, i32)> = within(
        WAIT,
        "the attempts",
        owner.query(
            "SELECT id, max_attempts FROM pgtaskd.tasks ORDER BY id",
            &[],
        ),
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    assert_eq!(attempts, [(1, 5), (2, 3), (3, 3), (4, 3), (5, 3)]);

    // The operator role of schema 32 sets the limits; a role given nothing may not.
    let stranger = as_role(
        &owner,
        &roles.name("stranger"),
        "SELECT pgtaskd.set_queue('up', '{\"max_running\": 1}')",
    )
    .await
    .expect_err("a role given nothing set a queue's limits");
    assert_eq!(
        stranger.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
    );
    as_role(
        &owner,
        &roles.name("old_ops"),
        "SELECT pgtaskd.set_queue('up', '{\"max_running\": 2, \"rate_limit\": 10, \
         \"rate_period\": \"1 second\", \"max_attempts\": 7}')",
    )
    .await
    .expect("the operator role of schema 32 sets the limits");

    // The producer role of schema 32 reads them and inserts a task with a key; it follows
    // the queue's attempts, the old rows keep theirs.
    as_role(
        &owner,
        &roles.name("old_app"),
        "INSERT INTO pgtaskd.tasks (payload, queue, concurrency_key) VALUES ('new', 'up', 'tenant-1')",
    )
    .await
    .expect("the producer role of schema 32 sets a key");
    let seen = as_role(
        &owner,
        &roles.name("old_app"),
        "SELECT max_running FROM pgtaskd.queue_settings WHERE queue = 'up'",
    )
    .await
    .expect("the producer role of schema 32 reads the settings");
    assert_eq!(seen[0].get::<_, Option<i32>>(0), Some(2));
    let in_force: Vec<(i64, i32)> = within(
        WAIT,
        "the attempts in force",
        owner.query(
            "SELECT id, max_attempts FROM pgtaskd.task_view WHERE id IN (1, 2, 6) ORDER BY id",
            &[],
        ),
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    assert_eq!(in_force, [(1, 5), (2, 3), (6, 7)]);

    // The daemon role of schema 32 claims the limited queue (writing its starts) and
    // finishes (notifying): the old RUNNING task holds one of the two slots.
    let claimed = as_role(
        &owner,
        &roles.name("old_daemon"),
        "SELECT task_id, task_claim FROM pgtaskd.claim(ARRAY['up'], 10, 'new', \
         60000, 1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL",
    )
    .await
    .expect("the daemon role of schema 32 claims a limited queue");
    assert_eq!(claimed.len(), 1, "max_running 2 with one RUNNING already");
    let (id, token): (i64, i64) = (claimed[0].get(0), claimed[0].get(1));
    assert_eq!(id, 1);
    let finished = as_role(
        &owner,
        &roles.name("old_daemon"),
        &format!(
            "SELECT * FROM pgtaskd.finish(ARRAY[{token}]::int8[], ARRAY[{id}]::int8[], \
             ARRAY['SUCCEEDED'], ARRAY[1]::int8[], ARRAY[1]::int8[], ARRAY[1]::int8[], \
             ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::float8[], false)"
        ),
    )
    .await;
    finished.expect("the daemon role of schema 32 finishes a limited queue's task");
    let starts: i64 = within(
        WAIT,
        "the starts",
        owner.query_one(
            "SELECT count(*) FROM pgtaskd.queue_starts WHERE queue = 'up'",
            &[],
        ),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(
        starts, 1,
        "the claim of a rate-limited queue wrote its start"
    );

    // The grant functions of schema 33 give the new roles the same.
    as_role(
        &owner,
        &roles.name("new_ops"),
        "SELECT pgtaskd.set_queue('up', '{\"max_running\": null}')",
    )
    .await
    .expect("an operator role of schema 33 sets the limits");
    as_role(
        &owner,
        &roles.name("new_app"),
        "INSERT INTO pgtaskd.tasks (payload, queue, concurrency_key) VALUES ('n2', 'up', 't2')",
    )
    .await
    .expect("a producer role of schema 33 sets a key");
}

/// Schema 34 replaces `write_parked` in place: a result parked at schema 33 is kept, and the
/// daemon role of schema 33 writes it through the new function.
#[tokio::test]
async fn schema_34_keeps_parked_results_and_the_old_daemon_role_writes_them() {
    let roles = Roles::new("pk");
    let setup = "INSERT INTO pgtaskd.tasks (payload) VALUES ('parked');
         UPDATE pgtaskd.tasks SET status = 'RUNNING', attempt = 1, lease_owner = 'gone',
                lease_expires_at = now() - interval '1 s', started_at = now(),
                claim_token = 77 WHERE id = 1;
         INSERT INTO pgtaskd.parked_results (task_id, claim_token, status, words, bytes, runes)
              VALUES (1, 77, 'SUCCEEDED', 1, 6, 6);";
    let (_db, owner) = upgrade_with_roles(33, &roles, setup).await;
    let written = as_role(
        &owner,
        &roles.name("old_daemon"),
        "SELECT task_id, task_status FROM pgtaskd.write_parked(10, 'new')",
    )
    .await
    .expect("the daemon role of schema 33 writes parked results");
    let written: Vec<(i64, String)> = written.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(written, [(1, "SUCCEEDED".to_string())]);
    let left: i64 = within(
        WAIT,
        "the parked results left",
        owner.query_one("SELECT count(*) FROM pgtaskd.parked_results", &[]),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(left, 0, "a written result stays parked");
}

/// Schema 35 bounds a queue's `retain` at 100 years: a longer one written at schema 34 is
/// brought down to it, and retention works again.
#[tokio::test]
async fn schema_35_brings_a_retain_over_100_years_down_to_it() {
    let roles = Roles::new("rt");
    let setup = "SELECT pgtaskd.set_queue('far', '{\"retain\": \"10000 years\"}');
                 SELECT pgtaskd.set_queue('near', '{\"retain\": \"1 day\"}');";
    let (_db, owner) = upgrade_with_roles(34, &roles, setup).await;
    let retains: Vec<(String, String)> = within(
        WAIT,
        "the retains",
        owner.query(
            "SELECT queue, retain::text FROM pgtaskd.queue_settings ORDER BY queue",
            &[],
        ),
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    assert_eq!(
        retains,
        [
            ("far".to_string(), "100 years".to_string()),
            ("near".to_string(), "1 day".to_string())
        ]
    );
    within(
        WAIT,
        "retention",
        owner.query("SELECT * FROM pgtaskd.prune(1000, 1000, NULL)", &[]),
    )
    .await
    .expect("retention works again");
}

/// Schema 37 gives the roles of schema 36 what dependencies take: a producer names parents
/// and inserts graphs, a daemon's finish of a parent releases its child, an operator retries
/// with dependents and audits.
#[tokio::test]
async fn schema_37_gives_the_roles_of_schema_36_the_dependencies() {
    let roles = Roles::new("dp");
    let (_db, owner) = upgrade_with_roles(36, &roles, "").await;
    for app in ["old_app", "new_app"] {
        let rows = as_role(
            &owner,
            &roles.name(app),
            &format!("INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('parent', 'dp_{app}') RETURNING id"),
        )
        .await
        .expect("a producer inserts");
        let parent: i64 = rows[0].get(0);
        as_role(
            &owner,
            &roles.name(app),
            &format!(
                "INSERT INTO pgtaskd.tasks (payload, queue, depends_on, on_dep_failure) \
                 VALUES ('child', 'dp_{app}', ARRAY[{parent}::bigint], 'run')"
            ),
        )
        .await
        .unwrap_or_else(|err| panic!("{app} names parents: {err:?}"));
        as_role(
            &owner,
            &roles.name(app),
            r#"SELECT * FROM pgtaskd.enqueue_graph('[{"ref": "a", "payload": "x", "queue": "other"}]')"#,
        )
        .await
        .unwrap_or_else(|err| panic!("{app} inserts a graph: {err:?}"));
    }
    for (daemon, app) in [("old_daemon", "old_app"), ("new_daemon", "new_app")] {
        let claimed = as_role(
            &owner,
            &roles.name(daemon),
            &format!(
                "SELECT task_id, task_claim FROM pgtaskd.claim(ARRAY['dp_{app}'], 1, 'd', 60000, \
                 1048576, true, 1048576, NULL, NULL) WHERE task_id IS NOT NULL"
            ),
        )
        .await
        .unwrap_or_else(|err| panic!("{daemon} claims: {err:?}"));
        let (id, token): (i64, i64) = (claimed[0].get(0), claimed[0].get(1));
        as_role(
            &owner,
            &roles.name(daemon),
            &format!(
                "SELECT * FROM pgtaskd.finish(ARRAY[{token}::bigint], ARRAY[{id}::bigint], \
                 ARRAY['FAILED'], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[0::bigint], \
                 ARRAY['bad'], ARRAY[NULL::text], ARRAY[NULL::float8], true)"
            ),
        )
        .await
        .unwrap_or_else(|err| panic!("{daemon} finishes a parent: {err:?}"));
        let child: String = within(
            WAIT,
            "the child",
            owner.query_one(
                "SELECT status FROM pgtaskd.task_view WHERE $1 = ANY (depends_on)",
                &[&id],
            ),
        )
        .await
        .unwrap()
        .get(0);
        assert_eq!(
            child, "QUEUED",
            "{daemon}: the child runs after its parent failed"
        );
    }
    for ops in ["old_ops", "new_ops"] {
        as_role(
            &owner,
            &roles.name(ops),
            "SELECT * FROM pgtaskd.check_deps()",
        )
        .await
        .unwrap_or_else(|err| panic!("{ops} audits: {err:?}"));
        as_role(
            &owner,
            &roles.name(ops),
            "SELECT * FROM pgtaskd.retry_with_dependents(1)",
        )
        .await
        .unwrap_or_else(|err| panic!("{ops} retries with dependents: {err:?}"));
    }
}
