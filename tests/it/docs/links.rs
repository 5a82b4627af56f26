//! Every relative link and `#anchor` of the README, the book and the
//! benchmark page leads somewhere.

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

#[test]
fn every_relative_link_and_anchor_resolves() {
    let files = super::markdown_files();
    assert!(files.len() > 10, "found only {files:?}");
    let mut anchors_of: BTreeMap<PathBuf, HashSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let markdown = std::fs::read_to_string(file).unwrap();
        let shown = file
            .strip_prefix(super::root())
            .unwrap_or(file)
            .display()
            .to_string();
        for (number, line) in super::prose_lines(&markdown).into_iter().enumerate() {
            for target in targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((target.as_str(), ""));
                let linked: PathBuf = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().unwrap_or(Path::new(".")).join(path)
                };
                let Ok(linked) = linked.canonicalize() else {
                    problems.push(format!("{shown}:{}: {target}: no such file", number + 1));
                    continue;
                };
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
