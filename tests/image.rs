//! The container image (`Dockerfile`), verified without a Docker engine.
//!
//! - The Dockerfile, parsed here: a build stage and a final `FROM scratch` (or distroless) stage
//!   that copies exactly the build stage's `target/x86_64-unknown-linux-musl/release/valkey-sidecar`,
//!   runs it as a numeric non-root `USER` and starts it through an exec-form `ENTRYPOINT` (an empty
//!   image has no shell). The build stage's `cargo build` has the same arguments as the one in
//!   `scripts/static-build.sh`, so the two cannot drift apart.
//! - The binary `scripts/static-build.sh` builds (the Dockerfile's build, slow the first time): a
//!   static x86-64 ELF, read with the small program-header reader below. This toolchain links the
//!   musl target as static-pie: `ET_DYN` with `DF_1_PIE`, a `PT_DYNAMIC` for its own relocations, but
//!   no `PT_INTERP` (no loader) and no `DT_NEEDED` (no shared library); a classic static
//!   `ET_EXEC` passes too.
//! - That binary run in what the image holds: an otherwise empty root directory (`chroot`) with the
//!   binary where the Dockerfile copies it, as the Dockerfile's `USER`, through its `ENTRYPOINT`,
//!   with an empty environment: `--help`, `--version`, and exit code 64 for a bad variable.
//! - The image size: the image is `scratch` plus one layer holding this one file, so the estimate is
//!   the binary plus the layer's tar overhead (one 512-byte header, padding to 512 bytes, the 1 KiB
//!   end-of-archive marker); it must stay within 10 MiB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Instant;

/// The packaging target for the image.
const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;
const MIB: f64 = 1024.0 * 1024.0;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Dockerfile parser
// ---------------------------------------------------------------------------------------------

/// One instruction, continuation lines joined, keyword upper-cased.
#[derive(Debug, Clone)]
struct Instruction {
    line: usize,
    keyword: String,
    args: String,
}

#[derive(Debug)]
struct Stage {
    base: String,
    name: Option<String>,
    body: Vec<Instruction>,
}

/// Instructions of a Dockerfile (default escape character `\`): comment and empty lines dropped,
/// also inside continuations, as Docker does.
fn instructions(text: &str) -> Result<Vec<Instruction>, String> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.starts_with("# escape=") || trimmed.starts_with("#escape=") {
            return Err(format!(
                "line {}: escape directives are not supported",
                i + 1
            ));
        }
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (content, continues) = match trimmed.strip_suffix('\\') {
            Some(c) => (c, true),
            None => (trimmed, false),
        };
        let (line, mut acc) = pending.take().unwrap_or((i + 1, String::new()));
        if !acc.is_empty() {
            acc.push(' ');
        }
        acc.push_str(content.trim());
        if continues {
            pending = Some((line, acc));
            continue;
        }
        let (keyword, args) = acc.split_once(char::is_whitespace).unwrap_or((&acc, ""));
        out.push(Instruction {
            line,
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_owned(),
        });
    }
    if let Some((line, _)) = pending {
        return Err(format!("line {line}: continuation at the end of the file"));
    }
    Ok(out)
}

/// Splits instructions into stages at `FROM [--platform=...] image [AS name]`.
fn stages(text: &str) -> Result<Vec<Stage>, String> {
    let mut out: Vec<Stage> = Vec::new();
    for ins in instructions(text)? {
        if ins.keyword == "FROM" {
            let words: Vec<&str> = ins
                .args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let (base, name) = match words.as_slice() {
                [base] => (*base, None),
                [base, as_, name] if as_.eq_ignore_ascii_case("as") => {
                    (*base, Some((*name).to_owned()))
                }
                _ => return Err(format!("line {}: malformed FROM {:?}", ins.line, ins.args)),
            };
            out.push(Stage {
                base: base.to_owned(),
                name,
                body: Vec::new(),
            });
        } else if let Some(stage) = out.last_mut() {
            stage.body.push(ins);
        } else if ins.keyword != "ARG" {
            return Err(format!(
                "line {}: {} before the first FROM",
                ins.line, ins.keyword
            ));
        }
    }
    Ok(out)
}

