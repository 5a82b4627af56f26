//! `docs/src/cli.md` has a section for every command and subcommand that
//! shows its `-h` output as the binary prints it, and names every flag its
//! `--help` lists.

use std::process::Command;

const CHAPTER: &str = "docs/src/cli.md";

fn help(command: &[&str]) -> String {
    run(command, "--help")
}

/// The short help, as the chapter shows it.
fn short_help(command: &[&str]) -> String {
    run(command, "-h")
}

fn run(command: &[&str], flag: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_eventrelay"))
        .args(command)
        .arg(flag)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "eventrelay {command:?} {flag} failed"
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The subcommands a `--help` lists under `Commands:`, without `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        // A description wrapped to the terminal's width goes on indented
        // further than the names.
        .filter(|line| !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags a `--help` lists, without `--help` and `--version`.
fn flags(help: &str) -> Vec<String> {
    let mut flags: Vec<String> = help
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| {
            line.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[' || c == '<')
                .find(|word| word.starts_with("--"))
                .map(str::to_owned)
        })
        .filter(|flag| flag != "--help" && flag != "--version")
        .collect();
    flags.dedup();
    flags
}

/// The text of the chapter's section whose heading is `` `eventrelay <command>` ``,
/// up to the next heading of the same or a higher level.
fn section<'a>(chapter: &'a str, command: &str) -> Option<&'a str> {
    let lines: Vec<&str> = chapter.lines().collect();
    let wanted = format!("`eventrelay {command}`");
    let start = lines
        .iter()
        .position(|line| line.starts_with('#') && line.trim_start_matches('#').trim() == wanted)?;
    let level = lines[start].chars().take_while(|c| *c == '#').count();
    let end = lines[start + 1..]
        .iter()
        .position(|line| {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            hashes > 0 && hashes <= level && line.chars().nth(hashes) == Some(' ')
        })
        .map_or(lines.len(), |offset| start + 1 + offset);
    let from = chapter.find(lines[start])?;
    let to = if end < lines.len() {
        chapter[from..]
            .find(lines[end])
            .map_or(chapter.len(), |i| from + i)
    } else {
        chapter.len()
    };
    Some(&chapter[from..to])
}

#[test]
fn every_command_and_flag_is_in_the_reference() {
    let chapter = super::read(CHAPTER);
    let top = short_help(&[]);
    assert!(
        chapter.contains(top.trim_end()),
        "{CHAPTER} does not show `eventrelay -h` as it is now:\n{top}"
    );
    let mut commands: Vec<Vec<String>> = subcommands(&help(&[]))
        .into_iter()
        .map(|command| vec![command])
        .collect();
    assert!(commands.len() >= 8, "eventrelay --help lists {commands:?}");
    let mut problems = Vec::new();
    let mut checked = 0;
    while let Some(command) = commands.pop() {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        let text = help(&args);
        let nested = subcommands(&text);
        if !nested.is_empty() {
            for sub in nested {
                let mut path = command.clone();
                path.push(sub);
                commands.push(path);
            }
            continue;
        }
        checked += 1;
        let name = command.join(" ");
        let Some(section) = section(&chapter, &name) else {
            problems.push(format!("no section `eventrelay {name}`"));
            continue;
        };
        let shown = short_help(&args);
        if !section.contains(&format!("```text\n{}\n```", shown.trim_end())) {
            problems.push(format!(
                "`eventrelay {name}` does not show its -h output as it is now:\n{shown}"
            ));
        }
        for flag in flags(&text) {
            if !section.contains(&flag) {
                problems.push(format!("`eventrelay {name}` does not mention {flag}"));
            }
        }
    }
    assert!(checked >= 15, "only {checked} commands checked");
    assert!(problems.is_empty(), "{CHAPTER}:\n{}", problems.join("\n"));
}
