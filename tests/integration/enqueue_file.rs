//! `pgtaskd enqueue --file` streams a regular file to the database a chunk at a time: the
//! task's payload is the file to the byte, however its characters fall across the chunks; an
//! idempotency key works as with a payload in the command line; a file that is not UTF-8 is
//! refused and nothing is inserted.

use crate::support::daemon::pgtaskd;
use crate::support::{count, within, TestDb, WAIT};

/// A file of `text` repeated past several 1 MiB chunks, in a temporary directory.
fn large_file(dir: &std::path::Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn a_file_of_several_chunks_is_the_payload_to_the_byte_and_a_key_finds_it_again() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let dir = tempdir();
    // Three- and four-byte characters, so that chunk ends cut some of them.
    let text = "naïve 日本語 text 🦀 ".repeat(150_000);
    let path = large_file(&dir, "large.txt", text.as_bytes());

    let (status, stdout, stderr) = pgtaskd(
        Some(&db.url),
        &[
            "enqueue", "--file", &path, "--key", "file-1", "--queue", "files",
        ],
    )
    .await;
    assert!(status.success(), "{stderr}");
    let id: i64 = stdout.trim().parse().unwrap();
    let stored: String = within(
        WAIT,
        "the payload",
        client.query_one(
            "SELECT payload FROM pgtaskd.task_view WHERE id = $1",
            &[&id],
        ),
    )
    .await
    .unwrap()
    .get(0);
    assert_eq!(stored.len(), text.len());
    assert!(stored == text, "the payload differs from the file");

    // The same key and file again: the same task.
    let (status, stdout, stderr) = pgtaskd(
        Some(&db.url),
        &[
            "enqueue", "--file", &path, "--key", "file-1", "--queue", "files",
        ],
    )
    .await;
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim().parse::<i64>().unwrap(), id);
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        1
    );
}

#[tokio::test]
async fn a_file_that_is_not_utf8_is_refused_and_nothing_is_inserted() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let dir = tempdir();
    let mut bytes = "valid text ".repeat(200_000).into_bytes();
    bytes.extend_from_slice(b"\xff\xfe then more");
    let path = large_file(&dir, "latin1.txt", &bytes);
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["enqueue", "--file", &path]).await;
    assert_eq!(
        status.code(),
        Some(2),
        "a usage error, as HTTP's 400: {stderr}"
    );
    assert!(stderr.contains("not UTF-8"), "{stderr}");
    assert!(
        stderr.contains(&format!("offset {}", 200_000 * 11)),
        "{stderr}"
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
}

/// A directory of this test's own, removed when dropped.
struct TempDir(std::path::PathBuf);

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> TempDir {
    let dir = std::env::temp_dir().join(format!(
        "pgtaskd-enqueue-file-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// What is not a regular file (a device, a pipe) is read as it comes and refused at its first
/// NUL byte: `enqueue --file /dev/zero` ends at once (it read without bound, to gigabytes);
/// text that is not UTF-8 on standard input is refused with its offset; nothing is inserted.
#[tokio::test]
async fn a_device_or_pipe_is_refused_at_its_first_bad_byte_and_nothing_is_inserted() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let (status, _, stderr) = pgtaskd(Some(&db.url), &["enqueue", "--file", "/dev/zero"]).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("NUL"), "{stderr}");
    assert!(stderr.contains("byte 0 of /dev/zero"), "{stderr}");

    let mut command = tokio::process::Command::new(crate::support::daemon::binary());
    command
        .args(["enqueue", "-"])
        .env("PGTASKD_DATABASE_URL", &db.url)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"valid text \xff then more").await.unwrap();
    }
    let output = within(WAIT, "enqueue -", child.wait_with_output())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(2),
        "a usage error, as HTTP's 400: {stderr}"
    );
    assert!(stderr.contains("not UTF-8"), "{stderr}");
    assert!(stderr.contains("offset 11"), "{stderr}");
    assert_eq!(
        count(&client, "SELECT count(*) FROM pgtaskd.task_view").await,
        0
    );
}
