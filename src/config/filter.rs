//! What `log.level` may be: a stricter grammar than tracing's own, which takes any word it
//! does not know (`"verbose"`) as a target name and then logs nothing. Called by
//! `RawConfig::validate`.
//!
//! A filter is one or more directives separated by commas; each is a level (`trace`,
//! `debug`, `info`, `warn`, `error` or `off`) or `TARGET=LEVEL`, where the target is a
//! module path such as `pgtaskd` or `pgtaskd::worker`. Span filters (`[span]`) are not
//! accepted in the file; `RUST_LOG` still takes tracing's whole syntax.

/// The levels a directive may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Check `text` against the grammar above; the error says what is wrong in plain words.
pub(super) fn check(text: &str) -> Result<(), String> {
    let expected = "write a level (trace, debug, info, warn, error, off) or TARGET=LEVEL, \
        comma-separated, e.g. \"info\" or \"pgtaskd=debug,warn\"";
    if text.trim().is_empty() {
        return Err(format!("log.level is empty: {expected}"));
    }
    for directive in text.split(',').map(str::trim) {
        let (target, level) = match directive.split_once('=') {
            Some((target, level)) => (Some(target.trim()), level.trim()),
            None => (None, directive),
        };
        if let Some(target) = target {
            let is_path = !target.is_empty()
                && target
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.'));
            if !is_path {
                return Err(format!(
                    "log.level {text:?}: {target:?} is not a target (a module path such as \
                     \"pgtaskd\"): {expected}"
                ));
            }
        }
        if !LEVELS.iter().any(|known| known.eq_ignore_ascii_case(level)) {
            return Err(format!(
                "log.level {text:?}: {level:?} is not a level: {expected}"
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(text)
        .map(drop)
        .map_err(|err| format!("log.level {text:?} is not a filter: {err}"))
}

/// The pool library's own target. It logs "Connection could not be recycled" at WARN for
/// each pooled session an outage closed, which the daemon already reports once.
const POOL_TARGET: &str = "deadpool.postgres";

/// The filter the daemon logs with, from `directives` (`log.level` or `RUST_LOG`): the pool
/// library's lines are shown only when a directive names its target or everything is at
/// `debug` or `trace`.
pub fn with_quiet_pool(directives: &str) -> String {
    let verbose = directives.split(',').map(str::trim).any(|d| {
        d.contains("deadpool") || d.eq_ignore_ascii_case("debug") || d.eq_ignore_ascii_case("trace")
    });
    if verbose {
        directives.to_string()
    } else {
        format!("{directives},{POOL_TARGET}=error")
    }
}

#[cfg(test)]
mod tests {
    use super::{check, with_quiet_pool};

    #[test]
    fn the_pool_library_is_quiet_unless_asked_for() {
        assert_eq!(with_quiet_pool("info"), "info,deadpool.postgres=error");
        assert_eq!(
            with_quiet_pool("pgtaskd=debug"),
            "pgtaskd=debug,deadpool.postgres=error"
        );
        assert_eq!(with_quiet_pool("debug"), "debug");
        assert_eq!(with_quiet_pool("warn, TRACE"), "warn, TRACE");
        assert_eq!(
            with_quiet_pool("info,deadpool.postgres=warn"),
            "info,deadpool.postgres=warn"
        );
        for text in ["info", "pgtaskd=debug,warn"] {
            assert_eq!(check(&with_quiet_pool(text)), Ok(()), "{text}");
        }
    }

    #[test]
    fn levels_and_target_levels_are_accepted() {
        for text in [
            "info",
            "DEBUG",
            "pgtaskd=debug,warn",
            "pgtaskd::worker=trace, off",
        ] {
            assert_eq!(check(text), Ok(()), "{text}");
        }
    }

    #[test]
    fn a_word_that_is_not_a_level_is_refused_with_the_levels_named() {
        for (text, word) in [
            ("verbose", "verbose"),
            ("pgtaskd=loud", "loud"),
            ("info,", ""),
            ("", ""),
            ("[span]=debug", "[span]"),
            ("=debug", ""),
        ] {
            let err = check(text).unwrap_err();
            assert!(
                err.contains(&format!("{word:?}")) || text.is_empty(),
                "{text}: {err}"
            );
            assert!(
                err.contains("trace, debug, info, warn, error, off"),
                "{err}"
            );
        }
    }
}
