//! `valkey-sidecar inject`: adds the agent to Kubernetes manifests, like `linkerd inject`.
//!
//! Reads a YAML stream (files or stdin) and writes it to stdout with the agent added to every
//! workload that runs Valkey. Documents it does not change are copied byte for byte (see
//! [`stream`]); a changed document is re-serialised from a tree that keeps key order and the
//! source text of every one-line scalar (see [`yaml`]), so only its comments and the layout of
//! multi-line values are lost. Nothing is written unless every document could be handled.
//!
//! - [`workload`]: which documents hold pods, and where; [`pod`] and [`operator`]: the changes;
//!   [`agent`]: the agent's container, probes and hook.
//! - [`yaml`], [`emit`], [`stream`]: the YAML side.

pub mod agent;
pub mod emit;
pub mod operator;
pub mod pod;
pub mod sentinel;
pub mod stream;
pub mod workload;
pub mod yaml;

use std::io::{Read, Write};
use std::path::PathBuf;

use clap::{ArgMatches, Args, FromArgMatches, ValueEnum};

use crate::cli::exit;

/// The image injected by default: this very version.
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/valkey-sidecar/valkey-sidecar:",
    env!("CARGO_PKG_VERSION")
);

/// Add the agent to Kubernetes manifests (stdin or files) and print them.
#[derive(Debug, Clone, Args)]
pub struct InjectArgs {
    /// Manifest files; none or `-`: standard input.
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The agent's image.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// Add the agent as a regular container (with its own preStop wait) instead of a native
    /// sidecar (an init container with `restartPolicy: Always`, Kubernetes ≥ 1.29).
    #[arg(long)]
    pub classic: bool,
    /// SIDECAR_MODE (default: `cluster` when Valkey runs with `cluster-enabled yes`).
    #[arg(long, value_enum)]
    pub mode: Option<Mode>,
    /// SIDECAR_CLUSTER_NAME (default: the pods' `valkey.io/cluster` label, else the workload's name).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// The Valkey container (default: named `valkey` or `server`, else the first whose image
    /// contains `valkey`).
    #[arg(long, value_name = "NAME")]
    pub container: Option<String>,
    /// More environment for the agent, e.g. `--env SIDECAR_FAILBACK=true` (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// The pods' ServiceAccount (default: `valkey-sidecar` for pods without one of their own).
    #[arg(long, value_name = "NAME")]
    pub service_account: Option<String>,
    /// Replace the Valkey container's own probes with the agent's.
    #[arg(long)]
    pub replace_probes: bool,
    /// Pass workloads without a Valkey container through unchanged instead of failing.
    #[arg(long)]
    pub ignore_missing: bool,
    /// Write nothing; exit 1 when injection would change something (for CI).
    #[arg(long)]
    pub check: bool,
    /// Inject into workloads that run Valkey Sentinel too (refused without it: Sentinel and the
    /// agent would both fail over primaries), with a warning.
    #[arg(long)]
    pub force: bool,
}

/// SIDECAR_MODE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Cluster,
    Replication,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Cluster => "cluster",
            Mode::Replication => "replication",
        }
    }
}

/// What to inject, from the flags.
#[derive(Clone, Debug)]
pub struct Options {
    pub image: String,
    pub classic: bool,
    pub mode: Option<Mode>,
    pub cluster_name: Option<String>,
    pub container: Option<String>,
    pub env: Vec<(String, String)>,
    pub service_account: Option<String>,
    pub replace_probes: bool,
    pub ignore_missing: bool,
    pub force: bool,
}

impl From<&InjectArgs> for Options {
    fn from(a: &InjectArgs) -> Self {
        Self {
            image: a.image.clone(),
            classic: a.classic,
            mode: a.mode,
            cluster_name: a.cluster_name.clone(),
            container: a.container.clone(),
            env: a.env.clone(),
            service_account: a.service_account.clone(),
            replace_probes: a.replace_probes,
            ignore_missing: a.ignore_missing,
            force: a.force,
        }
    }
}

/// What injection did to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Injection {
    NotWorkload,
    AlreadyInjected,
    Injected,
}

/// Why a workload cannot be injected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error(
        "no Valkey container (none named `valkey`, `server` or by --container, no image containing \
         \"valkey\"; choose one with --container)"
    )]
    NoValkey,
    #[error("no pod template (spec) to inject into")]
    NoPodSpec,
    /// Sentinel fails primaries over by itself; a second failover authority would fight it.
    #[error(
        "it runs Valkey Sentinel ({0}): Sentinel and the agent would both fail primaries over \
         and fight; not injected (--force to inject anyway)"
    )]
    Sentinel(String),
}

