//! `sql/schema.sql` is the schema the migrations leave: a database migrated with
//! `pgtaskd::db::migrate::migrate` and one that loaded the file have the same
//! `pg_dump --schema-only` of the schema `pgtaskd` (tables, columns, defaults, constraints,
//! storage parameters, indexes, sequences, functions with their bodies and SET clauses,
//! triggers, comments and privileges), the same sequence states, and grant the same rights
//! through `grant_producer`, `grant_daemon` and `grant_operator`. Rows of
//! `pgtaskd.schema_migrations` are not compared: the file records no version.
//!
//! Each test runs on a cluster of its own: roles are cluster-wide, and `pg_dump` must be the
//! server's own version.

use std::collections::BTreeMap;

use crate::support::{within, Cluster, TestDb, WAIT};

const SCHEMA_FILE: &str = include_str!("../../sql/schema.sql");

/// The roles the grant functions are run for, in both databases: their grants are part of
/// what is compared.
const GRANTS: &[(&str, &str)] = &[
    ("grant_producer", "schema_file_producer"),
    ("grant_daemon", "schema_file_daemon"),
    ("grant_operator", "schema_file_operator"),
];

/// A fresh database on `cluster` holding what `sql/schema.sql` creates.
async fn loaded_on(cluster: &Cluster) -> TestDb {
    let db = TestDb::empty_on(cluster).await;
    let client = db.client().await;
    within(WAIT, "sql/schema.sql", client.batch_execute(SCHEMA_FILE))
        .await
        .unwrap_or_else(|err| panic!("sql/schema.sql does not load: {err:?}"));
    db
}

/// Run the three grant functions in `db`, for the roles of [`GRANTS`].
async fn grant_roles(db: &TestDb) {
    let client = db.client().await;
    for (function, role) in GRANTS {
        within(
            WAIT,
            function,
            client.batch_execute(&format!("SELECT pgtaskd.{function}('{role}')")),
        )
        .await
        .unwrap_or_else(|err| panic!("pgtaskd.{function} fails in {}: {err:?}", db.name));
    }
}