/// `COPY [--flag=value ...] src... dest`, shell or JSON form.
#[derive(Debug)]
struct CopyArgs {
    from: Option<String>,
    sources: Vec<String>,
    dest: String,
}

fn parse_copy(args: &str) -> Result<CopyArgs, String> {
    let mut rest = args.trim();
    let mut from = None;
    while let Some(flagged) = rest.strip_prefix("--") {
        let (flag, after) = flagged
            .split_once(char::is_whitespace)
            .unwrap_or((flagged, ""));
        if let Some(v) = flag.strip_prefix("from=") {
            from = Some(v.to_owned());
        }
        rest = after.trim_start();
    }
    let mut paths: Vec<String> = if rest.starts_with('[') {
        serde_json::from_str(rest).map_err(|e| format!("COPY {args:?}: bad JSON form: {e}"))?
    } else {
        rest.split_whitespace().map(str::to_owned).collect()
    };
    if paths.len() < 2 {
        return Err(format!("COPY {args:?}: needs a source and a destination"));
    }
    let dest = paths.pop().unwrap_or_default();
    Ok(CopyArgs {
        from,
        sources: paths,
        dest,
    })
}

/// The argument vector of an exec-form (JSON array) `ENTRYPOINT`/`CMD`/`RUN`; `None` for shell form.
fn exec_form(args: &str) -> Option<Vec<String>> {
    if !args.trim_start().starts_with('[') {
        return None;
    }
    serde_json::from_str(args).ok()
}

// ---------------------------------------------------------------------------------------------
// Shell commands (the Dockerfile's RUN lines and scripts/static-build.sh)
// ---------------------------------------------------------------------------------------------

/// Splits shell text into words (single and double quotes, backslash escapes); `;`, `|`, `&&`, `||`
/// come out as words of their own. Enough for the simple command lines compared here.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = text.chars().peekable();
    let flush = |cur: &mut String, in_word: &mut bool, words: &mut Vec<String>| {
        if *in_word {
            words.push(std::mem::take(cur));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    cur.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => cur.extend(chars.next()),
                        _ => cur.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                cur.extend(chars.next());
            }
            ';' => {
                flush(&mut cur, &mut in_word, &mut words);
                words.push(";".into());
            }
            '|' | '&' if chars.peek() == Some(&c) => {
                chars.next();
                flush(&mut cur, &mut in_word, &mut words);
                words.push(format!("{c}{c}"));
            }
            '|' => {
                flush(&mut cur, &mut in_word, &mut words);
                words.push("|".into());
            }
            c if c.is_whitespace() => flush(&mut cur, &mut in_word, &mut words),
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    flush(&mut cur, &mut in_word, &mut words);
    words
}

/// Simple commands of `words` (split at `;`, `|`, `&&`, `||`), redirections removed.
fn simple_commands(words: &[String]) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new()];
    let mut skip_next = false;
    for w in words {
        if skip_next {
            skip_next = false;
            continue;
        }
        match w.as_str() {
            ";" | "|" | "&&" | "||" => out.push(Vec::new()),
            _ => {
                let redirect = w.trim_start_matches(|c: char| c.is_ascii_digit());
                if redirect.starts_with('>') || redirect.starts_with('<') {
                    // `>&2`, `2>&1`, `>file` carry their target; `>` and `2>` take the next word.
                    skip_next = redirect.trim_start_matches(['>', '<', '&']).is_empty()
                        && !redirect.contains('&');
                } else if let Some(cmd) = out.last_mut() {
                    cmd.push(w.clone());
                }
            }
        }
    }
    out.retain(|c| !c.is_empty());
    out
}

