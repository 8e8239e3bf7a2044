//! What the process shows of itself, and who an `exec` handler's children run as.
//!
//! | item | owns |
//! | --- | --- |
//! | [`at_start`] | `PR_SET_DUMPABLE` 0: `/proc/PID/environ` and `/proc/PID/mem`, `ptrace` and `pidfd_getfd` closed to every process of the same user without `CAP_SYS_PTRACE`; the ambient capabilities cleared, so that no child inherits one |
//! | [`RunAs`], [`resolve`] | `[queues.NAME] user` and `group`, resolved to ids at config load |
//! | [`Identity`], [`permits`] | a user's ids, and what a file's mode bits let it do (the config's checks of `command`) |
//! | [`can_switch`] | whether this process may give a child other credentials and signal it: root, or `CAP_SETUID`, `CAP_SETGID` and `CAP_KILL` |
//!
//! The switch itself happens in the child, between the clone and the `execve`, with raw
//! system calls (`handler/exec/spawn.rs`).

use std::ffi::{CStr, CString};
use std::io;

use libc::{c_char, gid_t, uid_t};

/// First thing at start: make the process non-dumpable, and clear its ambient capabilities.
///
/// # Errors
///
/// A `prctl` call failing (they do not, on Linux 4.3 and later).
pub fn at_start() -> io::Result<()> {
    make_undumpable()?;
    clear_ambient_capabilities()
}

