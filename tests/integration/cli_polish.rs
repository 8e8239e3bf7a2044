//! The command line as an operator meets it, through the real binary: `check-config` checks
//! what `run` checks, `--database-url` and its precedence, connection errors that name the
//! server, plain-word configuration errors, completions and the manual page.

use crate::support::daemon::{pgtaskd, tempfile_path::TempPath};

/// Run `pgtaskd ARGS --config FILE` with `toml` as the file.
async fn with_config(toml: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let config = TempPath::write(toml);
    let path = config.path().to_string_lossy().to_string();
    let mut all = args.to_vec();
    all.extend(["--config", &path]);
    let (status, stdout, stderr) = pgtaskd(None, &all).await;
    (status.code(), stdout, stderr)
}

#[tokio::test]
async fn a_log_level_that_is_not_a_filter_exits_78_for_check_config_and_run() {
    for args in [&["check-config"][..], &["run"]] {
        let (code, stdout, stderr) = with_config("[log]\nlevel = \"verbose\"\n", args).await;
        assert_eq!(code, Some(78), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains("\"verbose\" is not a level"), "{stderr}");
        assert!(stderr.contains("line 2"), "{stderr}");
    }
}
