//! A small YAML tree for the documents `inject` rewrites: mappings keep their key order, and every
//! node that sat on one line keeps its exact source text, so whatever inject does not touch is
//! written back as it was written (quoting, `0644`, `!!str`, flow style) — YAML 1.1 readers such as
//! Kubernetes' decoder then see the same values as before.
//!
//! Built from `saphyr-parser` events. Aliases are expanded (the anchored node is copied), which
//! keeps merge keys (`<<: *base`) meaning the same once re-serialised without the anchor.
//!
//! Inputs are not trusted (a manifest from anywhere, a CI job's stdin), so the tree is bounded: at
//! most [`MAX_DEPTH`] levels (the tree's own copying and writing recurse) and at most
//! [`MAX_ALIAS_NODES`] nodes added by aliases in all (a few lines of nested aliases — the "billion
//! laughs" — would otherwise ask for billions of copies). Past either, parsing stops with an error.

use std::collections::HashMap;

use saphyr_parser::{Event, Marker, Parser, ScalarStyle, Span, Tag};

/// The deepest nesting accepted; Kubernetes objects are a dozen or two levels deep.
pub const MAX_DEPTH: usize = 128;
/// The most nodes alias expansion may add to one input, in all.
pub const MAX_ALIAS_NODES: usize = 1_000_000;

/// How a scalar's type is decided when it is written without its source text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Style {
    /// Written as is; YAML's rules decide the type (`9736` is a number, `true` a boolean).
    Plain,
    /// A string, quoted when it could read as anything else.
    Str,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scalar {
    pub value: String,
    pub style: Style,
    /// Rendered tag (`!!str`), when the source had one.
    pub tag: Option<String>,
}

#[derive(Clone, Debug)]
pub enum Value {
    Scalar(Scalar),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// A node and, when it is a scalar or a flow collection on one line, its exact source text.
#[derive(Clone, Debug)]
pub struct Node {
    pub value: Value,
    pub raw: Option<String>,
}

/// Equality of meaning: the source text does not count.
impl PartialEq for Node {
    fn eq(&self, other: &Self) -> bool {
        match (&self.value, &other.value) {
            (Value::Scalar(a), Value::Scalar(b)) => a == b,
            (Value::Seq(a), Value::Seq(b)) => a == b,
            (Value::Map(a), Value::Map(b)) => a == b,
            _ => false,
        }
    }
}

/// A syntax error, at a 1-based line and column of the whole input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct SyntaxError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl Node {
    pub fn new(value: Value) -> Self {
        Self { value, raw: None }
    }

    /// A new string (quoted on output when needed).
    pub fn str(s: impl Into<String>) -> Self {
        Self::scalar(s.into(), Style::Str)
    }

    /// A new plain scalar: numbers and booleans.
    pub fn plain(s: impl ToString) -> Self {
        Self::scalar(s.to_string(), Style::Plain)
    }

    fn scalar(value: String, style: Style) -> Self {
        Self::new(Value::Scalar(Scalar {
            value,
            style,
            tag: None,
        }))
    }

    pub fn map(entries: Vec<(&str, Node)>) -> Self {
        let entries = entries.into_iter().map(|(k, v)| (Node::str(k), v));
        Self::new(Value::Map(entries.collect()))
    }

    pub fn seq(items: Vec<Node>) -> Self {
        Self::new(Value::Seq(items))
    }

    /// The text of a scalar that is not null.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar(s) if !is_null(s) => Some(&s.value),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// Mutable items. The node is about to change, so its source text no longer holds.
    pub fn seq_mut(&mut self) -> Option<&mut Vec<Node>> {
        self.raw = None;
        match &mut self.value {
            Value::Seq(items) => Some(items),
            _ => None,
        }
    }

    /// Mutable entries; as [`Node::seq_mut`].
    pub fn map_mut(&mut self) -> Option<&mut Vec<(Node, Node)>> {
        self.raw = None;
        match &mut self.value {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// The value at `key` of a mapping, unless it is null.
    pub fn get(&self, key: &str) -> Option<&Node> {
        let (_, v) = self
            .as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))?;
        (!v.is_null()).then_some(v)
    }

