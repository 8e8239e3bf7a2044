//! What an `exec` handler's child is given to `execve`, all built before the clone (the child
//! allocates nothing): its argv and environment as NUL-terminated C strings, the paths it
//! tries for the program (a bare name looked up on the child's own `PATH`, as `execvp` does),
//! and the argv for `/bin/sh` when the kernel cannot run a candidate (`ENOEXEC`: a script
//! without a `#!` line), as `execvp` builds it.

use std::ffi::{CStr, CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::ptr;

use libc::c_char;

/// The directories searched for a bare program name when the child has no `PATH`, as glibc's
/// `execvp` does.
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// The shell that runs a file the kernel cannot (`ENOEXEC`), as `execvp`'s `_PATH_BSHELL`.
pub(super) static SHELL: &CStr = c"/bin/sh";

/// The paths the child tries: `program` itself when it holds a `/`, else `DIR/program` for
/// each directory of the child's `PATH` (an empty one is the current directory).
pub(super) fn candidates(program: &str, env: &[(OsString, OsString)]) -> io::Result<Vec<CString>> {
    if program.contains('/') {
        return Ok(vec![c_string(program.as_bytes().to_vec())?]);
    }
    if program.is_empty() {
        return Ok(Vec::new());
    }
    let path = env
        .iter()
        .rev()
        .find(|(name, _)| name == "PATH")
        .map_or(DEFAULT_PATH, |(_, value)| value.as_bytes());
    path.split(|b| *b == b':')
        .map(|dir| {
            let dir = if dir.is_empty() { b".".as_slice() } else { dir };
            let mut full = Vec::with_capacity(dir.len() + program.len() + 1);
            full.extend_from_slice(dir);
            full.push(b'/');
            full.extend_from_slice(program.as_bytes());
            c_string(full)
        })
        .collect()
}

/// The argv for [`SHELL`] when a candidate is a file the kernel cannot run, as `execvp`
/// builds it: the shell, the candidate (slot 1, null here: the child sets it), then `argv`
/// after its `argv[0]`, with its terminating null.
pub(super) fn shell_argv(argv: &[*const c_char]) -> Vec<*const c_char> {
    let mut shell = Vec::with_capacity(argv.len() + 1);
    shell.push(SHELL.as_ptr());
    shell.push(ptr::null());
    shell.extend_from_slice(argv.get(1..).unwrap_or(&[ptr::null()]));
    shell
}

pub(super) fn c_string(bytes: Vec<u8>) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a NUL byte in the command or its environment",
        )
    })
}

pub(super) fn null_terminated(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(value: &str) -> Vec<(OsString, OsString)> {
        vec![
            ("HOME".into(), "/home/x".into()),
            ("PATH".into(), value.into()),
        ]
    }

    #[test]
    fn a_bare_name_is_looked_up_on_the_childs_path() {
        assert_eq!(
            candidates("wc", &path("/a::/b/")).unwrap(),
            [c"/a/wc", c"./wc", c"/b//wc"]
        );
        assert_eq!(candidates("wc", &[]).unwrap(), [c"/bin/wc", c"/usr/bin/wc"]);
    }

    #[test]
    fn the_shells_argv_is_the_shell_the_file_and_the_arguments() {
        let argv = [
            c"prog".as_ptr(),
            c"a b".as_ptr(),
            c"c".as_ptr(),
            ptr::null(),
        ];
        let shell = shell_argv(&argv);
        assert_eq!(shell.len(), 5);
        assert_eq!(shell[0], SHELL.as_ptr());
        assert!(shell[1].is_null(), "the child's slot for the file");
        assert_eq!(&shell[2..], &argv[1..]);
        let alone = shell_argv(&[c"prog".as_ptr(), ptr::null()]);
        assert_eq!(alone, [SHELL.as_ptr(), ptr::null(), ptr::null()]);
    }

    #[test]
    fn a_name_with_a_slash_is_taken_as_it_is() {
        assert_eq!(candidates("/x/wc", &path("/a")).unwrap(), [c"/x/wc"]);
        assert_eq!(candidates("bin/wc", &path("/a")).unwrap(), [c"bin/wc"]);
        assert!(candidates("", &path("/a")).unwrap().is_empty());
        assert!(candidates("w\0c", &path("/a")).is_err());
    }
}
