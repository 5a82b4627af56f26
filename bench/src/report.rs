//! The result table: one row per measured figure group, printed as
//! Markdown so it can be pasted into bench/README.md as is.

use std::time::Duration;

/// The rows so far: scenario, measured, and the target the row is checked
/// against with where it stands.
#[derive(Default)]
pub struct Table {
    rows: Vec<[String; 3]>,
}

impl Table {
    pub fn add(
        &mut self,
        scenario: impl Into<String>,
        result: impl Into<String>,
        target: impl Into<String>,
    ) {
        let row = [scenario.into(), result.into(), target.into()];
        eprintln!("  {}", row.join(" | "));
        self.rows.push(row);
    }

    pub fn render(&self) -> String {
        let mut text = String::from("| scenario | measured | target |\n|---|---|---|\n");
        for row in &self.rows {
            text.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        text
    }
}

/// Milliseconds with two decimals.
pub fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

/// Bytes as KiB or MiB.
pub fn size(bytes: f64) -> String {
    if bytes.abs() >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
    } else {
        format!("{:.1} KiB", bytes / 1024.0)
    }
}

/// "met" or "missed" for a target check.
pub fn verdict(met: bool) -> &'static str {
    if met { "**met**" } else { "**missed**" }
}

/// The middle value (the mean of the two middle ones for an even count);
/// zero for none.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 0 {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    } else {
        sorted[middle]
    }
}
