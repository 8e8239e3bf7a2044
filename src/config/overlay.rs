//! The settings given outside the file: the `PGTASKD_<SECTION>_<KEY>` environment variables
//! and the flags of `run` and `check-config`, gathered into an [`Overlay`] that `resolve.rs`
//! lays over the file's table before anything is deserialized, so that every value, wherever
//! it came from, goes through the same checks.
//!
//! A flag wins over its variable, which wins over the file. A variable set to the empty
//! string counts as unset (as `PGTASKD_DATABASE_URL` and `PGTASKD_LOG_FORMAT` always did).
//! A variable that looks like a setting (`PGTASKD_` and a section, then `_`) but names no key
//! is a warning, not an error: other variables share the prefix (the tests', a handler's).

use std::ffi::OsString;
use std::ops::Range;

use toml::de::{DeArray, DeString, DeValue};
use toml::Spanned;

use super::keys::{self, Key, Kind, ENV_PREFIX};

/// Where a value came from, as `check-config` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Nothing set it: the built-in default.
    Default,
    /// The configuration file, at this line.
    File { file: String, line: usize },
    /// This environment variable.
    Env(String),
    /// This flag of the command line.
    Flag(&'static str),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File { file, line } => write!(f, "{file}:{line}"),
            Source::Env(name) => f.write_str(name),
            Source::Flag(flag) => f.write_str(flag),
        }
    }
}

/// One value given outside the file.
#[derive(Debug, Clone)]
pub(super) struct Setting {
    pub(super) key: &'static Key,
    /// The variable or the flag, always [`Source::Env`] or [`Source::Flag`].
    pub(super) source: Source,
    pub(super) value: String,
}

impl Setting {
    /// `NAME="VALUE"`, as an error about this setting starts.
    pub(super) fn named(&self) -> String {
        match &self.source {
            Source::Flag(flag) => format!("{flag} {:?}", self.value),
            source => format!("{source}={:?}", self.value),
        }
    }

    /// The value as the file would hold it, at `span`: see [`Kind`].
    pub(super) fn to_toml(&self, span: Range<usize>) -> Spanned<DeValue<'_>> {
        let text = self.value.trim();
        let value = match self.key.kind {
            Kind::Count | Kind::Size if is_integer(text) => match DeValue::parse(text) {
                Ok(parsed) => parsed.into_inner(),
                Err(_) => DeValue::String(DeString::Borrowed(text)),
            },
            Kind::List => {
                let mut list = DeArray::new();
                for item in text.split(',') {
                    list.push(Spanned::new(
                        span.clone(),
                        DeValue::String(DeString::Borrowed(item.trim())),
                    ));
                }
                DeValue::Array(list)
            }
            _ => DeValue::String(DeString::Borrowed(text)),
        };
        Spanned::new(span, value)
    }
}