    /// The value at a path of mapping keys.
    pub fn at(&self, path: &[&str]) -> Option<&Node> {
        path.iter().try_fold(self, |node, key| node.get(key))
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        let (_, v) = self
            .map_mut()?
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))?;
        (!v.is_null()).then_some(v)
    }

    pub fn at_mut(&mut self, path: &[&str]) -> Option<&mut Node> {
        path.iter().try_fold(self, |node, key| node.get_mut(key))
    }

    /// Sets `key` (in place when present, else appended). `false` when this is not a mapping.
    pub fn set(&mut self, key: &str, value: Node) -> bool {
        let Some(entries) = self.map_mut() else {
            return false;
        };
        match entries.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
            Some((_, v)) => *v = value,
            None => entries.push((Node::str(key), value)),
        }
        true
    }

    /// The value at `key`, set to `default` first when it is missing or null.
    pub fn entry(&mut self, key: &str, default: impl FnOnce() -> Node) -> Option<&mut Node> {
        if self.get(key).is_none() && !self.set(key, default()) {
            return None;
        }
        self.get_mut(key)
    }

    /// How many nodes this one is, itself and everything below it.
    fn size(&self) -> usize {
        match &self.value {
            Value::Scalar(_) => 1,
            Value::Seq(items) => 1 + items.iter().map(Node::size).sum::<usize>(),
            Value::Map(entries) => {
                1 + entries
                    .iter()
                    .map(|(k, v)| k.size() + v.size())
                    .sum::<usize>()
            }
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar(s) if is_null(s))
    }

    /// Forgets the source text of this node and everything in it.
    fn strip_raw(&mut self) {
        self.raw = None;
        match &mut self.value {
            Value::Scalar(_) => {}
            Value::Seq(items) => items.iter_mut().for_each(Node::strip_raw),
            Value::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
                k.strip_raw();
                v.strip_raw();
            }),
        }
    }
}

fn is_null(s: &Scalar) -> bool {
    s.style == Style::Plain
        && s.tag.is_none()
        && matches!(s.value.as_str(), "" | "~" | "null" | "Null" | "NULL")
}

/// Parses every document of `text`; `first_line` is the line `text` starts on in the input.
pub fn parse(text: &str, first_line: usize) -> Result<Vec<Node>, SyntaxError> {
    let mut builder = Builder::new(text);
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| syntax_error(e.marker(), e.info(), first_line))?;
        builder
            .on(event, span)
            .map_err(|m| syntax_error(&span.start, &m, first_line))?;
    }
    Ok(builder.docs)
}

fn syntax_error(at: &Marker, message: &str, first_line: usize) -> SyntaxError {
    SyntaxError {
        line: first_line + at.line().saturating_sub(1),
        col: at.col() + 1,
        message: message.to_owned(),
    }
}

/// A collection being built.
struct Frame {
    node: Node,
    /// The key waiting for its value, in a mapping.
    key: Option<Node>,
    anchor: usize,
    /// Where a flow collection started (block collections keep no source text), and how many
    /// aliases had been seen then: a flow collection holding an alias cannot be copied verbatim.
    flow_start: Option<(usize, usize)>,
}

struct Builder<'a> {
    text: &'a str,
    /// Byte offset of each character, when the text is not ASCII (parser markers count chars).
    offsets: Option<Vec<usize>>,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    aliases: usize,
    /// Nodes added by alias expansion so far.
    alias_nodes: usize,
    docs: Vec<Node>,
}

impl<'a> Builder<'a> {
    fn new(text: &'a str) -> Self {
        let offsets = (!text.is_ascii()).then(|| text.char_indices().map(|(i, _)| i).collect());
        Self {
            text,
            offsets,
            stack: Vec::new(),
            anchors: HashMap::new(),
            aliases: 0,
            alias_nodes: 0,
            docs: Vec::new(),
        }
    }

