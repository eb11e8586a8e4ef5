//! A YAML stream as text: split at `---` lines into one piece per document, so a document inject
//! leaves alone is copied byte for byte, comments and separators included.
//!
//! Splitting on the text is sound: a line starting with `---` ends any document in YAML, even
//! inside a block scalar (c-forbidden content), so a piece never cuts a document in two.

/// The text from one `---` line (or the start) to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece<'a> {
    pub text: &'a str,
    /// 1-based line of the input where the piece starts.
    pub first_line: usize,
}

pub fn split(text: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let (mut start, mut start_line, mut at) = (0, 1, 0);
    // Directives (`%YAML 1.1`) belong to the document after them: a cut goes before them.
    let mut directives: Option<(usize, usize)> = None;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if is_marker(line) {
            let (cut, cut_line) = directives.take().unwrap_or((at, n + 1));
            if cut > start {
                pieces.push(Piece {
                    text: &text[start..cut],
                    first_line: start_line,
                });
                (start, start_line) = (cut, cut_line);
            }
        } else if line.starts_with('%') {
            directives.get_or_insert((at, n + 1));
        } else if !line.trim().is_empty() && !line.trim_start().starts_with('#') {
            directives = None;
        }
        at += line.len();
    }
    if at > start {
        pieces.push(Piece {
            text: &text[start..],
            first_line: start_line,
        });
    }
    pieces
}

/// Whether `line` is a document start marker (`---` alone or followed by a space).
pub fn is_marker(line: &str) -> bool {
    line.strip_prefix("---")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']))
}

/// The piece with its document replaced by `body`: the `---` line, the comments before the
/// document and the comments after it stay; comments inside the document are lost.
pub fn rewrite(piece: &str, body: &str) -> String {
    let lines: Vec<&str> = piece.split_inclusive('\n').collect();
    let lead = lines.iter().take_while(|l| is_lead(l)).count();
    let trail = lines[lead..]
        .iter()
        .rev()
        .take_while(|l| is_trail(l))
        .count();
    let mut out: String = lines[..lead].concat();
    // `--- {kind: Pod}`: the document began on the marker line, which goes with it.
    if lines.get(lead).is_some_and(|l| is_marker(l)) {
        out.push_str("---\n");
    }
    out.push_str(body);
    out.push_str(&lines[lines.len() - trail..].concat());
    out
}

/// Blank lines, comments, directives and a bare `---` line before a document.
fn is_lead(line: &str) -> bool {
    let t = line.trim();
    t.is_empty()
        || t.starts_with('#')
        || line.starts_with('%')
        || (is_marker(line) && (t == "---" || t[3..].trim_start().starts_with('#')))
}

/// Blank lines, comments at column 0 and `...` after a document (column 0 so that nothing inside
/// an indented block scalar is mistaken for one).
fn is_trail(line: &str) -> bool {
    line.trim().is_empty() || line.starts_with('#') || line.trim_end() == "..."
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_text_and_start_at_markers() {
        let text = "# head\na: 1\n---\nb: 2\n--- # c\n---x: 3\n--- {c: 4}";
        let pieces = split(text);
        let texts: Vec<&str> = pieces.iter().map(|p| p.text).collect();
        assert_eq!(
            texts,
            [
                "# head\na: 1\n",
                "---\nb: 2\n",
                "--- # c\n---x: 3\n",
                "--- {c: 4}"
            ]
        );
        assert_eq!(
            pieces.iter().map(|p| p.first_line).collect::<Vec<_>>(),
            [1, 3, 5, 7]
        );
        assert_eq!(texts.concat(), text);
        let text = "a: 1\n...\n%YAML 1.1\n# c\n---\nb: 2\n";
        let texts: Vec<&str> = split(text).iter().map(|p| p.text).collect();
        assert_eq!(texts, ["a: 1\n...\n", "%YAML 1.1\n# c\n---\nb: 2\n"]);
    }

    #[test]
    fn rewriting_keeps_separators_and_surrounding_comments() {
        let piece = "---\n# Source: x.yaml\nkind: Pod # gone\n  # inner\n# next\n\n";
        assert_eq!(
            rewrite(piece, "kind: Pod\n"),
            "---\n# Source: x.yaml\nkind: Pod\n# next\n\n"
        );
        assert_eq!(
            rewrite("--- {kind: Pod}\n", "kind: Pod\n"),
            "---\nkind: Pod\n"
        );
    }
}
