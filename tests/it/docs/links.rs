//! Every relative link and `#anchor` of the README, the book and the
//! benchmark page leads somewhere, and so does every link of the built
//! book: a chapter links only to chapters listed in `SUMMARY.md`, and to
//! the rest of the repository by its web address, whose path and anchor
//! are checked here against the files.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation
/// other than `-` and `_` dropped, a counter on repeats.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    // Link texts count, their targets do not.
    let mut rest = heading;
    while let Some(open) = rest.find("](") {
        text.push_str(&rest[..open]);
        rest = rest[open + 2..]
            .split_once(')')
            .map_or("", |(_, after)| after);
    }
    text.push_str(rest);
    text.chars()
        .filter_map(|c| {
            if c == ' ' {
                Some('-')
            } else if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of a Markdown file: its headings' and explicit `<a id>`s.
fn anchors(markdown: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for line in super::prose_lines(markdown) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line.chars().nth(hashes) == Some(' ') {
            let base = slug(line[hashes..].trim());
            let count = seen.entry(base.clone()).or_insert(0);
            let anchor = if *count == 0 {
                base.clone()
            } else {
                format!("{base}-{count}")
            };
            *count += 1;
            anchors.insert(anchor);
        }
        let mut rest = line;
        while let Some(at) = rest.find("<a id=\"") {
            rest = &rest[at + 7..];
            if let Some((id, _)) = rest.split_once('"') {
                anchors.insert(id.to_owned());
            }
        }
    }
    anchors
}

/// The link targets of a whole Markdown text.
fn targets_of(markdown: &str) -> Vec<String> {
    super::prose_lines(markdown)
        .into_iter()
        .flat_map(targets)
        .collect()
}

/// The link targets of a line, outside inline code: `[text](target)` and
/// `![alt](target)`.
fn targets(line: &str) -> Vec<String> {
    let mut prose = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            prose.push_str(part);
        } else {
            prose.push_str("code");
        }
    }
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some((target, _)) = rest.split_once(')') {
            let target = target.split_whitespace().next().unwrap_or("");
            targets.push(target.to_owned());
        }
    }
    targets
}

/// Where the repository's files are on the web: the book links to files
/// outside it (the bench page, the README) by this address, since a built
/// book holds only its chapters.
const REPOSITORY_FILES: &str = "https://github.com/eventrelay/eventrelay/blob/main/";

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = super::markdown_files();
    assert!(files.len() > 10, "found only {files:?}");
    let mut anchors_of: BTreeMap<PathBuf, HashSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut checked = 0;
    let book = super::root().join("docs/src").canonicalize().unwrap();
    let summary = std::fs::read_to_string(book.join("SUMMARY.md")).unwrap();
    let chapters: HashSet<String> = targets_of(&summary).into_iter().collect();
    for file in &files {
        let in_book = file.canonicalize().is_ok_and(|f| f.starts_with(&book));
        let markdown = std::fs::read_to_string(file).unwrap();
        let shown = file
            .strip_prefix(super::root())
            .unwrap_or(file)
            .display()
            .to_string();
        for (number, line) in super::prose_lines(&markdown).into_iter().enumerate() {
            for target in targets(line) {
                let in_repository = target.strip_prefix(REPOSITORY_FILES);
                if in_repository.is_none()
                    && (target.contains("://") || target.starts_with("mailto:"))
                {
                    continue;
                }
                checked += 1;
                let relative = in_repository.unwrap_or(&target);
                let (path, anchor) = relative.split_once('#').unwrap_or((relative, ""));
                let linked: PathBuf = if in_repository.is_some() {
                    super::root().join(path)
                } else if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap_or(Path::new(".")).join(path)
                };
                let Ok(linked) = linked.canonicalize() else {
                    problems.push(format!("{shown}:{}: {target}: no such file", number + 1));
                    continue;
                };
                if in_book && in_repository.is_none() && !path.is_empty() {
                    let chapter = linked
                        .strip_prefix(&book)
                        .ok()
                        .map(|p| p.display().to_string());
                    match chapter {
                        None => problems.push(format!(
                            "{shown}:{}: {target}: leaves the book, which a built book cannot \
                             follow; link to {REPOSITORY_FILES}<path> instead",
                            number + 1
                        )),
                        // Other files (pictures) are copied into the built book.
                        Some(chapter)
                            if chapter.ends_with(".md") && !chapters.contains(&chapter) =>
                        {
                            problems.push(format!(
                                "{shown}:{}: {target}: not a chapter of SUMMARY.md",
                                number + 1
                            ))
                        }
                        Some(_) => {}
                    }
                }
                if anchor.is_empty() {
                    continue;
                }
                let anchors = anchors_of.entry(linked.clone()).or_insert_with(|| {
                    anchors(&std::fs::read_to_string(&linked).unwrap_or_default())
                });
                if !anchors.contains(anchor) {
                    problems.push(format!("{shown}:{}: {target}: no such anchor", number + 1));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links checked");
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn anchors_follow_github() {
    assert_eq!(
        slug("`GET /v1/events`: the event stream"),
        "get-v1events-the-event-stream"
    );
    assert_eq!(
        slug("TLS and HTTP/2, or a proxy in front"),
        "tls-and-http2-or-a-proxy-in-front"
    );
    assert_eq!(
        slug("Hub arbiters (`hub.arbiters`)"),
        "hub-arbiters-hubarbiters"
    );
}
