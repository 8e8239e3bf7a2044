//! From the file's text and the [`Overlay`] to a validated `Config`, with every error found,
//! not only the first. Called by `Config::resolve`.
//!
//! The text is parsed into a table that keeps every key's and value's position (a syntax
//! error stops here: it is reported alone, as what follows it cannot be trusted). The
//! overlay's values are laid over that table, each at a position past the end of the text
//! that stands for its variable or flag. Then every entry (each key of each section, each
//! top-level key that is not a table) is deserialized on its own, so that serde, which stops
//! at the first error, reports each bad entry (each key of each `[queues.NAME]` too); the bad
//! entries are taken out, the rest is deserialized whole, and `RawConfig::validate` collects
//! every value out of range. The errors are given in the order of the text, those of the
//! environment and the flags after.

use std::ops::Range;

use serde::Deserialize;
use toml::de::{DeString, DeTable, DeValue, Deserializer};
use toml::Spanned;

use super::keys::{self, KEYS};
use super::location::{key_at, line_column};
use super::overlay::{Overlay, Setting, Source};
use super::raw::RawConfig;
use super::{wording, Config, ConfigError, UrlSource};

/// Read `text` (from `origin`, a file name for messages) under `overlay`.
pub(super) fn resolve(text: &str, origin: &str, overlay: &Overlay) -> Result<Config, ConfigError> {
    let place = Place {
        text,
        origin,
        overlay,
    };
    let mut root = DeTable::parse(text).map_err(|err| place.serde_error(&err, None).1)?;
    let sources = sources(root.get_ref(), &place);
    lay(root.get_mut(), &place);
    let mut errors: Vec<(usize, ConfigError)> = Vec::new();
    let mut removed = Vec::new();
    for (path, err, span) in probe(root.get_ref()) {
        errors.push(place.serde_error(&err, Some(span)));
        remove(root.get_mut(), &path);
        removed.push(path);
    }
    let validated = RawConfig::deserialize(Deserializer::from(root)).map(|mut raw| {
        for path in &removed {
            raw.refused(path);
        }
        raw.validate(!overlay.skip_program_checks)
    });
    match validated {
        Err(err) => errors.push(place.serde_error(&err, None)),
        Ok(Err(invalid)) => errors.extend(
            invalid
                .into_iter()
                .map(|(span, message)| place.at(span, message)),
        ),
        Ok(Ok(mut config)) if errors.is_empty() && overlay.errors.is_empty() => {
            let url = index_of("database", "url").expect("database.url is one of KEYS");
            config.database.url_source = url_source(&sources[url]);
            config.sources = sources;
            config.warnings.extend(overlay.warnings.iter().cloned());
            config.warnings.extend(long_kill_after(&config));
            return Ok(config);
        }
        Ok(Ok(_)) => {}
    }
    errors.sort_by_key(|(at, _)| *at);
    let mut errors: Vec<ConfigError> = errors.into_iter().map(|(_, err)| err).collect();
    errors.extend(
        overlay
            .errors
            .iter()
            .map(|(named, message)| ConfigError::Setting {
                named: named.clone(),
                message: message.clone(),
            }),
    );
    Err(ConfigError::collect(errors))
}

/// Where the text ends and the overlay's positions begin.
struct Place<'a> {
    text: &'a str,
    origin: &'a str,
    overlay: &'a Overlay,
}