/// The `cargo build` commands (leading `VAR=value` words kept) in a piece of shell.
fn cargo_builds(shell: &str) -> Vec<Vec<String>> {
    simple_commands(&shell_words(shell))
        .into_iter()
        .filter(|cmd| {
            let mut rest = cmd.iter().skip_while(|w| is_assignment(w));
            rest.next().is_some_and(|w| w == "cargo") && rest.next().is_some_and(|w| w == "build")
        })
        .collect()
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The `cargo build` of a bash script: continuation lines joined, comment lines dropped.
fn script_cargo_builds(script: &str) -> Vec<Vec<String>> {
    let mut joined = String::new();
    for line in script.lines() {
        let t = line.trim();
        if t.starts_with('#') {
            joined.push('\n');
            continue;
        }
        match t.strip_suffix('\\') {
            Some(c) => {
                joined.push_str(c);
                joined.push(' ');
            }
            None => {
                joined.push_str(t);
                joined.push('\n');
            }
        }
    }
    joined.lines().flat_map(cargo_builds).collect()
}

/// The value of `--name value` or `--name=value`.
fn flag_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(&eq)
        }
    })
}

// ---------------------------------------------------------------------------------------------
// The image as the Dockerfile describes it
// ---------------------------------------------------------------------------------------------

/// What the checked Dockerfile says about the image.
#[derive(Debug)]
struct Image {
    /// The `cargo build` argument vector of the build stage.
    cargo: Vec<String>,
    /// Where the binary sits in the image.
    binary: String,
    uid: u32,
    gid: Option<u32>,
    entrypoint: Vec<String>,
}