/// An optional sign and digits: what may become a TOML integer.
fn is_integer(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// What the environment and the flags set, and what they said that could not be used.
#[derive(Debug, Default)]
pub struct Overlay {
    pub(super) settings: Vec<Setting>,
    /// Variables that look like settings but name none.
    pub(super) warnings: Vec<String>,
    /// Variables that cannot be read (not UTF-8): `NAME="VALUE"` and what is wrong.
    pub(super) errors: Vec<(String, String)>,
    /// Whether an `exec` queue's program is left unchecked: for the commands that never start
    /// one ([`Overlay::without_program_checks`]).
    pub(super) skip_program_checks: bool,
}

impl Overlay {
    /// The overlay of the process's environment and `flags` (each a flag of [`keys::KEYS`]
    /// with its dashes, and its value).
    pub fn from_env(flags: &[(&'static str, String)]) -> Overlay {
        Overlay::new(std::env::vars_os(), flags)
    }

    /// The same, for a command that never starts a queue's program: a missing or
    /// non-executable `command` of an `exec` queue is not an error then, so that a half-done
    /// deploy does not keep an operator from `status`, `cancel` or `list` (only `run` and
    /// `check-config` check it).
    pub fn without_program_checks(mut self) -> Overlay {
        self.skip_program_checks = true;
        self
    }

    /// The overlay of the variables `vars` and `flags`.
    pub fn new(
        vars: impl IntoIterator<Item = (OsString, OsString)>,
        flags: &[(&'static str, String)],
    ) -> Overlay {
        let mut overlay = Overlay::default();
        let mut vars: Vec<(OsString, OsString)> = vars.into_iter().collect();
        vars.sort();
        for (name, value) in vars {
            overlay.read_var(&name, value);
        }
        for (flag, value) in flags {
            let key = keys::by_flag(flag)
                .unwrap_or_else(|| panic!("{flag} is not the flag of a configuration key"));
            overlay.settings.retain(|setting| setting.key != key);
            overlay.settings.push(Setting {
                key,
                source: Source::Flag(flag),
                value: value.clone(),
            });
        }
        overlay
    }

    /// Take the variable `name` if it is a setting, warn if it looks like one and is not.
    fn read_var(&mut self, name: &std::ffi::OsStr, value: OsString) {
        let Some(name) = name.to_str() else { return };
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            return;
        };
        if let Some(key) = keys::KEYS.iter().find(|key| key.env_name() == name) {
            match value.into_string() {
                Ok(value) if value.is_empty() => {}
                Ok(value) => self.settings.push(Setting {
                    key,
                    source: Source::Env(name.to_string()),
                    value,
                }),
                Err(value) => self.errors.push((
                    format!("{name}={:?}", value.to_string_lossy()),
                    "the value is not valid UTF-8".to_string(),
                )),
            }
            return;
        }
        if let Some(section) = keys::sections()
            .find(|section| rest.starts_with(&format!("{}_", section.to_ascii_uppercase())))
        {
            let known: Vec<String> = keys::KEYS
                .iter()
                .filter(|key| key.section == section)
                .map(Key::env_name)
                .collect();
            self.warnings.push(format!(
                "the environment variable {name} names no setting of [{section}] and is \
                 ignored (its settings: {})",
                known.join(", ")
            ));
        } else if rest.starts_with("QUEUES_") {
            self.warnings.push(format!(
                "the environment variable {name} is ignored: the [queues.NAME] sections are \
                 read from the configuration file only"
            ));
        }
    }

    /// The setting of `key`, if the environment or a flag gave one.
    pub(super) fn get(&self, key: &Key) -> Option<&Setting> {
        self.settings.iter().find(|setting| setting.key == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        list.iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value)))
            .collect()
    }

    #[test]
    fn a_flag_wins_over_its_variable_and_empty_variables_are_unset() {
        let overlay = Overlay::new(
            vars(&[
                ("PGTASKD_WORKER_CONCURRENCY", "4"),
                ("PGTASKD_HTTP_LISTEN", ""),
                ("PGTASKD_WORKER_LEASE", "1m"),
                ("HOME", "/root"),
            ]),
            &[("--concurrency", "6".to_string())],
        );
        let found: Vec<(String, String)> = overlay
            .settings
            .iter()
            .map(|s| (s.source.to_string(), s.value.clone()))
            .collect();
        assert_eq!(
            found,
            [
                ("PGTASKD_WORKER_LEASE".to_string(), "1m".to_string()),
                ("--concurrency".to_string(), "6".to_string())
            ]
        );
        assert!(overlay.warnings.is_empty(), "{:?}", overlay.warnings);
    }

    #[test]
    fn a_variable_that_looks_like_a_setting_but_names_none_is_a_warning() {
        let overlay = Overlay::new(
            vars(&[
                ("PGTASKD_WORKER_CONCURENCY", "4"),
                ("PGTASKD_QUEUES_MAIL_COMMAND", "x"),
                ("PGTASKD_TASK_ID", "7"),
                ("PGTASKD_TEST_DATABASE_URL", "x"),
                ("PGTASKD_CONFIG", "/etc/pgtaskd.toml"),
            ]),
            &[],
        );
        assert!(overlay.settings.is_empty());
        assert_eq!(overlay.warnings.len(), 2, "{:?}", overlay.warnings);
        assert!(overlay.warnings[0].contains("PGTASKD_QUEUES_MAIL_COMMAND"));
        assert!(overlay.warnings[1].contains("PGTASKD_WORKER_CONCURENCY names no setting"));
        assert!(overlay.warnings[1].contains("PGTASKD_WORKER_CONCURRENCY"));
    }

    #[test]
    fn strings_become_the_toml_value_of_their_kind() {
        let overlay = Overlay::new(
            vars(&[
                ("PGTASKD_WORKER_QUEUES", "default, mail"),
                ("PGTASKD_WORKER_CONCURRENCY", "12"),
                ("PGTASKD_HTTP_MAX_BODY", "eight"),
                ("PGTASKD_WORKER_MAX_INFLIGHT_BYTES", "64MiB"),
            ]),
            &[],
        );
        let value = |name: &str| {
            let setting = overlay
                .settings
                .iter()
                .find(|s| s.source == Source::Env(name.to_string()))
                .unwrap();
            setting.to_toml(0..1).into_inner()
        };
        let queues = value("PGTASKD_WORKER_QUEUES");
        let queues: Vec<&str> = queues
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.get_ref().as_str().unwrap())
            .collect();
        assert_eq!(queues, ["default", "mail"]);
        assert!(value("PGTASKD_WORKER_CONCURRENCY").is_integer());
        assert_eq!(value("PGTASKD_HTTP_MAX_BODY").as_str(), Some("eight"));
        assert_eq!(
            value("PGTASKD_WORKER_MAX_INFLIGHT_BYTES").as_str(),
            Some("64MiB")
        );
    }
}
