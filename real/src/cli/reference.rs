//! docs/CONFIGURATION.md's tables of flags, made from the command line's
//! own definition, so that the reference says what `pelican` takes. A
//! test holds the file to them; `PELICAN_BLESS=1 cargo test -p
//! pelican-real configuration` writes them.

use super::args::Cli;
use clap::{ArgAction, Command, CommandFactory};

/// The commands whose flags the reference lists, each with its heading
/// (the root: the flags every command shares).
const SECTIONS: [(&str, &str); 6] = [
    ("", "Shared by every command:"),
    (
        "dev",
        "`pelican dev` (the whole system on one machine; the API and workers it starts read the variables below):",
    ),
    ("api", "`pelican api`:"),
    ("worker", "`pelican worker`:"),
    (
        "bench",
        "`pelican bench` (a running deployment, through its API):",
    ),
    (
        "watch",
        "`pelican watch RUN` (the API's `GET /runs/{id}/events`, through `pelican-client`):",
    ),
];

/// The command line's definition, as `pelican --help` shows it.
#[doc(hidden)]
#[must_use]
pub fn command() -> Command {
    Cli::command()
}

/// Every section's table of flags, as the reference holds them.
#[must_use]
pub fn configuration_tables() -> String {
    let root = command();
    let mut out = String::new();
    for (name, heading) in SECTIONS {
        let cmd = if name.is_empty() {
            &root
        } else {
            root.find_subcommand(name).expect("a command of pelican's")
        };
        out.push_str(heading);
        out.push_str("\n\n| flag | env | default | |\n|---|---|---|---|\n");
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() {
                continue;
            }
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let default = match (defaults.is_empty(), arg.get_action()) {
                (false, _) => format!("`{}`", defaults.join(",")),
                (true, ArgAction::SetTrue) => "off".to_owned(),
                (true, _) => "unset".to_owned(),
            };
            let help = arg
                .get_long_help()
                .or_else(|| arg.get_help())
                .map(ToString::to_string)
                .unwrap_or_default();
            let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
            out.push_str(&format!(
                "| `--{long}` | {env} | {default} | {} |\n",
                help.replace('|', "\\|")
            ));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::configuration_tables;

    const BEGIN: &str = "<!-- flags: made by `PELICAN_BLESS=1 cargo test -p pelican-real configuration`; do not edit -->\n";
    const END: &str = "<!-- end of the flags -->\n";

    /// docs/CONFIGURATION.md lists every flag as the command line defines
    /// it: name, environment variable, default and help.
    #[test]
    fn the_configuration_reference_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONFIGURATION.md");
        let doc = std::fs::read_to_string(&path).expect("docs/CONFIGURATION.md");
        let start = doc
            .find(BEGIN)
            .expect("the file marks where its flags begin")
            + BEGIN.len();
        let end = doc.find(END).expect("the file marks where its flags end");
        let made = configuration_tables();
        if std::env::var_os("PELICAN_BLESS").is_some() {
            let new = format!("{}{made}{}", &doc[..start], &doc[end..]);
            std::fs::write(&path, new).expect("docs/CONFIGURATION.md is writable");
            return;
        }
        assert!(
            doc[start..end] == made,
            "docs/CONFIGURATION.md's flags are not the command line's: \
             PELICAN_BLESS=1 cargo test -p pelican-real configuration"
        );
    }
}