/// Checks a Dockerfile against the packaging rules and the script's `cargo build`.
fn check_dockerfile(dockerfile: &str, script: &str) -> Result<Image, String> {
    let stages = stages(dockerfile)?;
    if stages.len() < 2 {
        return Err(format!(
            "{} stage(s): expected a build stage and a final stage",
            stages.len()
        ));
    }
    let last = stages.len() - 1;
    let fin = &stages[last];
    if !(fin.base == "scratch" || fin.base.starts_with("gcr.io/distroless/")) {
        return Err(format!(
            "final stage is FROM {}: expected scratch or a distroless image",
            fin.base
        ));
    }
    for ins in &fin.body {
        if matches!(ins.keyword.as_str(), "RUN" | "ADD" | "ONBUILD") {
            return Err(format!(
                "line {}: {} in the final stage (it holds only the copied binary)",
                ins.line, ins.keyword
            ));
        }
    }

    // Exactly one COPY: the binary, from an earlier stage.
    let copies: Vec<(&Instruction, CopyArgs)> = fin
        .body
        .iter()
        .filter(|i| i.keyword == "COPY")
        .map(|i| parse_copy(&i.args).map(|c| (i, c)))
        .collect::<Result<_, _>>()?;
    let [(copy_ins, copy)] = copies.as_slice() else {
        return Err(format!(
            "final stage has {} COPY instructions: expected exactly one (the binary)",
            copies.len()
        ));
    };
    let from = copy
        .from
        .as_deref()
        .ok_or_else(|| format!("line {}: COPY without --from", copy_ins.line))?;
    let build_idx = stages[..last]
        .iter()
        .position(|s| s.name.as_deref() == Some(from))
        .or_else(|| from.parse::<usize>().ok().filter(|i| *i < last))
        .ok_or_else(|| {
            format!(
                "line {}: COPY --from={from}: no such earlier stage",
                copy_ins.line
            )
        })?;
    let build = &stages[build_idx];

    // The build stage's cargo build, the same as the script's.
    let mut cargo = Vec::new();
    let mut workdir: Option<String> = None;
    let mut workdir_at_build = None;
    for ins in &build.body {
        match ins.keyword.as_str() {
            "WORKDIR" => {
                let dir = ins.args.clone();
                workdir = Some(match workdir {
                    Some(w) if !dir.starts_with('/') => {
                        format!("{}/{dir}", w.trim_end_matches('/'))
                    }
                    _ => dir,
                });
            }
            "RUN" => {
                let builds = match exec_form(&ins.args) {
                    Some(argv) => cargo_builds(&shell_join(&argv)),
                    None => cargo_builds(&ins.args),
                };
                if !builds.is_empty() {
                    workdir_at_build = workdir.clone();
                }
                cargo.extend(builds);
            }
            "ENV" | "ARG" => {
                for var in [
                    "CARGO_TARGET_DIR",
                    "CARGO_BUILD_TARGET",
                    "CARGO_BUILD_TARGET_DIR",
                ] {
                    if ins.args.contains(var) {
                        return Err(format!(
                            "line {}: {var} in the build stage moves the binary",
                            ins.line
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    let [cargo] = <[Vec<String>; 1]>::try_from(cargo).map_err(|c| {
        format!(
            "build stage {:?} has {} cargo build commands: expected one",
            build.name,
            c.len()
        )
    })?;
    let script_builds = script_cargo_builds(script);
    let [script_cargo] = script_builds.as_slice() else {
        return Err(format!(
            "scripts/static-build.sh has {} cargo build commands: expected one",
            script_builds.len()
        ));
    };
    if &cargo != script_cargo {
        return Err(format!(
            "the Dockerfile builds with {:?} but scripts/static-build.sh with {:?}",
            cargo.join(" "),
            script_cargo.join(" ")
        ));
    }
    for needed in ["--release", "--locked"] {
        if !cargo.iter().any(|a| a == needed) {
            return Err(format!("cargo build without {needed}"));
        }
    }
    let triple = flag_value(&cargo, "--target").ok_or("cargo build without --target")?;
    if !triple.ends_with("-linux-musl") {
        return Err(format!(
            "cargo build --target {triple}: not a static musl target"
        ));
    }
    let bin = flag_value(&cargo, "--bin").ok_or("cargo build without --bin")?;
    // The build stage brings what the script makes sure of: the rustup target and musl-tools.
    let runs: Vec<&str> = build
        .body
        .iter()
        .filter(|i| i.keyword == "RUN")
        .map(|i| i.args.as_str())
        .collect();
    if !runs
        .iter()
        .any(|r| r.contains(&format!("rustup target add {triple}")))
    {
        return Err(format!(
            "build stage does not add the rustup target {triple}"
        ));
    }
    if !runs.iter().any(|r| r.contains("musl-tools")) {
        return Err("build stage does not install musl-tools (ring's C compiler)".into());
    }

    // The copied file: exactly the build's artifact.
    let workdir = workdir_at_build
        .filter(|w| w.starts_with('/'))
        .ok_or("the build stage runs cargo without an absolute WORKDIR")?;
    let artifact = format!(
        "{}/target/{triple}/release/{bin}",
        workdir.trim_end_matches('/')
    );
    if copy.sources != [artifact.clone()] {
        return Err(format!(
            "line {}: final stage copies {:?}: expected exactly [{artifact:?}]",
            copy_ins.line, copy.sources
        ));
    }
    if !copy.dest.starts_with('/') {
        return Err(format!(
            "line {}: COPY destination {:?} is not absolute",
            copy_ins.line, copy.dest
        ));
    }
    let binary = if copy.dest.ends_with('/') {
        format!("{}{bin}", copy.dest)
    } else {
        copy.dest.clone()
    };

    // USER: numeric and not root.
    let user = fin
        .body
        .iter()
        .rfind(|i| i.keyword == "USER")
        .ok_or("final stage has no USER: it would run as root")?;
    let (uid, gid) = match user.args.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user.args.as_str(), None),
    };
    let numeric = |s: &str| -> Result<u32, String> {
        s.parse::<u32>()
            .ok()
            .filter(|_| s.chars().all(|c| c.is_ascii_digit()))
            .ok_or_else(|| {
                format!(
                    "line {}: USER {:?} is not numeric (an empty image has no /etc/passwd)",
                    user.line, user.args
                )
            })
    };
    let uid = numeric(uid)?;
    let gid = gid.map(numeric).transpose()?;
    if uid == 0 || gid == Some(0) {
        return Err(format!("line {}: USER {} is root", user.line, user.args));
    }

    // ENTRYPOINT: exec form, the copied binary. A CMD, if any, exec form too.
    let entry = fin
        .body
        .iter()
        .rfind(|i| i.keyword == "ENTRYPOINT")
        .ok_or("final stage has no ENTRYPOINT")?;
    let entrypoint = exec_form(&entry.args).ok_or_else(|| {
        format!(
            "line {}: ENTRYPOINT {} is shell form: the image has no shell",
            entry.line, entry.args
        )
    })?;
    if entrypoint.first() != Some(&binary) {
        return Err(format!(
            "line {}: ENTRYPOINT {entrypoint:?} does not start the copied binary {binary:?}",
            entry.line
        ));
    }
    if let Some(cmd) = fin.body.iter().rfind(|i| i.keyword == "CMD")
        && exec_form(&cmd.args).is_none()
    {
        return Err(format!(
            "line {}: CMD is shell form: the image has no shell",
            cmd.line
        ));
    }

    Ok(Image {
        cargo,
        binary,
        uid,
        gid,
        entrypoint,
    })
}

fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
}

fn image() -> Image {
    check_dockerfile(&read("Dockerfile"), &read("scripts/static-build.sh"))
        .unwrap_or_else(|e| panic!("Dockerfile: {e}"))
}

#[test]
fn dockerfile_builds_a_static_binary_into_an_empty_image() {
    let image = image();
    println!("image: cargo {}", image.cargo[1..].join(" "));
    println!(
        "image: binary {} run as {}{} via {:?}",
        image.binary,
        image.uid,
        image.gid.map(|g| format!(":{g}")).unwrap_or_default(),
        image.entrypoint
    );
    assert_eq!(
        image.cargo,
        shell_words(
            "cargo build --release --locked --target x86_64-unknown-linux-musl -p valkey-sidecar --bin valkey-sidecar"
        )
    );
}

/// The checks above refuse what they should: each mutation of the real files is caught.
#[test]
fn dockerfile_checks_catch_mistakes() {
    let dockerfile = read("Dockerfile");
    let script = read("scripts/static-build.sh");
    check_dockerfile(&dockerfile, &script).unwrap();
    let replace = |text: &str, from: &str, to: &str| {
        assert!(
            text.contains(from),
            "{from:?} not found: the mutation test is stale"
        );
        text.replace(from, to)
    };
    let user = dockerfile
        .lines()
        .find(|l| l.starts_with("USER "))
        .expect("a USER line");
    let entry = dockerfile
        .lines()
        .find(|l| l.starts_with("ENTRYPOINT "))
        .expect("an ENTRYPOINT line");
    let copy = dockerfile
        .lines()
        .find(|l| l.starts_with("COPY --from="))
        .expect("a COPY --from line");
    let cases = [
        (
            replace(&dockerfile, "FROM scratch", "FROM debian:bookworm-slim"),
            script.clone(),
            "scratch or a distroless",
        ),
        (
            replace(&dockerfile, user, "USER 0:0"),
            script.clone(),
            "is root",
        ),
        (
            replace(&dockerfile, user, "USER nobody"),
            script.clone(),
            "not numeric",
        ),
        (replace(&dockerfile, user, ""), script.clone(), "no USER"),
        (
            replace(&dockerfile, entry, "ENTRYPOINT /valkey-sidecar"),
            script.clone(),
            "shell form",
        ),
        (
            replace(&dockerfile, entry, "ENTRYPOINT [\"/bin/sh\"]"),
            script.clone(),
            "does not start the copied binary",
        ),
        (
            replace(&dockerfile, copy, &copy.replace("/release/", "/debug/")),
            script.clone(),
            "expected exactly",
        ),
        (
            replace(
                &dockerfile,
                copy,
                &format!("{copy}\nCOPY --from=build /etc/passwd /etc/passwd"),
            ),
            script.clone(),
            "exactly one",
        ),
        (
            format!("{dockerfile}\nRUN true\n"),
            script.clone(),
            "RUN in the final stage",
        ),
        (
            replace(
                &dockerfile,
                "--bin valkey-sidecar",
                "--bin valkey-sidecar --features x",
            ),
            script.clone(),
            "but scripts/static-build.sh",
        ),
        (
            dockerfile.clone(),
            replace(&script, "--locked", ""),
            "but scripts/static-build.sh",
        ),
        (
            dockerfile.clone(),
            replace(&script, "cargo build", "CC=clang cargo build"),
            "but scripts/static-build.sh",
        ),
        (
            dockerfile.clone(),
            format!("{script}\ncargo build --release\n"),
            "2 cargo build commands",
        ),
        (
            replace(
                &dockerfile,
                "--no-install-recommends musl-tools",
                "--no-install-recommends gcc",
            ),
            script.clone(),
            "musl-tools",
        ),
    ];
    for (i, (d, s, expected)) in cases.iter().enumerate() {
        match check_dockerfile(d, s) {
            Ok(_) => panic!("case {i} ({expected}) passed:\n{d}"),
            Err(e) => assert!(
                e.contains(expected),
                "case {i}: {e:?} does not say {expected:?}"
            ),
        }
    }
    // The shell parsing the comparison rests on.
    assert_eq!(
        script_cargo_builds(
            "# cargo build --no\nX=1 cargo build \\\n  --release >&2 2>/dev/null | cat && echo\n"
        ),
        [shell_words("X=1 cargo build --release")]
    );
    assert_eq!(
        shell_words(r#"a 'b c' "d\"e" f\ g;h"#),
        ["a", "b c", "d\"e", "f g", ";", "h"]
    );
}

// ---------------------------------------------------------------------------------------------
// ELF64 program headers
// ---------------------------------------------------------------------------------------------

const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_FLAGS_1: u64 = 0x6fff_fffb;
const DF_1_PIE: u64 = 0x0800_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Linkage {
    /// `ET_EXEC`, no loader, no shared library.
    Static,
    /// `ET_DYN` with `DF_1_PIE`: relocates itself, no loader, no shared library.
    StaticPie,
}

struct Elf<'a>(&'a [u8]);

impl Elf<'_> {
    fn bytes<const N: usize>(&self, at: u64) -> Result<[u8; N], String> {
        let start = usize::try_from(at).map_err(|e| e.to_string())?;
        self.0
            .get(start..start.saturating_add(N))
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| format!("truncated ELF: {N} bytes at {at:#x}"))
    }
    fn u16(&self, at: u64) -> Result<u16, String> {
        self.bytes(at).map(u16::from_le_bytes)
    }
    fn u32(&self, at: u64) -> Result<u32, String> {
        self.bytes(at).map(u32::from_le_bytes)
    }
    fn u64(&self, at: u64) -> Result<u64, String> {
        self.bytes(at).map(u64::from_le_bytes)
    }
}

#[derive(Debug)]
struct Phdr {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

/// Classifies a little-endian x86-64 ELF64 file; every reason it is not static, at once.
fn classify_elf(data: &[u8]) -> Result<Linkage, String> {
    let elf = Elf(data);
    if data.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err("not an ELF file".into());
    }
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        return Err("not a little-endian ELF64 file".into());
    }
    let e_type = elf.u16(16)?;
    let machine = elf.u16(18)?;
    if machine != EM_X86_64 {
        return Err(format!("e_machine {machine}: not x86-64"));
    }
    let phoff = elf.u64(0x20)?;
    let phentsize = u64::from(elf.u16(0x36)?);
    let phnum = elf.u16(0x38)?;
    if phentsize != 56 {
        return Err(format!(
            "e_phentsize {phentsize}: not an ELF64 program header"
        ));
    }
    let phdrs = (0..u64::from(phnum))
        .map(|i| {
            let at = phoff + i * phentsize;
            Ok(Phdr {
                kind: elf.u32(at)?,
                offset: elf.u64(at + 8)?,
                vaddr: elf.u64(at + 16)?,
                filesz: elf.u64(at + 32)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;

    let mut problems = Vec::new();
    if let Some(p) = phdrs.iter().find(|p| p.kind == PT_INTERP) {
        let path = data
            .get(p.offset as usize..(p.offset + p.filesz) as usize)
            .map(|s| String::from_utf8_lossy(s).trim_end_matches('\0').to_owned())
            .unwrap_or_default();
        problems.push(format!("PT_INTERP {path:?}: needs a dynamic loader"));
    }
    let mut pie = false;
    let mut dynamic = false;
    if let Some(d) = phdrs.iter().find(|p| p.kind == PT_DYNAMIC) {
        dynamic = true;
        let mut needed = Vec::new();
        let mut strtab = None;
        for i in 0..d.filesz / 16 {
            let tag = elf.u64(d.offset + i * 16)?;
            let val = elf.u64(d.offset + i * 16 + 8)?;
            match tag {
                DT_NULL => break,
                DT_NEEDED => needed.push(val),
                DT_STRTAB => strtab = Some(val),
                DT_FLAGS_1 => pie = val & DF_1_PIE != 0,
                _ => {}
            }
        }
        // Library names, for the message: DT_STRTAB is an address, mapped to the file by PT_LOAD.
        let names: Vec<String> = needed
            .iter()
            .map(|off| {
                let addr = strtab.unwrap_or_default() + off;
                phdrs
                    .iter()
                    .find(|p| p.kind == PT_LOAD && p.vaddr <= addr && addr < p.vaddr + p.filesz)
                    .and_then(|p| data.get((addr - p.vaddr + p.offset) as usize..))
                    .and_then(|s| s.split(|b| *b == 0).next())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .unwrap_or_else(|| format!("<name at {addr:#x}>"))
            })
            .collect();
        if !names.is_empty() {
            problems.push(format!("DT_NEEDED {names:?}: needs shared libraries"));
        }
    }
    let linkage = match e_type {
        ET_EXEC => Some(Linkage::Static),
        ET_DYN if dynamic && pie => Some(Linkage::StaticPie),
        ET_DYN if !dynamic => {
            problems.push("ET_DYN without PT_DYNAMIC: cannot relocate itself".into());
            None
        }
        ET_DYN => {
            problems.push("ET_DYN without DF_1_PIE: a shared library, not an executable".into());
            None
        }
        t => {
            problems.push(format!("e_type {t}: not an executable"));
            None
        }
    };
    match linkage {
        Some(l) if problems.is_empty() => Ok(l),
        _ => Err(problems.join("; ")),
    }
}

#[test]
fn elf_reader_refuses_a_dynamic_executable() {
    // This test binary: a glibc PIE with a loader and shared libraries.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let err = classify_elf(&me).expect_err("the test binary is dynamically linked");
    println!("elf: the test binary is refused: {err}");
    assert!(err.contains("PT_INTERP"), "{err}");
    assert!(
        err.contains("DT_NEEDED") && err.contains("libc.so"),
        "{err}"
    );
    assert!(classify_elf(b"#!/bin/sh\n").is_err());
}

// ---------------------------------------------------------------------------------------------
// The static binary
// ---------------------------------------------------------------------------------------------

/// Runs `scripts/static-build.sh` once per test process and returns the binary it printed.
fn static_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = root().join("scripts/static-build.sh");
        let started = Instant::now();
        let out = Command::new(&script)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{} failed ({}):\n{stderr}",
            script.display(),
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let path = PathBuf::from(stdout.trim());
        assert!(
            stdout.lines().count() == 1 && path.is_absolute() && path.is_file(),
            "static-build.sh printed {stdout:?}, not the path of a file"
        );
        let finished = stderr
            .lines()
            .rfind(|l| l.trim_start().starts_with("Finished"))
            .unwrap_or("")
            .trim();
        println!(
            "build: scripts/static-build.sh took {:.1}s ({finished})",
            started.elapsed().as_secs_f64()
        );
        path
    })
}

#[test]
fn static_binary_is_a_static_elf() {
    let bin = static_binary();
    let data = std::fs::read(bin).unwrap();
    let linkage = classify_elf(&data).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    println!(
        "elf: {} is {linkage:?} (no PT_INTERP, no DT_NEEDED)",
        bin.display()
    );
}

/// A root directory holding only what the image holds: the binary, where the Dockerfile puts it.
fn image_root(image: &Image) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join(image.binary.trim_start_matches('/'));
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(static_binary(), &dest).unwrap();
    // The non-root user must be able to reach and run it.
    let mut dir_path = dest.parent();
    while let Some(d) = dir_path.filter(|d| d.starts_with(dir.path())) {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir_path = d.parent();
    }
    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// Runs the image's ENTRYPOINT (plus `args`) as its USER in its root, with only `env`.
fn run_image(image: &Image, rootfs: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let chroot = ["/usr/sbin/chroot", "/usr/bin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("chroot");
    let user = format!("{}:{}", image.uid, image.gid.unwrap_or(image.uid));
    let mut cmd = Command::new(chroot);
    cmd.env_clear()
        .arg(format!("--userspec={user}"))
        .arg(rootfs)
        .args(&image.entrypoint)
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("running {chroot}: {e}"))
}

#[test]
fn static_binary_runs_alone_as_the_image_user() {
    let image = image();
    let rootfs = image_root(&image);
    let entries: Vec<_> = walk(rootfs.path());
    assert_eq!(
        entries.len(),
        1,
        "the image root holds more than the binary: {entries:?}"
    );

    let help = run_image(&image, rootfs.path(), &["--help"], &[]);
    let stdout = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.status.success(),
        "--help: {} {stdout} {}",
        help.status,
        String::from_utf8_lossy(&help.stderr)
    );
    assert!(
        stdout.contains("Usage: valkey-sidecar"),
        "--help printed: {stdout}"
    );
    assert!(stdout.contains("--valkey-addr"), "--help printed: {stdout}");

    let version = run_image(&image, rootfs.path(), &["--version"], &[]);
    let stdout = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.status.success(),
        "--version: {} {stdout}",
        version.status
    );
    assert_eq!(
        stdout.trim(),
        format!("valkey-sidecar {}", env!("CARGO_PKG_VERSION"))
    );
    println!(
        "run: {} --version as {}: {}",
        image.binary,
        image.uid,
        stdout.trim()
    );

    let bad = run_image(&image, rootfs.path(), &[], &[("SIDECAR_MODE", "sentinel")]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(
        bad.status.code(),
        Some(64),
        "SIDECAR_MODE=sentinel: {stderr}"
    );
    assert!(
        stderr.contains("  SIDECAR_MODE=\"sentinel\""),
        "stderr: {stderr}"
    );
    println!(
        "run: SIDECAR_MODE=sentinel exits {:?}: {}",
        bad.status.code(),
        stderr.lines().nth(1).unwrap_or("").trim()
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// The layer a `COPY` of one file makes: a tar of one 512-byte header, the file padded to a
/// 512-byte block, and the end-of-archive marker (two zero blocks). Docker's and BuildKit's tar
/// writer (Go's archive/tar) adds no record padding.
fn layer_tar_bytes(file: u64) -> u64 {
    512 + file.div_ceil(512) * 512 + 1024
}

#[test]
fn image_size_is_within_budget() {
    let image = image();
    let bin = static_binary();
    let size = std::fs::metadata(bin).unwrap().len();
    let layer = layer_tar_bytes(size);
    println!("size: binary {size} bytes ({:.2} MiB)", size as f64 / MIB);
    println!(
        "size: image estimate {layer} bytes ({:.2} MiB): scratch has no layer, the one COPY layer is \
         the binary plus {} bytes of tar header, padding and end marker (config and manifest are a \
         few hundred bytes of metadata, not counted)",
        layer as f64 / MIB,
        layer - size
    );
    // Cross-check the tar arithmetic with a real tar of the image root, when tar is at hand.
    let rootfs = image_root(&image);
    let entry = image.binary.trim_start_matches('/');
    if let Ok(out) = Command::new("tar")
        .args(["--format=ustar", "--blocking-factor=1", "-cf", "-", "-C"])
        .arg(rootfs.path())
        .arg(entry)
        .output()
        && out.status.success()
    {
        assert_eq!(out.stdout.len() as u64, layer, "tar of the image root");
        println!(
            "size: tar of the image root: {} bytes (matches)",
            out.stdout.len()
        );
    }
    assert!(
        layer <= MAX_IMAGE_BYTES,
        "image estimate {layer} bytes ({:.2} MiB) is over the {} MiB target",
        layer as f64 / MIB,
        MAX_IMAGE_BYTES / 1024 / 1024
    );
}
