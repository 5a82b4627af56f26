//! The documentation checked against the code: the configuration reference
//! against `Config`, the HTTP API chapter against the OpenAPI document, the
//! command-line reference against each command's `--help`, and every
//! relative link and anchor of the README, the book and the benchmark page.

mod cli;
mod configuration;
mod http_api;
mod links;

use std::path::{Path, PathBuf};

/// The repository's root folder.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A file of the repository, read whole.
fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every Markdown file the links test covers: the README, the book and the
/// benchmark page.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md"), root().join("bench/README.md")];
    let mut folders = vec![root().join("docs")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "book") {
                    folders.push(path);
                }
            } else if path.extension().is_some_and(|ext| ext == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The text of `markdown` outside fenced code blocks, line by line, with
/// the fenced lines blanked (so line numbers stay right).
fn prose_lines(markdown: &str) -> Vec<&str> {
    let mut fenced = false;
    markdown
        .lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                ""
            } else if fenced {
                ""
            } else {
                line
            }
        })
        .collect()
}

/// The cells of a Markdown table row, trimmed, or `None` for another line.
fn table_cells(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    if !line.starts_with('|') || !line.ends_with('|') || line.len() < 2 {
        return None;
    }
    // A `|` inside inline code is escaped as `\|` in the tables.
    let inner = &line[1..line.len() - 1];
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_owned()),
            other => cell.push(other),
        }
    }
    cells.push(cell.trim().to_owned());
    Some(cells)
}
