//! Operators reading their queues: `list` shows the latest tasks newest first with its filters,
//! `stats` counts each queue and names the daemons, and both (and `status`) show a queue
//! name's control characters escaped.

use serde_json::Value;

use crate::queues::exec;
use crate::retry::one_task_per_state;
use crate::support::daemon::pgtaskd;
use crate::support::{GatedAnalyzer, InProcessDaemon, TestDb};

/// `pgtaskd ARGS --json`, one object per line.
async fn json_lines(url: &str, args: &[&str]) -> Vec<Value> {
    let (status, stdout, stderr) = pgtaskd(Some(url), args).await;
    assert!(status.success(), "{args:?}: {stderr}");
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn ids(rows: &[Value]) -> Vec<i64> {
    rows.iter().map(|row| row["id"].as_i64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_the_latest_tasks_newest_first_with_its_filters() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let [failed, canceled, queued, running, succeeded] = one_task_per_state(&client).await;
    let other: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('elsewhere', 'other') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    let all = json_lines(&db.url, &["list", "--json"]).await;
    assert_eq!(
        ids(&all),
        vec![other, succeeded, running, queued, canceled, failed]
    );
    assert_eq!(all[0]["queue"], "other");
    assert_eq!(all[0]["payload_bytes"], 9);
    assert!(all[0].get("payload").is_none(), "payloads are not listed");
    assert_eq!(all[5]["error"], "lease lost 3 times");

    let limited = json_lines(&db.url, &["list", "--json", "--limit", "2"]).await;
    assert_eq!(ids(&limited), vec![other, succeeded]);
    let default_queue = json_lines(&db.url, &["list", "--json", "--queue", "default"]).await;
    assert_eq!(ids(&default_queue).len(), 5);
    assert!(!ids(&default_queue).contains(&other));
    let failed_only = json_lines(&db.url, &["list", "--json", "--status", "failed"]).await;
    assert_eq!(ids(&failed_only), vec![failed]);
    let queued_other = json_lines(
        &db.url,
        &["list", "--json", "--status", "QUEUED", "--queue", "other"],
    )
    .await;
    assert_eq!(ids(&queued_other), vec![other]);
    let none = json_lines(&db.url, &["list", "--json", "--queue", "nowhere"]).await;
    assert!(none.is_empty());

    let (status, stdout, _) = pgtaskd(Some(&db.url), &["list"]).await;
    assert!(status.success());
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 7, "a header and six tasks: {stdout}");
    assert!(lines[0].contains("STATUS"), "{stdout}");
    assert!(
        lines[2].contains("SUCCEEDED") && lines[2].contains("words=1"),
        "{stdout}"
    );

    let (status, _, stderr) = pgtaskd(Some(&db.url), &["list", "--status", "done"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["list", "--limit", "0"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_counts_each_queue_from_a_known_table_and_names_the_daemons() {
    let db = TestDb::new().await;
    let client = db.client().await;
    exec(
        &client,
        "INSERT INTO pgtaskd.tasks (payload, queue, run_at, created_at)
              VALUES ('due', 'a', now() - interval '90 seconds', now() - interval '2 minutes'),
                     ('due', 'a', now(), now()),
                     ('later', 'a', now() + interval '1 hour', now());
         -- The other states: each task inserted, then its state row (pgtaskd.task_state,
         -- schema 36) set, the row of the id the insert just took.
         BEGIN;
         INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('r', 'a');
         UPDATE pgtaskd.task_state SET status = 'RUNNING', attempt = 1, lease_owner = 'x',
                lease_expires_at = now() + interval '1h', started_at = now()
          WHERE id = currval(pg_get_serial_sequence('pgtaskd.tasks', 'id'));
         INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('s', 'a');
         UPDATE pgtaskd.task_state SET status = 'SUCCEEDED', attempt = 1, words = 1, bytes = 1, runes = 1,
                finished_at = now() - interval '30 seconds'
          WHERE id = currval(pg_get_serial_sequence('pgtaskd.tasks', 'id'));
         INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('s', 'a');
         UPDATE pgtaskd.task_state SET status = 'SUCCEEDED', attempt = 1, words = 1, bytes = 1, runes = 1,
                finished_at = now() - interval '10 minutes'
          WHERE id = currval(pg_get_serial_sequence('pgtaskd.tasks', 'id'));
         INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('f', 'a');
         UPDATE pgtaskd.task_state SET status = 'FAILED', attempt = 3, error = 'e', finished_at = now() - interval '10 minutes'
          WHERE id = currval(pg_get_serial_sequence('pgtaskd.tasks', 'id'));
         INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('c', 'a');
         UPDATE pgtaskd.task_state SET status = 'CANCELED', cancel_requested = true, finished_at = now() - interval '20 seconds'
          WHERE id = currval(pg_get_serial_sequence('pgtaskd.tasks', 'id'));
         INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('old', 'a');
         UPDATE pgtaskd.task_state SET status = 'SUCCEEDED', attempt = 1, words = 1, bytes = 1, runes = 1,
                finished_at = now() - interval '2 hours'
          WHERE id = currval(pg_get_serial_sequence('pgtaskd.tasks', 'id'));
         INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('old', 'gone');
         UPDATE pgtaskd.task_state SET status = 'FAILED', attempt = 1, error = 'e', finished_at = now() - interval '2 hours'
          WHERE id = currval(pg_get_serial_sequence('pgtaskd.tasks', 'id'));
         COMMIT;
         SELECT pgtaskd.pause_queue('b');",
    )
    .await;

    let stats = stats_json(&db.url).await;
    let queues = stats["queues"].as_array().unwrap();
    assert_eq!(
        queues
            .iter()
            .map(|q| q["queue"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["a", "b"],
        "a queue with only old finished rows is not shown"
    );
    let a = &queues[0];
    assert_eq!(a["paused"], false);
    assert_eq!(a["queued"], 3);
    assert_eq!(a["due"], 2);
    let age = a["oldest_due_age_s"].as_f64().unwrap();
    assert!((90.0..120.0).contains(&age), "{age}");
    assert_eq!(a["running"], 1);
    assert_eq!(
        a["finished_last_minute"],
        serde_json::json!({"succeeded": 1, "failed": 0, "canceled": 1})
    );
    assert_eq!(
        a["finished_last_hour"],
        serde_json::json!({"succeeded": 2, "failed": 1, "canceled": 1})
    );
    let b = &queues[1];
    assert_eq!(b["paused"], true);
    assert!(b["paused_at"].is_string());
    assert_eq!(b["queued"], 0);
    assert_eq!(b["oldest_due_age_s"], Value::Null);
    assert_eq!(stats["daemons"], serde_json::json!([]));

    // A daemon serving another queue leaves these figures alone and is named.
    let config = db.config("[worker]\nqueues = [\"elsewhere\"]\n");
    let daemon = InProcessDaemon::start(&db, config, GatedAnalyzer::counting()).await;
    let stats = stats_json(&db.url).await;
    let daemons = stats["daemons"].as_array().unwrap();
    assert_eq!(daemons.len(), 1, "{stats}");
    assert!(daemons[0]["sessions"].as_i64().unwrap() >= 1);
    assert!(daemons[0]["instance"].as_str().unwrap().contains(':'));

    let (status, stdout, _) = pgtaskd(Some(&db.url), &["stats"]).await;
    assert!(status.success());
    assert!(stdout.contains("paused"), "{stdout}");
    assert!(stdout.contains("daemons: 1"), "{stdout}");
    daemon.stop().await;
}

/// `pgtaskd stats --json`: one pretty-printed object.
async fn stats_json(url: &str) -> Value {
    let (status, stdout, stderr) = pgtaskd(Some(url), &["stats", "--json"]).await;
    assert!(status.success(), "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

/// A queue name with an escape sequence (any producer may choose one) is shown escaped by
/// `list`, `stats`, `status`, `pause`, `resume` and `retry --queue`, so that it cannot drive the operator's terminal; the JSON
/// forms keep it exact.
#[tokio::test]
async fn list_stats_and_status_show_control_characters_of_a_queue_name_escaped() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let name = "evil\u{1b}[2J\u{7}";
    let id: i64 = client
        .query_one(
            "INSERT INTO pgtaskd.tasks (payload, queue) VALUES ('x', $1) RETURNING id",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    let id_text = id.to_string();
    for args in [
        &["list"][..],
        &["stats"],
        &["status", &id_text],
        &["pause", name],
        &["resume", name],
        &["retry", "--queue", name, "--failed"],
    ] {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), args).await;
        assert!(status.success(), "{args:?}: {stderr}");
        assert!(
            !stdout.contains(|c: char| c.is_control() && c != '\n'),
            "{args:?}: {stdout:?}"
        );
        assert!(
            stdout.contains("evil\\u{1b}[2J\\u{7}"),
            "{args:?}: {stdout}"
        );
    }
    let rows = json_lines(&db.url, &["list", "--json"]).await;
    assert_eq!(rows[0]["queue"], name);
    assert_eq!(stats_json(&db.url).await["queues"][0]["queue"], name);
}

/// `list --status` takes a status in any case and refuses another word with the five it
/// takes (exit 2), which the shell completions offer too; `status --json` is one line, as
/// `wait --json` and `list --json` are.
#[tokio::test]
async fn list_takes_a_status_in_any_case_completes_the_five_and_status_json_is_one_line() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let id = crate::support::enqueue(&client, "one line").await;
    for word in ["queued", "QUEUED", "Queued"] {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["list", "--status", word]).await;
        assert!(status.success(), "{word}: {stderr}");
        assert!(
            stdout.contains("one line") || stdout.contains(&id.to_string()),
            "{stdout}"
        );
    }
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["list", "--status", "done"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("queued, running, succeeded, failed, canceled"),
        "{stderr}"
    );
    let (status, completions, _) = pgtaskd(None, &["completions", "bash"]).await;
    assert!(status.success());
    assert!(
        completions.contains("queued running succeeded failed canceled"),
        "the completions offer the statuses"
    );
    let (status, stdout, stderr) =
        pgtaskd(Some(&db.url), &["status", &id.to_string(), "--json"]).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim_end().lines().count(), 1, "{stdout}");
    let json: Value = serde_json::from_str(stdout.trim_end()).unwrap();
    assert_eq!(json["id"], id);
}