    fn on(&mut self, event: Event<'_>, span: Span) -> Result<(), String> {
        match event {
            Event::Scalar(value, style, anchor, tag) => {
                let node = self.scalar(&value, style, tag.as_deref(), span);
                self.finish(node, anchor)
            }
            Event::SequenceStart(anchor, _) => self.open(Value::Seq(Vec::new()), anchor, span),
            Event::MappingStart(anchor, _) => self.open(Value::Map(Vec::new()), anchor, span),
            Event::SequenceEnd | Event::MappingEnd => self.close(span),
            Event::Alias(id) => self.alias(id),
            _ => Ok(()),
        }
    }

    fn scalar(&self, value: &str, style: ScalarStyle, tag: Option<&Tag>, span: Span) -> Node {
        let style = match style {
            ScalarStyle::Plain => Style::Plain,
            _ => Style::Str,
        };
        let raw =
            Some(self.slice(span.start, span.end)).filter(|r| !r.is_empty() && !r.contains('\n'));
        let scalar = Scalar {
            value: value.to_owned(),
            style,
            tag: tag.map(render_tag),
        };
        Node {
            value: Value::Scalar(scalar),
            raw: raw.map(str::to_owned),
        }
    }

    fn open(&mut self, value: Value, anchor: usize, span: Span) -> Result<(), String> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        let opening = self.slice(span.start, span.end);
        let flow = opening.ends_with('[') || opening.ends_with('{');
        self.stack.push(Frame {
            node: Node::new(value),
            key: None,
            anchor,
            flow_start: flow.then_some((self.byte(span.start), self.aliases)),
        });
        Ok(())
    }

    fn close(&mut self, span: Span) -> Result<(), String> {
        let frame = self.stack.pop().ok_or("unbalanced collection end")?;
        let mut node = frame.node;
        if let Some((start, aliases)) = frame.flow_start {
            let raw = self.text.get(start..self.byte(span.end)).unwrap_or("");
            if aliases == self.aliases && !raw.contains('\n') {
                node.raw = Some(raw.to_owned());
            }
        }
        self.finish(node, frame.anchor)
    }

    fn alias(&mut self, id: usize) -> Result<(), String> {
        self.aliases += 1;
        let anchored = self.anchors.get(&id).ok_or("unknown alias")?;
        self.alias_nodes = self.alias_nodes.saturating_add(anchored.size());
        if self.alias_nodes > MAX_ALIAS_NODES {
            return Err(format!(
                "aliases expand to more than {MAX_ALIAS_NODES} nodes (an alias bomb?)"
            ));
        }
        let mut node = anchored.clone();
        // The copy is written out from its value: the anchor it would name is not written.
        node.strip_raw();
        self.finish(node, 0)
    }

    /// A complete node goes into its parent, or becomes a document.
    fn finish(&mut self, node: Node, anchor: usize) -> Result<(), String> {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        let Some(parent) = self.stack.last_mut() else {
            self.docs.push(node);
            return Ok(());
        };
        match (&mut parent.node.value, parent.key.take()) {
            (Value::Seq(items), _) => items.push(node),
            (Value::Map(entries), Some(key)) => entries.push((key, node)),
            (Value::Map(_), None) => parent.key = Some(node),
            (Value::Scalar(_), _) => return Err("a scalar cannot hold a node".into()),
        }
        Ok(())
    }

    fn slice(&self, start: Marker, end: Marker) -> &'a str {
        self.text
            .get(self.byte(start)..self.byte(end))
            .unwrap_or("")
    }

    fn byte(&self, at: Marker) -> usize {
        match &self.offsets {
            None => at.index().min(self.text.len()),
            Some(offsets) => offsets.get(at.index()).copied().unwrap_or(self.text.len()),
        }
    }
}

