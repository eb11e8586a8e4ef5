//! Writes a [`Node`] as block-style YAML in the layout of the document it came from (indent width,
//! whether sequences under a key are indented). Nodes with source text are written verbatim; new
//! strings are quoted whenever a YAML 1.1 or 1.2 reader could take them for anything else.

use super::yaml::{Node, Scalar, Style, Value};

/// The indentation a document uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub indent: usize,
    /// `key:\n  - item` (true) rather than `key:\n- item` (kubectl's style).
    pub indent_sequences: bool,
}

impl Default for Layout {
    fn default() -> Self {
        Self {
            indent: 2,
            indent_sequences: true,
        }
    }
}

impl Layout {
    /// Guesses the layout from the text: the smallest indentation, and how the first block
    /// sequence under a key is indented.
    pub fn detect(text: &str) -> Self {
        let lines: Vec<(usize, &str)> = text
            .lines()
            .map(|l| (l.len() - l.trim_start().len(), l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let indent = lines.iter().map(|(i, _)| *i).filter(|i| *i > 0).min();
        let sequences = lines.windows(2).find_map(|w| {
            let ((key_at, key), (item_at, item)) = (w[0], w[1]);
            (key.ends_with(':') && (item == "-" || item.starts_with("- ")) && item_at >= key_at)
                .then_some(item_at > key_at)
        });
        let default = Self::default();
        Self {
            indent: indent
                .filter(|i| (2..=8).contains(i))
                .unwrap_or(default.indent),
            indent_sequences: sequences.unwrap_or(default.indent_sequences),
        }
    }
}

/// The document `root` as YAML text, ending with a line break.
pub fn document(root: &Node, layout: Layout) -> String {
    let mut w = Writer {
        out: String::new(),
        layout,
    };
    w.node(root, 0, false);
    w.out
}

struct Writer {
    out: String,
    layout: Layout,
}

impl Writer {
    /// Writes `node` starting at the current position (after `key:`, `- ` or at a line start),
    /// with its block content at column `col`; `inline` when the line is already started.
    fn node(&mut self, node: &Node, col: usize, inline: bool) {
        match (&node.value, &node.raw) {
            (Value::Map(entries), None) if !entries.is_empty() => self.map(entries, col, inline),
            (Value::Seq(items), None) if !items.is_empty() => self.seq(items, col, inline),
            (Value::Scalar(s), None) if block_scalar(s) => self.literal(&s.value, col),
            _ => {
                self.out.push_str(&flow(node));
                self.out.push('\n');
            }
        }
    }

    fn map(&mut self, entries: &[(Node, Node)], col: usize, inline: bool) {
        for (n, (key, value)) in entries.iter().enumerate() {
            if n > 0 || !inline {
                self.pad(col);
            }
            self.out.push_str(&key_text(key));
            self.out.push(':');
            self.value(value, col);
        }
    }

    /// A mapping value: on the key's line when it fits there, else on the lines below.
    fn value(&mut self, value: &Node, key_col: usize) {
        let nested = value.raw.is_none();
        match &value.value {
            Value::Map(e) if nested && !e.is_empty() => {
                self.out.push('\n');
                self.map(e, key_col + self.layout.indent, false);
            }
            Value::Seq(items) if nested && !items.is_empty() => {
                self.out.push('\n');
                let step = if self.layout.indent_sequences {
                    self.layout.indent
                } else {
                    0
                };
                self.seq(items, key_col + step, false);
            }
            _ => {
                self.out.push(' ');
                self.node(value, key_col + self.layout.indent, true);
            }
        }
    }

    fn seq(&mut self, items: &[Node], col: usize, inline: bool) {
        for (n, item) in items.iter().enumerate() {
            if n > 0 || !inline {
                self.pad(col);
            }
            self.out.push_str("- ");
            self.node(item, col + 2, true);
        }
    }

    /// A literal block (`|`), its lines at `col`.
    fn literal(&mut self, text: &str, col: usize) {
        self.out
            .push_str(if text.ends_with('\n') { "|\n" } else { "|-\n" });
        for line in text.lines() {
            if !line.is_empty() {
                self.pad(col);
                self.out.push_str(line);
            }
            self.out.push('\n');
        }
    }

    fn pad(&mut self, col: usize) {
        self.out.extend(std::iter::repeat_n(' ', col));
    }
}

/// A mapping key; a quoted one that needs no quotes loses them (JSON input reads as YAML).
fn key_text(key: &Node) -> String {
    match &key.value {
        Value::Scalar(s) if s.style == Style::Str && s.tag.is_none() && plain_string(&s.value) => {
            s.value.clone()
        }
        _ => flow(key),
    }
}

/// A node on one line: its source text, a scalar, or a flow collection.
fn flow(node: &Node) -> String {
    if let Some(raw) = &node.raw {
        return raw.clone();
    }
    match &node.value {
        Value::Scalar(s) => scalar(s),
        Value::Seq(items) => format!(
            "[{}]",
            items.iter().map(flow).collect::<Vec<_>>().join(", ")
        ),
        Value::Map(entries) => {
            let entries: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}: {}", flow(k), flow(v)))
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
    }
}

fn scalar(s: &Scalar) -> String {
    let text = match s.style {
        Style::Plain if s.value.is_empty() => "null".to_owned(),
        // A multi-line plain scalar folds to a string; one line break would end it.
        Style::Plain if s.value.contains('\n') => quoted(&s.value),
        Style::Plain => s.value.clone(),
        Style::Str if plain_string(&s.value) => s.value.clone(),
        Style::Str => quoted(&s.value),
    };
    match &s.tag {
        Some(tag) => format!("{tag} {text}"),
        None => text,
    }
}

/// Multi-line strings read best as literal blocks; the rest (and whatever a block cannot hold
/// exactly: leading spaces, several trailing line breaks, carriage returns, control characters)
/// is double-quoted.
fn block_scalar(s: &Scalar) -> bool {
    let v = &s.value;
    s.style == Style::Str
        && s.tag.is_none()
        && v.trim_end_matches('\n').contains('\n')
        && !v.starts_with([' ', '\t', '\n'])
        && !v.ends_with("\n\n")
        && !v.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
        && !v.contains(['\u{2028}', '\u{2029}', '\u{feff}'])
}

/// A string that every YAML reader takes as that string when written without quotes: no
/// indicator characters, no leading digit or sign (numbers, timestamps, `1:20` sexagesimals),
/// and none of YAML 1.1's boolean or null words.
fn plain_string(v: &str) -> bool {
    const WORDS: [&str; 10] = [
        "y", "n", "yes", "no", "true", "false", "on", "off", "null", "~",
    ];
    let ok = |c: char| {
        c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '/' | ':' | '=' | '@' | '+')
    };
    v.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/')
        && v.chars().all(ok)
        && !v.ends_with(':')
        && !WORDS.contains(&v.to_ascii_lowercase().as_str())
}

/// A double-quoted scalar; JSON's escapes are YAML's.
fn quoted(v: &str) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::super::yaml::parse;
    use super::*;

