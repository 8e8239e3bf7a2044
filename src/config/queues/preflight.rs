//! What would fail every task of a queue, checked before the first (`run` and
//! `check-config`): an exec program its children cannot run (the mode bits of the file and of
//! each directory on the way, as the user and groups they run as; a script's `#!`
//! interpreter), and an http `url` without its host or with port 0 (docs/configuration.md,
//! "[queues.NAME]").

use std::path::Path;

use crate::privileges::{permits, Identity, EXECUTE, READ};

/// `command` names a program; with `runs_as` (the commands that start it), the child, with
/// those ids, can run it: a path as given, or the first such file of a bare name on `PATH`,
/// as the child's `execve` finds it (see [`runnable`]).
pub(super) fn check_program(
    command: &[String],
    key: &str,
    runs_as: Option<&Identity>,
) -> Result<(), String> {
    let Some(program) = command.first().filter(|p| !p.is_empty()) else {
        return Err(format!(
            "{key} is empty: write the program and its arguments, [\"/path/to/program\", \"arg\"]"
        ));
    };
    if let Some(n) = command.iter().position(|word| word.contains('\0')) {
        let word = n + 1;
        return Err(format!("{key} holds a NUL character (in word {word})"));
    }
    let Some(who) = runs_as else {
        return Ok(());
    };
    if program.contains('/') {
        return runnable(Path::new(program), who).map_err(|why| format!("{key}: {why}"));
    }
    // As the child's lookup: the first file of the name that it can run; the first refusal
    // of one that exists when none can.
    let mut refused = None;
    for dir in std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let candidate = dir.join(program);
        if !candidate.is_file() {
            continue;
        }
        match runnable(&candidate, who) {
            Ok(()) => return Ok(()),
            Err(why) => {
                refused.get_or_insert(why);
            }
        }
    }
    Err(match refused {
        Some(why) => format!("{key}: {why}"),
        None => format!("{key}: {program} is not an executable file on PATH; give its full path"),
    })
}

/// Whether `who` can run the file at `path`, by the mode bits (`privileges::permits`) of
/// the file and of every directory on the way to it: an executable regular file, readable
/// too when it is not a binary (an interpreter reads a script, `#!` or not), and a `#!` line
/// naming an interpreter that exists and that `who` can run. Without these every task would
/// fail, "Permission denied", or "No such file or directory" for a file that exists.
fn runnable(path: &Path, who: &Identity) -> Result<(), String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let Some(meta) = std::fs::metadata(path).ok().filter(|meta| meta.is_file()) else {
        return Err(format!("{shown} is not an executable file"));
    };
    let mode = |meta: &std::fs::Metadata| {
        format!(
            "mode {:04o}, owner uid {}, group gid {}",
            meta.mode() & 0o7777,
            meta.uid(),
            meta.gid()
        )
    };
    let who_text = who.describe();
    if let Ok(real) = std::fs::canonicalize(path) {
        for dir in real.ancestors().skip(1) {
            let Ok(dir_meta) = std::fs::metadata(dir) else {
                continue;
            };
            if !permits(
                who,
                dir_meta.mode(),
                dir_meta.uid(),
                dir_meta.gid(),
                EXECUTE,
            ) {
                return Err(format!(
                    "{shown} is out of reach of {who_text}: it may not enter {} ({})",
                    dir.display(),
                    mode(&dir_meta)
                ));
            }
        }
    }
    if !permits(who, meta.mode(), meta.uid(), meta.gid(), EXECUTE) {
        return Err(format!(
            "{shown} is not executable by {who_text} ({})",
            mode(&meta)
        ));
    }
    // The daemon may not read it where the child would not; then nothing more is known.
    let mut head = Vec::with_capacity(256);
    let Ok(_) = std::fs::File::open(path).and_then(|file| file.take(256).read_to_end(&mut head))
    else {
        return Ok(());
    };
    if head.starts_with(b"\x7fELF") {
        return Ok(());
    }
    if !permits(who, meta.mode(), meta.uid(), meta.gid(), READ) {
        return Err(format!(
            "{shown} is a script, which its interpreter must read, and {who_text} may not ({})",
            mode(&meta)
        ));
    }
    let Some(interpreter) = interpreter(&head) else {
        return Ok(());
    };
    let interpreter_path = Path::new(&interpreter);
    let Some(interpreter_meta) = std::fs::metadata(interpreter_path)
        .ok()
        .filter(|meta| meta.is_file())
    else {
        return Err(format!(
            "{shown} names {interpreter} on its #! line, which is not an executable file: \
             every task would fail \"No such file or directory\""
        ));
    };
    if !permits(
        who,
        interpreter_meta.mode(),
        interpreter_meta.uid(),
        interpreter_meta.gid(),
        EXECUTE,
    ) {
        return Err(format!(
            "{shown} names {interpreter} on its #! line, which is not executable by {who_text} ({})",
            mode(&interpreter_meta)
        ));
    }
    Ok(())
}

/// The interpreter a `#!` first line names, as the kernel reads it: after `#!` and any blanks,
/// up to the next blank or the end of the line; `None` without such a line.
pub(super) fn interpreter(head: &[u8]) -> Option<String> {
    let rest = head.strip_prefix(b"#!")?;
    let line = rest.split(|b| *b == b'\n').next()?;
    let name: Vec<u8> = line
        .iter()
        .copied()
        .skip_while(|b| *b == b' ' || *b == b'\t')
        .take_while(|b| !matches!(b, b' ' | b'\t' | b'\r'))
        .collect();
    (!name.is_empty()).then(|| String::from_utf8_lossy(&name).into_owned())
}

/// An absolute `http://` or `https://` URL with a host, as the handler's client parses it
/// (a port over 65535 included).
pub(super) fn check_url(url: &str, key: &str) -> Result<(), String> {
    let shown = crate::handler::http::shown_url(url);
    let parsed =
        reqwest::Url::parse(url).map_err(|err| format!("{key} {shown:?} is not a URL: {err}"))?;
    match (parsed.scheme(), parsed.host_str()) {
        ("http" | "https", Some(host)) if !host.is_empty() => {}
        _ => {
            return Err(format!(
                "{key} {shown:?} is not an http:// or https:// URL with a host"
            ))
        }
    }
    // The parser takes `http:///x`, `http:x` and `http:\\x` as host `x`: a host missing
    // between the slashes would be one taken from the path.
    let after_scheme = url
        .trim_start()
        .get(parsed.scheme().len() + 1..)
        .unwrap_or_default();
    let authority = after_scheme.strip_prefix("//").unwrap_or("/");
    if authority.starts_with(['/', '\\']) || !after_scheme.starts_with("//") {
        return Err(format!(
            "{key} has no host right after \"{}://\", and would be read as host {:?}: write \
             {}://HOST/PATH",
            parsed.scheme(),
            parsed.host_str().unwrap_or_default(),
            parsed.scheme()
        ));
    }
    if parsed.port() == Some(0) {
        return Err(format!(
            "{key} {shown:?} has port 0, which no server listens on"
        ));
    }
    Ok(())
}
