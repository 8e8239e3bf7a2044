//! Every key of the configuration that may be given outside the file: its section, its name,
//! what kind of value it takes, its environment variable (`PGTASKD_<SECTION>_<KEY>`, upper
//! case) and its flag, if it has one. `overlay.rs` reads the environment and the flags through
//! this table, and `Config::sources` is keyed by it; docs/configuration.md holds the same
//! table for people (a unit test keeps the two in step).
//!
//! The per-queue sections (`[queues.NAME]`) are not here: they are read from the file only.

/// What a key's value is, which decides how a string from the environment or a flag becomes
/// a TOML value: a count or a size that reads as a whole number becomes an integer, a list is
/// split at commas, anything else stays a string (so a duration is written as in the file,
/// `"30s"`, without the quotes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A string in the file: a URL, an address, a path, a word, a duration.
    Text,
    /// A whole number.
    Count,
    /// A number of bytes, or a size such as `256MiB`.
    Size,
    /// A list of strings: comma-separated outside the file.
    List,
}

/// One key of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub section: &'static str,
    pub name: &'static str,
    pub(crate) kind: Kind,
    /// The command-line flag that sets it, with its dashes.
    pub flag: Option<&'static str>,
}

impl Key {
    /// `section.name`, as messages and `check-config` name the key.
    pub fn dotted(&self) -> String {
        format!("{}.{}", self.section, self.name)
    }

    /// `PGTASKD_<SECTION>_<KEY>`.
    pub fn env_name(&self) -> String {
        format!("{ENV_PREFIX}{}_{}", self.section, self.name).to_ascii_uppercase()
    }
}

/// What every setting's environment variable starts with.
pub const ENV_PREFIX: &str = "PGTASKD_";

const fn key(section: &'static str, name: &'static str, kind: Kind) -> Key {
    Key {
        section,
        name,
        kind,
        flag: None,
    }
}

const fn flagged(section: &'static str, name: &'static str, kind: Kind, flag: &'static str) -> Key {
    Key {
        section,
        name,
        kind,
        flag: Some(flag),
    }
}

/// Every key but the per-queue sections', in the file's order.
pub const KEYS: &[Key] = &[
    flagged("database", "url", Kind::Text, "--database-url"),
    key("database", "pool_size", Kind::Count),
    key("database", "connect_timeout", Kind::Text),
    key("database", "statement_timeout", Kind::Text),
    key("database", "listen_url", Kind::Text),
    key("database", "pooler", Kind::Text),
    flagged("worker", "concurrency", Kind::Count, "--concurrency"),
    flagged("worker", "queues", Kind::List, "--queues"),
    key("worker", "poll_interval", Kind::Text),
    key("worker", "lease", Kind::Text),
    key("worker", "max_inflight_bytes", Kind::Size),
    key("worker", "max_payload_bytes", Kind::Size),
    key("shutdown", "grace", Kind::Text),
    key("retention", "finished_after", Kind::Text),
    flagged("http", "listen", Kind::Text, "--http-listen"),
    key("http", "token_file", Kind::Text),
    key("http", "max_body", Kind::Size),
    key("http", "max_connections", Kind::Count),
    key("http", "header_timeout", Kind::Text),
    key("http", "max_inflight_bytes", Kind::Size),
    key("vacuum_health", "check_interval", Kind::Text),
    key("vacuum_health", "xmin_horizon_warning", Kind::Text),
    key("log", "format", Kind::Text),
    key("log", "level", Kind::Text),
];

/// The sections of [`KEYS`], each once, in order.
pub fn sections() -> impl Iterator<Item = &'static str> {
    KEYS.iter()
        .enumerate()
        .filter(|(i, key)| *i == 0 || KEYS[i - 1].section != key.section)
        .map(|(_, key)| key.section)
}

/// The key `section.name`, if the table has it.
pub fn find(section: &str, name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|key| key.section == section && key.name == name)
}

/// The key the flag `flag` (`--concurrency`) sets.
pub(crate) fn by_flag(flag: &str) -> Option<&'static Key> {
    KEYS.iter().find(|key| key.flag == Some(flag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_are_the_upper_case_section_and_key() {
        let listen = find("http", "listen").unwrap();
        assert_eq!(listen.env_name(), "PGTASKD_HTTP_LISTEN");
        assert_eq!(
            find("vacuum_health", "check_interval").unwrap().env_name(),
            "PGTASKD_VACUUM_HEALTH_CHECK_INTERVAL"
        );
        assert_eq!(
            find("database", "url").unwrap().env_name(),
            super::super::DATABASE_URL_ENV
        );
        assert_eq!(
            find("log", "format").unwrap().env_name(),
            super::super::LOG_FORMAT_ENV
        );
        assert_eq!(by_flag("--queues").unwrap().dotted(), "worker.queues");
    }

    #[test]
    fn every_key_has_a_row_in_the_documented_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let docs = std::fs::read_to_string(path).expect("docs/configuration.md is readable");
        for key in KEYS {
            let row = docs
                .lines()
                .find(|line| line.starts_with(&format!("| `{}` ", key.dotted())))
                .unwrap_or_else(|| panic!("docs/configuration.md has no row for {}", key.dotted()));
            assert!(row.contains(&format!("`{}`", key.env_name())), "{row}");
            if let Some(flag) = key.flag {
                assert!(row.contains(&format!("`{flag}`")), "{row}");
            }
        }
    }
}