impl Problem {
    /// Whether `--ignore-missing` passes the workload through: it has nothing to inject into.
    /// A Sentinel workload has, and is refused for a reason of its own.
    pub fn is_missing(&self) -> bool {
        matches!(self, Problem::NoValkey | Problem::NoPodSpec)
    }

    /// What to add to the message of a failed document.
    fn hint(&self) -> &'static str {
        if self.is_missing() {
            "; pass such documents through with --ignore-missing"
        } else {
            ""
        }
    }
}

/// Something that stops inject, and the input it is in (a file, or `stdin`).
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct InjectError {
    pub input: String,
    pub problem: InputProblem,
}

#[derive(Debug, thiserror::Error)]
pub enum InputProblem {
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    /// `line:column: message`.
    #[error("{0}")]
    Syntax(yaml::SyntaxError),
    #[error(
        "document {index} ({}): {}{}",
        failure.what,
        failure.problem,
        failure.problem.hint()
    )]
    Document {
        index: usize,
        failure: workload::Failure,
    },
    #[error("document {index}: several documents without `---` between them")]
    Unseparated { index: usize },
}

impl InjectError {
    /// `file:12:5: …` for syntax, as compilers do; `file: …` otherwise.
    fn describe(&self) -> String {
        match &self.problem {
            InputProblem::Syntax(e) => format!("{}:{e}", self.input),
            problem => format!("{}: {problem}", self.input),
        }
    }

    pub fn exit_code(&self) -> i32 {
        match self.problem {
            InputProblem::Read(_) => exit::NO_INPUT,
            _ => exit::DATA,
        }
    }
}

/// Warnings for stderr, each once, and blocks of text to show after them (e.g. RBAC to apply).
#[derive(Debug, Default)]
pub struct Notes {
    warnings: Vec<String>,
    blocks: Vec<String>,
}

impl Notes {
    pub fn warn(&mut self, note: String) {
        if !self.warnings.contains(&note) {
            self.warnings.push(note);
        }
    }