/// The schema `pgtaskd` of `db` as `pg_dump --schema-only` writes it, cut into its objects
/// (pg_dump heads each with `-- Name: ...; Type: ...`), with the sequences' states as one
/// object more.
async fn catalog(cluster: &Cluster, db: &TestDb) -> BTreeMap<String, String> {
    let pg_dump = cluster.program("pg_dump");
    let output = within(
        WAIT,
        "pg_dump",
        tokio::process::Command::new(&pg_dump)
            .args(["--schema-only", "--no-owner", "--schema=pgtaskd"])
            .arg(format!("--dbname={}", db.url))
            .output(),
    )
    .await
    .unwrap_or_else(|err| {
        panic!(
            "cannot run {} ({err}): this test compares pg_dump's output; install PostgreSQL's \
             client programs beside the server's (Debian: apt-get install postgresql-15, \
             which brings /usr/lib/postgresql/15/bin/pg_dump)",
            pg_dump.display()
        )
    });
    assert!(
        output.status.success(),
        "{} failed: {}",
        pg_dump.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let mut objects = objects(&String::from_utf8_lossy(&output.stdout));

    let client = db.client().await;
    let states = within(
        WAIT,
        "the sequences",
        client.query(
            "SELECT sequencename::text, coalesce(last_value::text, 'never called')
               FROM pg_sequences WHERE schemaname = 'pgtaskd' ORDER BY 1",
            &[],
        ),
    )
    .await
    .unwrap();
    let states: Vec<String> = states
        .iter()
        .map(|row| format!("{} {}", row.get::<_, String>(0), row.get::<_, String>(1)))
        .collect();
    objects.insert("(sequence values)".to_string(), states.join("\n"));
    objects
}

/// A dump cut into objects by pg_dump's `-- Name:` headers, what comes before the first one
/// as `(preamble)`. Lines that differ from one dump to the next whatever the schema are left
/// out: `\restrict` and `\unrestrict` (a random key per dump since PostgreSQL 15.14) and the
/// versions of the server and of pg_dump.
fn objects(dump: &str) -> BTreeMap<String, String> {
    let mut objects = BTreeMap::new();
    let mut name = "(preamble)".to_string();
    let mut text = String::new();
    for line in dump.lines() {
        if line.starts_with("\\restrict ")
            || line.starts_with("\\unrestrict ")
            || line.starts_with("-- Dumped ")
        {
            continue;
        }
        if let Some(header) = line.strip_prefix("-- Name: ") {
            put(&mut objects, name, std::mem::take(&mut text));
            name = header.to_string();
            continue;
        }
        if line.is_empty() || line == "--" {
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    put(&mut objects, name, text);
    objects
}

fn put(objects: &mut BTreeMap<String, String>, name: String, text: String) {
    let mut key = name.clone();
    let mut n = 1;
    while objects.contains_key(&key) {
        n += 1;
        key = format!("{name} (#{n})");
    }
    objects.insert(key, text);
}

/// Every object that is only in one catalog or differs between the two, with the lines that
/// differ (`-` as the migrations leave it, `+` as sql/schema.sql has it).
fn differences(
    migrated: &BTreeMap<String, String>,
    loaded: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for (name, text) in migrated {
        match loaded.get(name) {
            None => found.push(format!("only after the migrations: {name}\n{text}")),
            Some(other) if other != text => {
                found.push(format!("differs: {name}\n{}", line_diff(text, other)))
            }
            Some(_) => {}
        }
    }
    for (name, text) in loaded {
        if !migrated.contains_key(name) {
            found.push(format!("only in sql/schema.sql: {name}\n{text}"));
        }
    }
    found
}

/// The lines of `a` and `b` outside their longest common subsequence, in order.
fn line_diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // common[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut common = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] {
                common[i + 1][j + 1] + 1
            } else {
                common[i + 1][j].max(common[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = String::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j == b.len() || (i < a.len() && common[i + 1][j] >= common[i][j + 1]) {
            out.push_str(&format!("- {}\n", a[i]));
            i += 1;
        } else {
            out.push_str(&format!("+ {}\n", b[j]));
            j += 1;
        }
    }
    out
}

/// A cluster with one database migrated and one that loaded sql/schema.sql, the roles of
/// [`GRANTS`] created.
async fn twins() -> (Cluster, TestDb, TestDb) {
    let cluster = Cluster::start();
    let migrated = TestDb::on(&cluster).await;
    let loaded = loaded_on(&cluster).await;
    let roles: String = GRANTS
        .iter()
        .map(|(_, role)| format!("CREATE ROLE {role};"))
        .collect();
    within(
        WAIT,
        "the roles",
        migrated.client().await.batch_execute(&roles),
    )
    .await
    .unwrap();
    (cluster, migrated, loaded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_file_is_the_schema_the_migrations_leave() {
    let (cluster, migrated, loaded) = twins().await;
    grant_roles(&migrated).await;
    grant_roles(&loaded).await;

    let expected = catalog(&cluster, &migrated).await;
    let found = catalog(&cluster, &loaded).await;
    assert!(
        expected.keys().any(|name| name.starts_with("claim(text[]")),
        "the dump holds the schema's objects: {:?}",
        expected.keys().collect::<Vec<_>>()
    );
    let differences = differences(&expected, &found);
    assert!(
        differences.is_empty(),
        "sql/schema.sql is not the schema the migrations leave (a migration changed the \
         schema without it, or it was edited alone): make it what the last migration leaves.\n\n{}",
        differences.join("\n")
    );

    // The file records no version: `run` refuses a database made from it.
    let client = loaded.client().await;
    let check = within(WAIT, "the check", pgtaskd::db::migrate::check(&client)).await;
    assert!(
        matches!(check, Err(pgtaskd::db::migrate::SchemaError::Missing)),
        "{check:?}"
    );
}

/// The comparison is not blind: a database that loaded sql/schema.sql and then changed one
/// thing (a function's body, a column, an index, a grant, a function's SET clause, a storage
/// parameter) differs from the migrated one, and the difference names that object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_comparison_notices_one_changed_body_column_index_or_grant() {
    let (cluster, migrated, _) = twins().await;
    let expected = catalog(&cluster, &migrated).await;
    let changes: &[(&str, &str, &str)] = &[
        (
            "a function's body",
            "CREATE OR REPLACE FUNCTION pgtaskd.cancel(task_id bigint) RETURNS text
             LANGUAGE sql AS $$ SELECT previous FROM pgtaskd.request_cancel(task_id) $$",
            "cancel(bigint); Type: FUNCTION",
        ),
        (
            "a column's default",
            "ALTER TABLE pgtaskd.tasks ALTER COLUMN max_attempts SET DEFAULT 5",
            "tasks; Type: TABLE",
        ),
        (
            "an index's predicate",
            "DROP INDEX pgtaskd.tasks_lease_idx;
             CREATE INDEX tasks_lease_idx ON pgtaskd.task_state (lease_expires_at)",
            "tasks_lease_idx; Type: INDEX",
        ),
        (
            "a grant",
            "GRANT EXECUTE ON FUNCTION pgtaskd.retry(bigint) TO PUBLIC",
            "FUNCTION retry(task_id bigint); Type: ACL",
        ),
        (
            "a SET clause",
            "ALTER FUNCTION pgtaskd.prune(float8, bigint, timestamptz) RESET jit",
            "prune(double precision, bigint, timestamp with time zone); Type: FUNCTION",
        ),
        (
            "a storage parameter",
            "ALTER TABLE pgtaskd.tasks RESET (vacuum_truncate)",
            "tasks; Type: TABLE",
        ),
    ];
    for (what, change, object) in changes {
        let changed = loaded_on(&cluster).await;
        within(WAIT, what, changed.client().await.batch_execute(change))
            .await
            .unwrap_or_else(|err| panic!("{what}: {err:?}"));
        let differences = differences(&expected, &catalog(&cluster, &changed).await);
        assert!(
            differences.iter().any(|d| d.contains(object)),
            "{what} is noticed in {object}: {differences:#?}"
        );
    }
}