    fn round_trip(text: &str) -> String {
        let docs = parse(text, 1).unwrap_or_default();
        docs.first()
            .map(|d| document(d, Layout::detect(text)))
            .unwrap_or_default()
    }

    #[test]
    fn untouched_block_documents_come_back_as_they_were() {
        for text in [
            "a: 1\nb:\n  c: 'x'\n  d:\n  - e: 0644\n    f: [1, 2]\n  - g\n",
            "a:\n    b:\n        - c\n        - d: !!str 1\n",
            "a: |\n  line one\n  line two\nb: |-\n  x\n  y\n",
        ] {
            assert_eq!(round_trip(text), text);
        }
    }

    #[test]
    fn new_strings_are_quoted_when_they_could_be_read_otherwise() {
        for (v, plain) in [
            ("valkey", true),
            ("ghcr.io/valkey-sidecar/valkey-sidecar:0.1.0", true),
            ("RuntimeDefault", true),
            ("yes", false),
            ("On", false),
            ("6379", false),
            ("127.0.0.1:6379", false),
            ("10m", false),
            ("/prestop?timeout=20s", false),
            ("", false),
            ("a: b", false),
        ] {
            assert_eq!(plain_string(v), plain, "{v}");
        }
        assert_eq!(quoted("a\"b\\\n\u{7}"), "\"a\\\"b\\\\\\n\\u0007\"");
    }

    #[test]
    fn multi_line_strings_are_literal_blocks_when_exact() {
        let doc = Node::map(vec![
            ("a", Node::str("x\ny\n")),
            ("b", Node::str(" x\ny")),
            ("c", Node::seq(vec![Node::str("x\n  y")])),
        ]);
        let text = document(&doc, Layout::default());
        assert_eq!(
            text,
            "a: |\n  x\n  y\nb: \" x\\ny\"\nc:\n  - |-\n    x\n      y\n"
        );
        let back = parse(&text, 1).unwrap_or_default();
        let value = |k: &str| back.first().and_then(|d| d.get(k)).map(|n| n.value.clone());
        assert!(matches!(value("b"), Some(Value::Scalar(s)) if s.value == " x\ny"));
        assert!(matches!(value("c"), Some(Value::Seq(i)) if i[0].as_str() == Some("x\n  y")));
    }

    #[test]
    fn layout_follows_the_source() {
        assert_eq!(
            Layout::detect("a:\n- b\n"),
            Layout {
                indent: 2,
                indent_sequences: false
            }
        );
        assert_eq!(
            Layout::detect("a:\n    b:\n        - c\n"),
            Layout {
                indent: 4,
                indent_sequences: true
            }
        );
    }
}