impl Place<'_> {
    /// The position that stands for the overlay's setting `index`.
    fn span_of(&self, index: usize) -> Range<usize> {
        let start = self.text.len() + 1 + index;
        start..start + 1
    }

    /// The overlay's setting at `offset`, when it is past the text.
    fn setting_at(&self, offset: usize) -> Option<&Setting> {
        offset
            .checked_sub(self.text.len() + 1)
            .and_then(|index| self.overlay.settings.get(index))
    }

    /// `message` about the value at `span`: an error of the file (with its line) or of the
    /// variable or flag; and where it sorts.
    fn at(&self, span: Range<usize>, message: String) -> (usize, ConfigError) {
        let err = match self.setting_at(span.start) {
            Some(setting) => ConfigError::Setting {
                named: setting.named(),
                message,
            },
            None => {
                let (line, column) = line_column(self.text, span.start);
                ConfigError::Invalid {
                    origin: self.origin.to_string(),
                    line,
                    column,
                    message,
                }
            }
        };
        (span.start, err)
    }

    /// serde's `err`, in plain words where `wording` has them, at its position or else at
    /// `fallback` (the entry being read).
    fn serde_error(
        &self,
        err: &toml::de::Error,
        fallback: Option<Range<usize>>,
    ) -> (usize, ConfigError) {
        let span = err.span().or(fallback).unwrap_or(0..0);
        let message = err.message().trim_end();
        let (key, found) = match self.setting_at(span.start) {
            Some(setting) => (Some(setting.key.dotted()), ""),
            None => (
                key_at(self.text, span.start),
                self.text.get(span.clone()).unwrap_or(""),
            ),
        };
        let outside = self.setting_at(span.start).is_some();
        let message = match key {
            // A variable or a flag is written without TOML's quotes.
            Some(key) => match wording::plain(&key, found, message) {
                Some(plain) if outside => plain.replace(" in quotes", ""),
                Some(plain) => plain,
                None if !message.contains(&key) => format!("{key}: {message}"),
                None => message.to_string(),
            },
            // A table given twice: toml names neither, its span is the header's last key.
            None if message == "duplicate key" && header_at(self.text, span.start).is_some() => {
                format!(
                    "{}: the table is given twice",
                    header_at(self.text, span.start).unwrap_or_default()
                )
            }
            None => message.to_string(),
        };
        self.at(span, message)
    }
}

/// Where each key of [`KEYS`] comes from, in its order: the overlay, else the file, else the
/// default. `[health]`, the old name of `[vacuum_health]`, counts for its keys.
fn sources(root: &DeTable<'_>, place: &Place<'_>) -> Vec<Source> {
    KEYS.iter()
        .map(|key| {
            if let Some(setting) = place.overlay.get(key) {
                return setting.source.clone();
            }
            let mut sections = vec![key.section];
            if key.section == "vacuum_health" {
                sections.push("health");
            }
            sections
                .into_iter()
                .filter_map(|section| root.get(section)?.get_ref().as_table())
                .find_map(|table| table.get_key_value(key.name))
                .map_or(Source::Default, |(name, _)| Source::File {
                    file: place.origin.to_string(),
                    line: line_column(place.text, name.span().start).0,
                })
        })
        .collect()
}

/// What `check-config` says of the connection string, from its source.
fn url_source(source: &Source) -> UrlSource {
    match source {
        Source::Default => UrlSource::Unset,
        Source::File { .. } => UrlSource::File,
        Source::Env(_) => UrlSource::Environment,
        Source::Flag(_) => UrlSource::Flag,
    }
}

/// Put each setting of the overlay in `root`, in the place of the file's value. A section the
/// file gives as something other than a table keeps the file's value (and its error).
fn lay<'a>(root: &mut DeTable<'a>, place: &Place<'a>) {
    let overlay: &'a Overlay = place.overlay;
    for (index, setting) in overlay.settings.iter().enumerate() {
        let span = place.span_of(index);
        let mut section = setting.key.section;
        if section == "vacuum_health" && !root.contains_key(section) && root.contains_key("health")
        {
            section = "health";
        }
        let table = root
            .entry(Spanned::new(span.clone(), DeString::Borrowed(section)))
            .or_insert_with(|| Spanned::new(span.clone(), DeValue::Table(DeTable::new())));
        if let DeValue::Table(table) = table.get_mut() {
            table.insert(
                Spanned::new(span.clone(), DeString::Borrowed(setting.key.name)),
                setting.to_toml(span),
            );
        }
    }
}

/// The path of one entry: its key in each table from the top.
type Path = Vec<String>;

