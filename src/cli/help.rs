//! `pgtaskd --help` with its subcommands in groups: the groups, and the help template that
//! lists them. Used by `cli::command`.

/// The subcommands of `pgtaskd --help` (and `pgtaskd help`), in groups, in this order. clap
/// lists subcommands under one heading only, so `cli::command` writes this list into the help
/// template instead. A new subcommand belongs in one of these groups; one left out is listed
/// under "Other", never hidden, and the tests fail on it.
pub const SUBCOMMAND_GROUPS: &[(&str, &[&str])] = &[
    ("Daemon", &["run", "migrate", "check-config", "probe"]),
    (
        "Tasks",
        &[
            "enqueue", "graph", "batch", "status", "wait", "cancel", "retry", "list",
        ],
    ),
    (
        "Queues",
        &["stats", "queue", "pause", "resume", "daemons", "schedule"],
    ),
    ("Tools", &["analyze", "bench", "completions", "man", "help"]),
];

/// What clap says of its own `help` subcommand, which exists only once the command is built.
const HELP_ABOUT: &str = "Print this message or the help of the given subcommand(s)";

/// clap's default template with the one "Commands:" section replaced by the groups of
/// [`SUBCOMMAND_GROUPS`], each a heading and its subcommands' one-line descriptions, aligned.
pub(super) fn template(cmd: &clap::Command) -> String {
    let styles = cmd.get_styles();
    let (header, literal) = (styles.get_header(), styles.get_literal());
    let about_of = |name: &str| -> Option<String> {
        if name == "help" {
            return Some(HELP_ABOUT.to_string());
        }
        let sub = cmd.find_subcommand(name)?;
        Some(sub.get_about().map(ToString::to_string).unwrap_or_default())
    };
    let mut groups: Vec<(&str, Vec<&str>)> = SUBCOMMAND_GROUPS
        .iter()
        .map(|(heading, names)| (*heading, names.to_vec()))
        .collect();
    let other: Vec<&str> = cmd
        .get_subcommands()
        .map(clap::Command::get_name)
        .filter(|name| {
            !SUBCOMMAND_GROUPS
                .iter()
                .any(|(_, names)| names.contains(name))
        })
        .collect();
    if !other.is_empty() {
        groups.push(("Other", other));
    }
    let width = groups
        .iter()
        .flat_map(|(_, names)| names.iter().map(|name| name.len()))
        .max()
        .unwrap_or(0);
    let mut text = String::from("{before-help}{about-with-newline}\n{usage-heading} {usage}\n\n");
    for (heading, names) in groups {
        text.push_str(&format!("{header}{heading}:{header:#}\n"));
        for name in names {
            let Some(about) = about_of(name) else {
                continue;
            };
            let pad = " ".repeat(width - name.len() + 2);
            text.push_str(&format!("  {literal}{name}{literal:#}{pad}{about}\n"));
        }
        text.push('\n');
    }
    text.push_str(&format!(
        "{header}Options:{header:#}\n{{options}}{{after-help}}"
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn every_subcommand_has_one_group_and_every_grouped_name_is_a_subcommand() {
        let cmd = super::super::Cli::command();
        let grouped: Vec<&str> = SUBCOMMAND_GROUPS
            .iter()
            .flat_map(|(_, names)| names.iter().copied())
            .collect();
        for sub in cmd.get_subcommands() {
            let times = grouped
                .iter()
                .filter(|name| **name == sub.get_name())
                .count();
            assert_eq!(times, 1, "{} is in {times} groups", sub.get_name());
        }
        for name in grouped {
            assert!(
                name == "help" || cmd.find_subcommand(name).is_some(),
                "{name} is grouped but no subcommand"
            );
        }
        assert!(!template(&cmd).contains("Other:"));
    }
}