/// `!!str` for the core schema, `!local` for local tags, the verbatim form otherwise.
fn render_tag(tag: &Tag) -> String {
    match tag.handle.as_str() {
        "tag:yaml.org,2002:" => format!("!!{}", tag.suffix),
        "!" => format!("!{}", tag.suffix),
        handle => format!("!<{handle}{}>", tag.suffix),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Node {
        match parse(text, 1) {
            Ok(mut docs) if docs.len() == 1 => docs.remove(0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn scalars_keep_their_source_text() {
        let doc = one("a: 0644\nb: 'x'\nc: !!str 1\nd: [1, \"2\"]\ne: |\n  x\n");
        let raw = |k: &str| doc.get(k).and_then(|n| n.raw.clone());
        assert_eq!(raw("a").as_deref(), Some("0644"));
        assert_eq!(raw("b").as_deref(), Some("'x'"));
        assert_eq!(raw("c").as_deref(), Some("!!str 1"));
        assert_eq!(raw("d").as_deref(), Some("[1, \"2\"]"));
        assert_eq!(raw("e"), None);
        assert_eq!(doc.get("e").and_then(Node::as_str), Some("x\n"));
    }

    /// Ten levels of ten aliases each: 10^10 nodes if expanded.
    fn billion_laughs() -> String {
        let mut text = String::from("a0: &a0 [lol]\n");
        for k in 1..=10 {
            let refs = vec![format!("*a{}", k - 1); 10].join(", ");
            text.push_str(&format!("a{k}: &a{k} [{refs}]\n"));
        }
        text
    }

    #[test]
    fn an_alias_bomb_stops_at_the_budget() {
        let err = parse(&billion_laughs(), 1).unwrap_err();
        assert!(
            err.message.contains("aliases expand to more than"),
            "{err:?}"
        );
        // Expansion up to the budget is fine: 10^5 copies of a one-node list.
        let mut ok = String::from("a0: &a0 [lol]\n");
        for k in 1..=4 {
            let refs = vec![format!("*a{}", k - 1); 10].join(", ");
            ok.push_str(&format!("a{k}: &a{k} [{refs}]\n"));
        }
        assert!(parse(&ok, 1).is_ok());
    }

    #[test]
    fn nesting_stops_at_the_depth_limit() {
        let flow = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let block = |n: usize| format!("{}x\n", "- ".repeat(n));
        assert!(parse(&flow(MAX_DEPTH), 1).is_ok());
        assert!(parse(&block(MAX_DEPTH), 1).is_ok());
        let err = parse(&block(10_000), 1).unwrap_err();
        assert!(
            err.message.contains("nested deeper than 128 levels"),
            "{err:?}"
        );
        assert_eq!((err.line, err.col), (1, 2 * MAX_DEPTH + 1));
        // Flow collections meet the parser's own limit (255) first, as cleanly.
        let err = parse(&flow(10_000), 1).unwrap_err();
        assert!(err.message.contains("recursion limit exceeded"), "{err:?}");
    }

    #[test]
    fn aliases_are_copies_without_source_text() {
        let doc = one("a: &x [1, 2]\nb: *x\nc: [*x]\n");
        assert_eq!(doc.get("a"), doc.get("b"));
        assert_eq!(doc.get("b").and_then(|n| n.raw.clone()), None);
        assert_eq!(doc.get("c").and_then(|n| n.raw.clone()), None);
    }

    #[test]
    fn errors_carry_the_input_position() {
        let err = parse("a: [1, 2\nb: c\n", 10).err();
        assert_eq!(err.map(|e| (e.line, e.col)), Some((11, 2)));
    }

    #[test]
    fn non_ascii_text_slices_by_character() {
        let doc = one("a: \"é\"\nb: 'ü'\n");
        assert_eq!(
            doc.get("b").and_then(|n| n.raw.clone()).as_deref(),
            Some("'ü'")
        );
    }

    #[test]
    fn null_values_count_as_absent() {
        let doc = one("a:\nb: ~\nc: ''\n");
        assert!(doc.get("a").is_none() && doc.get("b").is_none());
        assert_eq!(doc.get("c").and_then(Node::as_str), Some(""));
    }
}