/// Deserialize each entry of `root` alone: the path, error and position of each that fails.
/// A table the configuration has (an empty one of an unknown name fails) is not an entry but
/// a place of entries: each of its own is deserialized alone, at any depth (`[queues.NAME]`
/// within `queues`, and its keys within it).
fn probe(root: &DeTable<'_>) -> Vec<(Path, toml::de::Error, Range<usize>)> {
    let mut failed = Vec::new();
    probe_within(root, &mut Vec::new(), &mut failed);
    failed
}

/// [`probe`] the entries of `table`, found at `within` (the tables around it, outermost
/// first, each with its key).
fn probe_within<'a>(
    table: &DeTable<'a>,
    within: &mut Vec<(Spanned<DeString<'a>>, Range<usize>)>,
    failed: &mut Vec<(Path, toml::de::Error, Range<usize>)>,
) {
    for (name, value) in table.iter() {
        let span = name.span().start..value.span().end.max(name.span().end);
        let alone = |entry: Spanned<DeValue<'a>>| {
            let mut one = DeTable::new();
            one.insert(name.clone(), entry);
            // Wrap it in the tables around it, innermost first.
            let mut table = Spanned::new(span.clone(), one);
            for (key, at) in within.iter().rev() {
                let mut outer = DeTable::new();
                outer.insert(
                    key.clone(),
                    Spanned::new(at.clone(), DeValue::Table(table.into_inner())),
                );
                table = Spanned::new(at.clone(), outer);
            }
            RawConfig::deserialize(Deserializer::from(table)).err()
        };
        match value.get_ref() {
            DeValue::Table(entries)
                if alone(Spanned::new(value.span(), DeValue::Table(DeTable::new()))).is_none() =>
            {
                within.push((name.clone(), value.span()));
                probe_within(entries, within, failed);
                within.pop();
            }
            _ => {
                if let Some(err) = alone(value.clone()) {
                    let mut path: Path = within
                        .iter()
                        .map(|(k, _)| k.get_ref().to_string())
                        .collect();
                    path.push(name.get_ref().to_string());
                    failed.push((path, err, value.span()));
                }
            }
        }
    }
}

/// Take the entry at `path` out of `root`.
fn remove(root: &mut DeTable<'_>, path: &Path) {
    let Some((last, tables)) = path.split_last() else {
        return;
    };
    let mut table = root;
    for key in tables {
        match table.get_mut(key.as_str()).map(Spanned::get_mut) {
            Some(DeValue::Table(inner)) => table = inner,
            _ => return,
        }
    }
    table.remove(last.as_str());
}

/// The key of `KEYS` at `index`, for `Config::source`.
pub(super) fn index_of(section: &str, name: &str) -> Option<usize> {
    let key = keys::find(section, name)?;
    KEYS.iter().position(|k| k == key)
}

/// The table header (`[a.b]`) on the line of byte `at` of `text`, when that line is one.
fn header_at(text: &str, at: usize) -> Option<&str> {
    let start = text.get(..at)?.rfind('\n').map_or(0, |n| n + 1);
    let line = text[start..].lines().next()?.trim();
    let end = line.rfind(']')?;
    line.starts_with('[').then(|| &line[..=end])
}

/// A warning for each `exec` queue whose `kill_after` is over half of `worker.lease`: a
/// daemon cut off from the database stops such a command only half a lease ahead, and its
/// run may overlap another daemon's by what is over (docs/handlers.md).
fn long_kill_after(config: &super::Config) -> Vec<String> {
    let half = config.worker.lease / 2;
    config
        .queues
        .iter()
        .filter_map(|queue| match &queue.handler {
            super::HandlerConfig::Exec(spec) if spec.kill_after > half => Some(format!(
                "[queues.{}] kill_after = {} is over half of worker.lease ({}): a daemon that \
                 cannot extend a lease stops the command half a lease before it runs out, so \
                 its run may overlap another daemon's by {}; shorten kill_after or lengthen \
                 the lease",
                queue.name,
                humantime::format_duration(spec.kill_after),
                humantime::format_duration(config.worker.lease),
                humantime::format_duration(spec.kill_after - half)
            )),
            _ => None,
        })
        .collect()
}
