//! Printing helpers shared by the commands: plain aligned tables for people,
//! pretty JSON for machines.

use std::io::{self, Write};

use serde::Serialize;

/// Writes `value` as pretty JSON followed by a newline.
pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// A table with a header row; numeric-looking cells are right-aligned.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(header: I) -> Table {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row<I: IntoIterator<Item = S>, S: Into<String>>(&mut self, cells: I) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// Renders with two spaces between columns, indented by `indent` spaces.
    pub fn render(&self, indent: usize) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let numeric = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_digit() || matches!(c, '.' | ',' | '%' | '-' | '+'))
        };
        let mut out = String::new();
        for (r, row) in std::iter::once(&self.header).chain(&self.rows).enumerate() {
            let mut line = " ".repeat(indent);
            for (i, cell) in row.iter().enumerate().take(columns) {
                let pad = widths[i] - cell.chars().count();
                if i > 0 {
                    line.push_str("  ");
                }
                if r > 0 && numeric(cell) {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    if i + 1 < columns {
                        line.push_str(&" ".repeat(pad));
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `12345` → `12,345`.
pub use context_engine::tokens::thousands;

/// A share as a percentage with one decimal.
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0.0%".into();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn table_aligns_numbers_right() {
        let mut t = Table::new(["role", "tokens"]);
        t.row(["user", "5"]);
        t.row(["assistant", "1,200"]);
        assert_eq!(
            t.render(0),
            "role       tokens\nuser            5\nassistant   1,200\n"
        );
    }
}