/// Clear the ambient capability set (`PR_CAP_AMBIENT_CLEAR_ALL`). A daemon given
/// `CAP_SETUID` and `CAP_SETGID` as ambient capabilities (systemd's `AmbientCapabilities=`,
/// to switch its children to a queue's `user`) keeps them in its effective set, where it
/// needs them; an ambient set would pass them on to every child through its `execve`, and a
/// child with `CAP_SETUID` can make itself root.
fn clear_ambient_capabilities() -> io::Result<()> {
    // SAFETY: a plain system call on the calling thread, the only one at start.
    let cleared = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if cleared != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Make the process non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`).
///
/// A process of the same user (an `exec` handler's child, above all) may otherwise read the
/// daemon's environment (`/proc/PID/environ`: the database URL and its password), its memory
/// (`/proc/PID/mem`: the password again, the session's keys), attach to it with `ptrace`, and
/// copy its descriptors with `pidfd_getfd` (the database sessions themselves). A non-dumpable
/// process's `/proc` entries belong to root, and every one of these needs `CAP_SYS_PTRACE`
/// then. No core file is written either. A child gets a dumpable process again at its `execve`.
///
/// # Errors
///
/// The `prctl` call failing (it does not, on Linux).
fn make_undumpable() -> io::Result<()> {
    // SAFETY: a plain system call on the calling process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Who an `exec` queue's children run as: `[queues.NAME] user` and `group`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// `user`, when given: the child's real, effective and saved uid, and its `HOME`, `USER`
    /// and `LOGNAME`.
    pub user: Option<User>,
    /// The child's real, effective and saved gid: `group`'s, else the user's primary group.
    pub gid: gid_t,
    /// The child's supplementary groups: the user's (`getgrouplist`, `gid` among them) when
    /// `user` is given, else `gid` alone.
    pub groups: Vec<gid_t>,
}

/// A user of the system's database (`getpwnam`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: uid_t,
    /// Its primary group.
    pub gid: gid_t,
    /// Its home directory.
    pub home: String,
}

/// Who checks a file's mode bits: a uid, a gid and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: uid_t,
    pub gid: gid_t,
    pub groups: Vec<gid_t>,
}

impl Identity {
    /// This process's effective ids.
    pub fn current() -> Identity {
        // SAFETY: plain system calls; getgroups is given room for what it reports.
        unsafe {
            let n = libc::getgroups(0, std::ptr::null_mut());
            let mut groups = vec![0; n.max(0) as usize];
            let n = libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr());
            groups.truncate(n.max(0) as usize);
            Identity {
                uid: libc::geteuid(),
                gid: libc::getegid(),
                groups,
            }
        }
    }

    /// The ids a child of a queue with `run_as` (or none: the daemon's own) runs with.
    pub fn of_child(run_as: Option<&RunAs>) -> Identity {
        let current = Identity::current();
        match run_as {
            None => current,
            Some(run_as) => Identity {
                uid: run_as.user.as_ref().map_or(current.uid, |user| user.uid),
                gid: run_as.gid,
                groups: run_as.groups.clone(),
            },
        }
    }

    /// How messages name it: `user nobody (uid 65534, gid 65534)`.
    pub fn describe(&self) -> String {
        match user_name(self.uid) {
            Some(name) => format!("user {name} (uid {}, gid {})", self.uid, self.gid),
            None => format!("uid {} (gid {})", self.uid, self.gid),
        }
    }
}

/// Read, write and execute (search, for a directory), as the mode bits count them.
pub const READ: u32 = 4;
pub const EXECUTE: u32 = 1;

/// Whether `who` may `want` ([`READ`], [`EXECUTE`]) a file of `mode`, owned by `owner` and
/// `group`, by its mode bits (access control lists and mount options aside): root reads
/// anything and executes a file with any execute bit (a directory always); anyone else by
/// the owner's bits if it owns the file, else the group's if it is in the file's group, else
/// the others'.
pub fn permits(who: &Identity, mode: u32, owner: uid_t, group: gid_t, want: u32) -> bool {
    let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
    if who.uid == 0 {
        return want & EXECUTE == 0 || is_dir || mode & 0o111 != 0;
    }
    let bits = if who.uid == owner {
        (mode >> 6) & 7
    } else if who.gid == group || who.groups.contains(&group) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    bits & want == want
}

/// `user` and `group` of a queue, resolved: `Err` names which one the system does not know.
///
/// # Errors
///
/// `(true, message)` for an unknown user, `(false, message)` for an unknown group.
pub fn resolve(user: Option<&str>, group: Option<&str>) -> Result<RunAs, (bool, String)> {
    let user = match user {
        None => None,
        Some(name) => Some(
            lookup_user(name)
                .ok_or_else(|| (true, format!("there is no user {name:?} on this system")))?,
        ),
    };
    let gid = match group {
        None => None,
        Some(name) => Some(
            lookup_group(name)
                .ok_or_else(|| (false, format!("there is no group {name:?} on this system")))?,
        ),
    };
    let run_as = match (user, gid) {
        (Some(user), gid) => {
            let gid = gid.unwrap_or(user.gid);
            let groups = group_list(&user.name, gid);
            RunAs {
                user: Some(user),
                gid,
                groups,
            }
        }
        (None, Some(gid)) => RunAs {
            user: None,
            gid,
            groups: vec![gid],
        },
        (None, None) => {
            let current = Identity::current();
            RunAs {
                user: None,
                gid: current.gid,
                groups: current.groups,
            }
        }
    };
    Ok(run_as)
}

/// Whether this process may switch a child to other credentials and stop it after: `setgroups`
/// and `setresgid` need `CAP_SETGID`; with `user`, `setresuid` needs `CAP_SETUID`, and the
/// SIGTERM and SIGKILL of a timeout or a cancel, to a process of another user, `CAP_KILL`; all
/// in its effective set (root has them, unless its bounding set took them away).
///
/// # Errors
///
/// What is missing, for a message.
pub fn can_switch(user: bool) -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = effective_capabilities(&status).unwrap_or(0);
    missing(effective, user).map_or(Ok(()), Err)
}

/// `CAP_KILL`, `CAP_SETGID` and `CAP_SETUID`'s bits.
const CAP_KILL: u64 = 1 << 5;
const CAP_SETGID: u64 = 1 << 6;
const CAP_SETUID: u64 = 1 << 7;

/// What `effective` lacks to switch a child (its uid too when `user`) and signal it, in words.
fn missing(effective: u64, user: bool) -> Option<String> {
    let needed = [
        (CAP_SETUID, "CAP_SETUID", user),
        (CAP_SETGID, "CAP_SETGID", true),
        (CAP_KILL, "CAP_KILL", user),
    ];
    let lacking: Vec<&str> = needed
        .iter()
        .filter(|(bit, _, needed)| *needed && effective & bit == 0)
        .map(|(_, name, _)| *name)
        .collect();
    match lacking.split_last() {
        None => None,
        Some((last, [])) => Some((*last).to_string()),
        Some((last, rest)) => Some(format!("{} and {last}", rest.join(", "))),
    }
}

/// The `CapEff:` line of `/proc/self/status`, read.
fn effective_capabilities(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
}

/// The name of `uid`, when the system has one.
pub fn user_name(uid: uid_t) -> Option<String> {
    with_buffer(|buf, len| {
        // SAFETY: getpwuid_r writes into `pwd` and `buf` (of `len` bytes) alone.
        unsafe {
            let mut pwd: libc::passwd = std::mem::zeroed();
            let mut found = std::ptr::null_mut();
            let code = libc::getpwuid_r(uid, &mut pwd, buf, len, &mut found);
            (code, (!found.is_null()).then(|| text(pwd.pw_name)))
        }
    })
}

fn lookup_user(name: &str) -> Option<User> {
    let c_name = CString::new(name).ok()?;
    with_buffer(|buf, len| {
        // SAFETY: getpwnam_r writes into `pwd` and `buf` (of `len` bytes) alone.
        unsafe {
            let mut pwd: libc::passwd = std::mem::zeroed();
            let mut found = std::ptr::null_mut();
            let code = libc::getpwnam_r(c_name.as_ptr(), &mut pwd, buf, len, &mut found);
            let user = (!found.is_null()).then(|| User {
                name: text(pwd.pw_name),
                uid: pwd.pw_uid,
                gid: pwd.pw_gid,
                home: text(pwd.pw_dir),
            });
            (code, user)
        }
    })
}

fn lookup_group(name: &str) -> Option<gid_t> {
    let c_name = CString::new(name).ok()?;
    with_buffer(|buf, len| {
        // SAFETY: getgrnam_r writes into `grp` and `buf` (of `len` bytes) alone.
        unsafe {
            let mut grp: libc::group = std::mem::zeroed();
            let mut found = std::ptr::null_mut();
            let code = libc::getgrnam_r(c_name.as_ptr(), &mut grp, buf, len, &mut found);
            (code, (!found.is_null()).then_some(grp.gr_gid))
        }
    })
}

/// `user`'s groups, `gid` among them (`getgrouplist`).
fn group_list(user: &str, gid: gid_t) -> Vec<gid_t> {
    let Ok(c_user) = CString::new(user) else {
        return vec![gid];
    };
    let mut groups: Vec<gid_t> = vec![0; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `groups` has room for `n` ids; getgrouplist says how many it needs if not.
        let got = unsafe { libc::getgrouplist(c_user.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if got >= 0 {
            groups.truncate(n.max(0) as usize);
            return groups;
        }
        if groups.len() >= 65_536 {
            return vec![gid];
        }
        groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
    }
}

/// Call `lookup` with a buffer, larger while it answers ERANGE.
fn with_buffer<T>(
    mut lookup: impl FnMut(*mut c_char, usize) -> (libc::c_int, Option<T>),
) -> Option<T> {
    let mut buf: Vec<c_char> = vec![0; 4096];
    loop {
        let (code, found) = lookup(buf.as_mut_ptr(), buf.len());
        if code == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        return found;
    }
}

/// A C string of the system's databases, as UTF-8 (lossy).
///
/// # Safety
///
/// `ptr` is null or a NUL-terminated string.
unsafe fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    CStr::from_ptr(ptr).to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(uid: uid_t, gid: gid_t, groups: &[gid_t]) -> Identity {
        Identity {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn the_mode_bits_of_the_owner_the_group_or_the_others_decide() {
        let file = libc::S_IFREG;
        let alice = who(1000, 1000, &[1000, 50]);
        // The owner's bits, even where the others' would allow more.
        assert!(permits(&alice, file | 0o700, 1000, 0, EXECUTE));
        assert!(!permits(&alice, file | 0o077, 1000, 0, READ));
        // The group's: primary or supplementary.
        assert!(permits(&alice, file | 0o750, 0, 50, READ | EXECUTE));
        assert!(!permits(&alice, file | 0o705, 0, 50, READ));
        // The others'.
        assert!(!permits(&alice, file | 0o700, 0, 0, EXECUTE));
        assert!(permits(&alice, file | 0o711, 0, 0, EXECUTE));
        assert!(!permits(&alice, file | 0o711, 0, 0, READ));
        // Root reads anything, and executes a file with any execute bit.
        let root = who(0, 0, &[]);
        assert!(permits(&root, file, 1000, 1000, READ));
        assert!(permits(&root, file | 0o010, 1000, 1000, EXECUTE));
        assert!(!permits(&root, file | 0o644, 1000, 1000, EXECUTE));
        assert!(permits(&root, libc::S_IFDIR, 1000, 1000, EXECUTE));
    }

    #[test]
    fn switching_needs_setgid_and_for_a_user_setuid_too() {
        let status = "Name:\tpgtaskd\nCapInh:\t0000000000000000\nCapEff:\t00000000000000e0\n";
        assert_eq!(effective_capabilities(status), Some(0xe0));
        assert_eq!(effective_capabilities("Name:\tx\n"), None);
        assert_eq!(missing(0xe0, true), None);
        assert_eq!(missing(CAP_SETGID, false), None);
        assert_eq!(
            missing(CAP_SETGID | CAP_KILL, true).as_deref(),
            Some("CAP_SETUID")
        );
        assert_eq!(
            missing(CAP_SETGID | CAP_SETUID, true).as_deref(),
            Some("CAP_KILL")
        );
        assert_eq!(missing(0, false).as_deref(), Some("CAP_SETGID"));
        assert_eq!(
            missing(0, true).as_deref(),
            Some("CAP_SETUID, CAP_SETGID and CAP_KILL")
        );
    }

    #[test]
    fn names_resolve_to_ids_and_unknown_ones_are_refused() {
        let root = resolve(Some("root"), None).unwrap();
        let user = root.user.as_ref().unwrap();
        assert_eq!((user.uid, user.gid, root.gid), (0, 0, 0));
        assert!(root.groups.contains(&0), "{:?}", root.groups);
        let grouped = resolve(Some("root"), Some("root")).unwrap();
        assert_eq!(grouped.gid, 0);
        let group_only = resolve(None, Some("root")).unwrap();
        assert_eq!((group_only.user, group_only.groups), (None, vec![0]));
        let (is_user, said) = resolve(Some("no-such-user-pgtaskd"), None).unwrap_err();
        assert!(
            is_user && said.contains("no user \"no-such-user-pgtaskd\""),
            "{said}"
        );
        let (is_user, said) = resolve(None, Some("no-such-group-pgtaskd")).unwrap_err();
        assert!(!is_user && said.contains("no group"), "{said}");
        assert!(resolve(Some("a\0b"), None).is_err());
    }
}
