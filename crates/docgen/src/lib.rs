//! Man pages and shell completions of the ferrovs binaries, generated from their clap
//! definitions (the same `clap::Command` that parses their arguments), for the Debian
//! package (`scripts/package.sh`, `docs/packaging.md`).
//!
//! Each binary calls [`write_if_asked`] first thing in `main`: with `$FERROVS_WRITE_DOCS`
//! set to a directory it writes `DIR/man/NAME.1` and `DIR/completions/{NAME.bash,_NAME,
//! NAME.fish}` and exits; otherwise it does nothing. (The definitions live in the binaries,
//! and the binaries are what the package ships, so the pages cannot drift from them.)
//!
//! The page is clap_mangen's sections (title, name, synopsis, description, options, version)
//! and, for the text after the options (`after_help`, e.g. ferrovs's command table), a
//! section kept as written (no-fill): that text is laid out in columns.
#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap_complete::Shell;
use clap_mangen::roff::{roman, Roff};
use clap_mangen::Man;

/// The environment variable that asks a binary for its pages and completions.
pub const ENV: &str = "FERROVS_WRITE_DOCS";

/// Writes `cmd`'s man page and completions under `dir`; returns the files written.
pub fn write(cmd: clap::Command, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut cmd = cmd;
    cmd.build();
    let name = cmd.get_name().to_string();
    let mut written = Vec::new();
    let man_dir = dir.join("man");
    std::fs::create_dir_all(&man_dir)?;
    let page = man_dir.join(format!("{name}.1"));
    let mut f = std::fs::File::create(&page)?;
    render_man(&cmd, &mut f)?;
    f.flush()?;
    written.push(page);
    let comp_dir = dir.join("completions");
    std::fs::create_dir_all(&comp_dir)?;
    for (shell, file) in [
        (Shell::Bash, format!("{name}.bash")),
        (Shell::Zsh, format!("_{name}")),
        (Shell::Fish, format!("{name}.fish")),
    ] {
        let path = comp_dir.join(file);
        let mut f = std::fs::File::create(&path)?;
        clap_complete::generate(shell, &mut cmd, name.clone(), &mut f);
        f.flush()?;
        written.push(path);
    }
    Ok(written)
}

/// The man page of `cmd` (section 1).
pub fn render_man(cmd: &clap::Command, w: &mut dyn Write) -> io::Result<()> {
    let man = Man::new(cmd.clone())
        .manual("ferrovs")
        .source(format!("ferrovs {}", cmd.get_version().unwrap_or("")));
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if let Some(after) = cmd.get_after_long_help().or_else(|| cmd.get_after_help()) {
        let mut roff = Roff::default();
        roff.control("SH", ["NOTES"]);
        roff.control("nf", []);
        for line in after.to_string().lines() {
            roff.text([roman(line)]);
        }
        roff.control("fi", []);
        roff.to_writer(w)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// Writes `cmd()`'s pages and completions to `$FERROVS_WRITE_DOCS` and exits, if it is set.
pub fn write_if_asked(cmd: impl FnOnce() -> clap::Command) {
    let Some(dir) = std::env::var_os(ENV) else {
        return;
    };
    match write(cmd(), Path::new(&dir)) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{ENV}={}: {e}", Path::new(&dir).display());
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn cmd() -> Command {
        Command::new("demo")
            .version("1.2.3")
            .about("A demo daemon")
            .arg(
                Arg::new("run-dir")
                    .long("run-dir")
                    .value_name("DIR")
                    .help("Where it runs"),
            )
            .after_help("commands:\n  show          everything\n.dot  \\ backslash")
    }

    #[test]
    fn the_page_has_every_section_and_keeps_the_notes_laid_out() {
        let mut out = Vec::new();
        render_man(&cmd(), &mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        for want in [
            ".TH demo 1",
            ".SH NAME",
            "demo \\- A demo daemon",
            ".SH SYNOPSIS",
            ".SH OPTIONS",
            "\\-\\-run\\-dir",
            "Where it runs",
            ".SH NOTES\n.nf\n",
            "  show          everything",
            ".SH VERSION",
            "1.2.3",
        ] {
            assert!(page.contains(want), "{want:?} missing in:\n{page}");
        }
        // roff control characters at a line start and backslashes are escaped.
        assert!(page.contains("\\&.dot"), "{page}");
        assert!(page.contains("\\\\ backslash"), "{page}");
    }

    #[test]
    fn completions_for_three_shells() {
        let dir = std::env::temp_dir().join(format!("ferrovs-docgen-{}", std::process::id()));
        let files = write(cmd(), &dir).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.strip_prefix(&dir).unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "man/demo.1",
                "completions/demo.bash",
                "completions/_demo",
                "completions/demo.fish"
            ]
        );
        let bash = std::fs::read_to_string(dir.join("completions/demo.bash")).unwrap();
        assert!(bash.contains("--run-dir"), "{bash}");
        let fish = std::fs::read_to_string(dir.join("completions/demo.fish")).unwrap();
        assert!(fish.contains("-l run-dir"), "{fish}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