    /// A block shown as it is, once however many objects ask for it.
    pub fn show(&mut self, block: String) {
        if !self.blocks.contains(&block) {
            self.blocks.push(block);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &String> {
        self.warnings.iter()
    }

    pub fn blocks(&self) -> impl Iterator<Item = &String> {
        self.blocks.iter()
    }
}

/// The result of injecting one input.
#[derive(Debug, Default)]
pub struct Injected {
    pub text: String,
    /// `document 2 (StatefulSet valkey)` for every document that changed.
    pub changed: Vec<String>,
}

/// Injects into the YAML stream `text`.
pub fn inject_text(
    text: &str,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Injected, Vec<InputProblem>> {
    let mut out = Injected::default();
    let mut errors = Vec::new();
    let mut index = 0;
    for piece in stream::split(text) {
        match inject_piece(piece, &mut index, opts, notes) {
            Ok((text, changed)) => {
                out.text.push_str(&text);
                out.changed.extend(changed);
            }
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// One piece of the stream: its text unchanged, or its document rewritten and described.
/// `index` counts the documents so far.
fn inject_piece(
    piece: stream::Piece<'_>,
    index: &mut usize,
    opts: &Options,
    notes: &mut Notes,
) -> Result<(String, Option<String>), Vec<InputProblem>> {
    let docs =
        yaml::parse(piece.text, piece.first_line).map_err(|e| vec![InputProblem::Syntax(e)])?;
    let (first, count) = (*index + 1, docs.len());
    *index += count;
    let mut changed = Vec::new();
    for (n, doc) in docs.into_iter().enumerate() {
        if let Some(doc) = inject_document(doc, first + n, opts, notes)? {
            changed.push((first + n, doc));
        }
    }
    match changed.pop() {
        None => Ok((piece.text.to_owned(), None)),
        // Documents after `...` without `---` share a piece; one of them alone cannot be cut out.
        Some((index, _)) if count > 1 => Err(vec![InputProblem::Unseparated { index }]),
        Some((index, doc)) => {
            let body = emit::document(&doc, emit::Layout::detect(piece.text));
            let what = format!("document {index} ({})", workload::describe(&doc));
            Ok((stream::rewrite(piece.text, &body), Some(what)))
        }
    }
}

/// The document injected, when that changes it.
fn inject_document(
    mut doc: yaml::Node,
    index: usize,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Option<yaml::Node>, Vec<InputProblem>> {
    let before = doc.clone();
    let failed = |failures: Vec<workload::Failure>| {
        let problem = |failure| InputProblem::Document { index, failure };
        failures.into_iter().map(problem).collect::<Vec<_>>()
    };
    workload::inject(&mut doc, opts, notes).map_err(failed)?;
    Ok((doc != before).then_some(doc))
}

/// `valkey-sidecar inject`; returns the exit code.
pub fn main(matches: &ArgMatches) -> i32 {
    match InjectArgs::from_arg_matches(matches) {
        Ok(args) => run(&args),
        Err(e) => {
            let _ = e.print();
            exit::CONFIG
        }
    }
}

/// Injects every input and writes the result, or only reports with `--check`.
pub fn run(args: &InjectArgs) -> i32 {
    let mut notes = Notes::default();
    let result = inject_inputs(&args.files, &Options::from(args), &mut notes);
    for note in notes.iter() {
        eprintln!("valkey-sidecar inject: warning: {note}");
    }
    // On stderr too: stdout is the manifests.
    for block in notes.blocks() {
        eprint!("{block}");
    }
    let (text, changed) = match result {
        Ok(out) => out,
        Err(errors) => return fail(&errors),
    };
    let verb = if args.check {
        "would inject"
    } else {
        "injected"
    };
    for what in &changed {
        eprintln!("valkey-sidecar inject: {verb}: {what}");
    }
    match (args.check, changed.is_empty()) {
        (false, _) => write_stdout(&text),
        (true, true) => exit::OK,
        (true, false) => exit::NO,
    }
}

/// Every error, then the most telling exit code (an unreadable input over bad data).
fn fail(errors: &[InjectError]) -> i32 {
    for e in errors {
        eprintln!("valkey-sidecar inject: {e}");
    }
    errors
        .iter()
        .map(InjectError::exit_code)
        .max()
        .unwrap_or(exit::DATA)
}

/// Every input injected and joined into one stream (with the changed documents); with errors,
/// nothing.
fn inject_inputs(
    files: &[PathBuf],
    opts: &Options,
    notes: &mut Notes,
) -> Result<(String, Vec<String>), Vec<InjectError>> {
    let stdin = [PathBuf::from("-")];
    let files = if files.is_empty() { &stdin[..] } else { files };
    let (mut text, mut changed, mut errors) = (String::new(), Vec::new(), Vec::new());
    for file in files {
        let input = display_name(file);
        let result = read(file)
            .map_err(|e| vec![InputProblem::Read(e)])
            .and_then(|source| inject_text(&source, opts, notes));
        match result {
            Ok(out) => {
                join(&mut text, &out.text);
                changed.extend(out.changed.into_iter().map(|c| format!("{input}: {c}")));
            }
            Err(problems) => errors.extend(problems.into_iter().map(|problem| InjectError {
                input: input.clone(),
                problem,
            })),
        }
    }
    if errors.is_empty() {
        Ok((text, changed))
    } else {
        Err(errors)
    }
}

fn display_name(file: &std::path::Path) -> String {
    if file.as_os_str() == "-" {
        "stdin".into()
    } else {
        file.display().to_string()
    }
}

fn read(file: &std::path::Path) -> std::io::Result<String> {
    if file.as_os_str() != "-" {
        return std::fs::read_to_string(file);
    }
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    Ok(text)
}

/// Appends the next file's stream so that its first document stays a document of its own.
fn join(stream: &mut String, next: &str) {
    if !stream.is_empty() {
        if !stream.ends_with('\n') {
            stream.push('\n');
        }
        let starts_with_marker = next
            .lines()
            .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .is_none_or(stream::is_marker);
        if !starts_with_marker {
            stream.push_str("---\n");
        }
    }
    stream.push_str(next);
}

fn write_stdout(text: &str) -> i32 {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => exit::OK,
        // A reader that stopped early (`| head`) is not an error worth a message.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("valkey-sidecar inject: cannot write the output: {e}");
            exit::IO
        }
    }
}

fn parse_env(v: &str) -> Result<(String, String), String> {
    match v.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err("must be NAME=VALUE".into()),
    }
}
