//! What libpq would take for the settings a connection string leaves unset: first its
//! environment variables (`PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`,
//! `PGCONNECT_TIMEOUT`; `PGHOST` and `PGPORT` may be comma-separated lists, as in libpq, an
//! empty port meaning 5432), then its defaults (the Unix socket in `/var/run/postgresql` or `/tmp`
//! when one is there, else `localhost`; the operating-system user, from the password database
//! as libpq does). Port 5432 and a database named like the user are tokio-postgres's own
//! defaults already.

use std::path::Path;
use std::str::FromStr;

use tokio_postgres::config::Host;
use tokio_postgres::Config;

use super::conninfo::quote;

/// Fill what the connection string left unset from libpq's environment variables, read
/// through `env`.
pub(super) fn apply_env(
    config: &mut Config,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), tokio_postgres::Error> {
    // Whatever the string sets wins; the rest goes through the same parser as a string would,
    // so that an environment value means exactly what libpq makes of it.
    let unset = [
        ("PGHOST", "host", config.get_hosts().is_empty()),
        ("PGPORT", "port", config.get_ports().is_empty()),
        ("PGUSER", "user", config.get_user().is_none()),
        ("PGPASSWORD", "password", config.get_password().is_none()),
        ("PGDATABASE", "dbname", config.get_dbname().is_none()),
        (
            "PGCONNECT_TIMEOUT",
            "connect_timeout",
            config.get_connect_timeout().is_none(),
        ),
    ];
    let extra: Vec<String> = unset
        .into_iter()
        .filter(|(_, _, unset)| *unset)
        .filter_map(|(var, key, _)| env(var).map(|value| quote(key, &value)))
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    let from_env = Config::from_str(&extra.join(" "))?;
    for host in from_env.get_hosts() {
        match host {
            Host::Tcp(name) => config.host(name),
            Host::Unix(path) => config.host_path(path),
        };
    }
    for port in from_env.get_ports() {
        config.port(*port);
    }
    if let Some(user) = from_env.get_user() {
        config.user(user);
    }
    if let Some(password) = from_env.get_password() {
        config.password(password);
    }
    if let Some(dbname) = from_env.get_dbname() {
        config.dbname(dbname);
    }
    if let Some(timeout) = from_env.get_connect_timeout() {
        config.connect_timeout(*timeout);
    }
    Ok(())
}

/// libpq's defaults for what neither the string nor the environment set.
pub(super) fn apply_defaults(config: &mut Config) {
    if config.get_hosts().is_empty() {
        let socket_dir = ["/var/run/postgresql", "/tmp"]
            .into_iter()
            .find(|dir| has_socket(dir, config.get_ports().first().copied()));
        match socket_dir {
            Some(dir) => config.host_path(dir),
            None => config.host("localhost"),
        };
    }
    if config.get_user().is_none() {
        let user = os_user()
            .or_else(|| std::env::var("USER").ok())
            .unwrap_or_else(|| "postgres".to_string());
        config.user(&user);
    }
}

/// The name of the effective operating-system user, as libpq takes it.
fn os_user() -> Option<String> {
    // SAFETY: getpwuid_r writes into the buffers given; the name is copied out before they go.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut buffer = vec![0 as libc::c_char; 4096];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            libc::geteuid(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || entry.pw_name.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(entry.pw_name)
            .to_str()
            .ok()
            .map(str::to_string)
    }
}

fn has_socket(dir: &str, port: Option<u16>) -> bool {
    Path::new(dir)
        .join(format!(".s.PGSQL.{}", port.unwrap_or(5432)))
        .exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_env(url: &str, vars: &[(&str, &str)]) -> Config {
        let mut config = Config::from_str(url).unwrap();
        let lookup = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        apply_env(&mut config, lookup).unwrap();
        config
    }

    #[test]
    fn environment_fills_what_the_string_left_unset() {
        let config = with_env(
            "postgres://app@db.example:6543/",
            &[
                ("PGHOST", "other"),
                ("PGPORT", "7000"),
                ("PGUSER", "nobody"),
                ("PGDATABASE", "jobs"),
                ("PGPASSWORD", "it's secret"),
            ],
        );
        assert_eq!(config.get_hosts(), &[Host::Tcp("db.example".into())]);
        assert_eq!(config.get_ports(), &[6543]);
        assert_eq!(config.get_user(), Some("app"));
        assert_eq!(config.get_dbname(), Some("jobs"));
        assert_eq!(config.get_password(), Some(&b"it's secret"[..]));
    }

    #[test]
    fn environment_alone_names_a_unix_socket_directory() {
        let config = with_env("", &[("PGHOST", "/run/pg"), ("PGPORT", "5433")]);
        assert_eq!(config.get_hosts(), &[Host::Unix("/run/pg".into())]);
        assert_eq!(config.get_ports(), &[5433]);
    }

    #[test]
    fn environment_host_and_port_lists_name_several_servers_in_order() {
        let config = with_env(
            "user=u target_session_attrs=read-write",
            &[
                ("PGHOST", "a.example,/run/pg,b.example"),
                ("PGPORT", "5432,,5434"),
            ],
        );
        assert_eq!(
            config.get_hosts(),
            &[
                Host::Tcp("a.example".into()),
                Host::Unix("/run/pg".into()),
                Host::Tcp("b.example".into())
            ]
        );
        assert_eq!(config.get_ports(), &[5432, 5432, 5434]);
        let config = with_env("host=a.example,b.example", &[("PGPORT", "6000,6001")]);
        assert_eq!(config.get_ports(), &[6000, 6001]);
    }

    #[test]
    fn defaults_fill_a_host_and_a_user() {
        let mut config = Config::new();
        apply_defaults(&mut config);
        assert_eq!(config.get_hosts().len(), 1);
        assert!(config.get_user().is_some_and(|user| !user.is_empty()));
    }
}
