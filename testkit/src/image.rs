//! The container image (`Dockerfile`), checked without a Docker engine (used by `tests/image.rs`).
//!
//! - [`check_dockerfile`]: the packaging rules. A build stage and a final `FROM scratch` (or
//!   distroless) stage that copies exactly the build stage's
//!   `target/<musl triple>/release/<bin>`, runs it as a numeric non-root `USER` and starts it
//!   through an exec-form `ENTRYPOINT` (an empty image has no shell). The build stage's
//!   `cargo build` has the same arguments as the one in `scripts/static-build.sh`, so the two
//!   cannot drift apart. The parser underneath ([`stages`], [`parse_copy`], [`exec_form`],
//!   [`shell_words`], [`cargo_builds`]) knows just enough Dockerfile and shell for that.
//! - [`classify_elf`]: a small ELF64 program-header reader proving a binary needs no loader
//!   (`PT_INTERP`) and no shared library (`DT_NEEDED`): a classic static `ET_EXEC`, or static-pie
//!   (`ET_DYN` with `DF_1_PIE` and a `PT_DYNAMIC` only for its own relocations), which is how this
//!   toolchain links the musl target.
//! - [`layer_tar_bytes`]: the size of the one layer a `COPY` of one file makes.
//!
//! Errors are plain `String`s: each names the rule that failed and the Dockerfile line, and the
//! tests match on those words.

// ---------------------------------------------------------------------------------------------
// Dockerfile parser
// ---------------------------------------------------------------------------------------------

/// One instruction, continuation lines joined, keyword upper-cased.
#[derive(Debug, Clone)]
pub struct Instruction {
    /// The 1-based line the instruction starts on.
    pub line: usize,
    pub keyword: String,
    pub args: String,
}

/// A `FROM` and the instructions up to the next one.
#[derive(Debug)]
pub struct Stage {
    pub base: String,
    /// The `AS` name, if any.
    pub name: Option<String>,
    pub body: Vec<Instruction>,
}

impl Stage {
    /// The last `keyword` instruction: the one that takes effect for `USER`, `ENTRYPOINT`, `CMD`.
    fn last(&self, keyword: &str) -> Option<&Instruction> {
        self.body.iter().rfind(|i| i.keyword == keyword)
    }
}

/// Instructions of a Dockerfile (default escape character `\`): comment and empty lines dropped,
/// also inside continuations, as Docker does.
pub fn instructions(text: &str) -> Result<Vec<Instruction>, String> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        refuse_escape_directive(i + 1, trimmed)?;
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (line, joined) = join_line(pending.take(), i + 1, trimmed);
        if trimmed.ends_with('\\') {
            pending = Some((line, joined));
        } else {
            out.push(instruction(line, &joined));
        }
    }
    match pending {
        Some((line, _)) => Err(format!("line {line}: continuation at the end of the file")),
        None => Ok(out),
    }
}

/// A different escape character would change how every other line splits.
fn refuse_escape_directive(line: usize, trimmed: &str) -> Result<(), String> {
    if trimmed.starts_with("# escape=") || trimmed.starts_with("#escape=") {
        return Err(format!("line {line}: escape directives are not supported"));
    }
    Ok(())
}

/// Appends one physical line (its trailing `\` dropped) to the pending instruction, or starts
/// one at `line`.
fn join_line(pending: Option<(usize, String)>, line: usize, trimmed: &str) -> (usize, String) {
    let content = trimmed.strip_suffix('\\').unwrap_or(trimmed);
    let (line, mut joined) = pending.unwrap_or((line, String::new()));
    if !joined.is_empty() {
        joined.push(' ');
    }
    joined.push_str(content.trim());
    (line, joined)
}

fn instruction(line: usize, text: &str) -> Instruction {
    let (keyword, args) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    Instruction {
        line,
        keyword: keyword.to_ascii_uppercase(),
        args: args.trim().to_owned(),
    }
}

/// Splits instructions into stages at `FROM [--platform=...] image [AS name]`.
pub fn stages(text: &str) -> Result<Vec<Stage>, String> {
    let mut out: Vec<Stage> = Vec::new();
    for ins in instructions(text)? {
        if ins.keyword == "FROM" {
            out.push(from_stage(&ins)?);
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

/// The (still empty) stage a `FROM` starts; flags such as `--platform` are ignored.
fn from_stage(ins: &Instruction) -> Result<Stage, String> {
    let words: Vec<&str> = ins
        .args
        .split_whitespace()
        .filter(|w| !w.starts_with("--"))
        .collect();
    let (base, name) = match words.as_slice() {
        [base] => (*base, None),
        [base, as_, name] if as_.eq_ignore_ascii_case("as") => (*base, Some((*name).to_owned())),
        _ => return Err(format!("line {}: malformed FROM {:?}", ins.line, ins.args)),
    };
    Ok(Stage {
        base: base.to_owned(),
        name,
        body: Vec::new(),
    })
}

/// `COPY [--flag=value ...] src... dest`, shell or JSON form.
#[derive(Debug)]
pub struct CopyArgs {
    /// `--from=`: the stage (name or index) the sources come from.
    pub from: Option<String>,
    pub sources: Vec<String>,
    pub dest: String,
}

pub fn parse_copy(args: &str) -> Result<CopyArgs, String> {
    let (from, rest) = copy_flags(args);
    let mut paths = copy_paths(args, rest)?;
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

/// The `--from=` value among the leading `--flag`s, and the text after the flags.
fn copy_flags(args: &str) -> (Option<String>, &str) {
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
    (from, rest)
}

/// The paths of a COPY, sources then destination.
fn copy_paths(args: &str, rest: &str) -> Result<Vec<String>, String> {
    if rest.starts_with('[') {
        serde_json::from_str(rest).map_err(|e| format!("COPY {args:?}: bad JSON form: {e}"))
    } else {
        Ok(rest.split_whitespace().map(str::to_owned).collect())
    }
}

/// The argument vector of an exec-form (JSON array) `ENTRYPOINT`/`CMD`/`RUN`; `None` for shell form.
pub fn exec_form(args: &str) -> Option<Vec<String>> {
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
pub fn shell_words(text: &str) -> Vec<String> {
    let mut lexer = Lexer {
        chars: text.chars().peekable(),
        words: Vec::new(),
        cur: String::new(),
        in_word: false,
    };
    while let Some(c) = lexer.chars.next() {
        lexer.step(c);
    }
    lexer.flush();
    lexer.words
}

/// [`shell_words`]' state. `in_word` is separate from `cur` being non-empty because `''` is a
/// word too.
struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    words: Vec<String>,
    cur: String,
    in_word: bool,
}

impl Lexer<'_> {
    fn step(&mut self, c: char) {
        match c {
            '\'' => self.single_quoted(),
            '"' => self.double_quoted(),
            '\\' => {
                let escaped = self.chars.next();
                self.literal(escaped);
            }
            ';' => self.operator(";".into()),
            '|' | '&' if self.chars.peek() == Some(&c) => {
                self.chars.next();
                self.operator(format!("{c}{c}"));
            }
            '|' => self.operator("|".into()),
            c if c.is_whitespace() => self.flush(),
            c => self.literal(Some(c)),
        }
    }

    fn flush(&mut self) {
        if self.in_word {
            self.words.push(std::mem::take(&mut self.cur));
            self.in_word = false;
        }
    }

    fn operator(&mut self, op: String) {
        self.flush();
        self.words.push(op);
    }

    fn literal(&mut self, c: Option<char>) {
        self.in_word = true;
        self.cur.extend(c);
    }

    /// After a `'`: everything up to the next `'`, verbatim.
    fn single_quoted(&mut self) {
        self.in_word = true;
        for q in self.chars.by_ref() {
            if q == '\'' {
                break;
            }
            self.cur.push(q);
        }
    }

    /// After a `"`: up to the next unescaped `"`, backslash escapes resolved.
    fn double_quoted(&mut self) {
        self.in_word = true;
        while let Some(q) = self.chars.next() {
            match q {
                '"' => break,
                '\\' => self.cur.extend(self.chars.next()),
                _ => self.cur.push(q),
            }
        }
    }
}

/// Simple commands of `words` (split at `;`, `|`, `&&`, `||`), redirections removed.
fn simple_commands(words: &[String]) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new()];
    let mut skip_next = false;
    for w in words {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        if matches!(w.as_str(), ";" | "|" | "&&" | "||") {
            out.push(Vec::new());
        } else if let Some(takes_next) = redirection(w) {
            skip_next = takes_next;
        } else if let Some(cmd) = out.last_mut() {
            cmd.push(w.clone());
        }
    }
    out.retain(|c| !c.is_empty());
    out
}

/// `None` for a plain word; for a redirection, whether its target is the next word: `>&2`,
/// `2>&1`, `>file` carry their target, `>` and `2>` take the next word.
fn redirection(word: &str) -> Option<bool> {
    let redirect = word.trim_start_matches(|c: char| c.is_ascii_digit());
    (redirect.starts_with('>') || redirect.starts_with('<'))
        .then(|| redirect.trim_start_matches(['>', '<', '&']).is_empty() && !redirect.contains('&'))
}

/// The `cargo build` commands (leading `VAR=value` words kept) in a piece of shell.
pub fn cargo_builds(shell: &str) -> Vec<Vec<String>> {
    simple_commands(&shell_words(shell))
        .into_iter()
        .filter(|cmd| is_cargo_build(cmd))
        .collect()
}

fn is_cargo_build(cmd: &[String]) -> bool {
    let mut rest = cmd.iter().skip_while(|w| is_assignment(w));
    rest.next().is_some_and(|w| w == "cargo") && rest.next().is_some_and(|w| w == "build")
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The `cargo build` commands of a bash script.
pub fn script_cargo_builds(script: &str) -> Vec<Vec<String>> {
    join_script_lines(script)
        .lines()
        .flat_map(cargo_builds)
        .collect()
}

/// The script with continuation lines joined and comment lines emptied, one command line per line.
fn join_script_lines(script: &str) -> String {
    let mut joined = String::new();
    for line in script.lines().map(str::trim) {
        if line.starts_with('#') {
            joined.push('\n');
        } else if let Some(content) = line.strip_suffix('\\') {
            joined.push_str(content);
            joined.push(' ');
        } else {
            joined.push_str(line);
            joined.push('\n');
        }
    }
    joined
}

/// An exec-form argument vector as shell text that [`shell_words`] splits back into it.
fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ")
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
pub struct Image {
    /// The `cargo build` argument vector of the build stage.
    pub cargo: Vec<String>,
    /// Where the binary sits in the image.
    pub binary: String,
    pub uid: u32,
    pub gid: Option<u32>,
    pub entrypoint: Vec<String>,
}

/// The build stage's one `cargo build` and what the artifact's path follows from.
struct Build {
    argv: Vec<String>,
    triple: String,
    bin: String,
    /// The WORKDIR the build runs in.
    workdir: Option<String>,
}

/// Checks a Dockerfile against the packaging rules and the script's `cargo build`. The rules run
/// in a fixed order and the first that fails is reported.
pub fn check_dockerfile(dockerfile: &str, script: &str) -> Result<Image, String> {
    let stages = stages(dockerfile)?;
    let (fin, earlier) = check_final_stage(&stages)?;
    check_pinned(&stages)?;
    let (copy_ins, copy) = check_copy(fin)?;
    let build_stage = copied_stage(earlier, copy_ins, &copy)?;
    let build = check_build_command(build_stage, script)?;
    let binary = check_copied_binary(copy_ins, &copy, &build)?;
    let (uid, gid) = check_user(fin)?;
    let entrypoint = check_entrypoint(fin, &binary)?;
    check_cmd(fin)?;
    Ok(Image {
        cargo: build.argv,
        binary,
        uid,
        gid,
        entrypoint,
    })
}

/// Every base image but `scratch` (and earlier stages) is pinned by digest: a tag moves, so the
/// same Dockerfile could otherwise build from different compilers and libraries.
fn check_pinned(stages: &[Stage]) -> Result<(), String> {
    let names: Vec<&str> = stages.iter().filter_map(|s| s.name.as_deref()).collect();
    for stage in stages {
        if stage.base == "scratch" || names.contains(&stage.base.as_str()) {
            continue;
        }
        let digest = stage.base.split_once("@sha256:").map(|(_, d)| d);
        let pinned =
            digest.is_some_and(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()));
        if !pinned {
            return Err(format!(
                "base image {} is not pinned by digest (@sha256:…)",
                stage.base
            ));
        }
    }
    Ok(())
}

/// The final stage (and the ones before it): an empty or distroless base that only receives.
fn check_final_stage(stages: &[Stage]) -> Result<(&Stage, &[Stage]), String> {
    let (fin, earlier) = match stages.split_last() {
        Some((fin, earlier)) if !earlier.is_empty() => (fin, earlier),
        _ => {
            return Err(format!(
                "{} stage(s): expected a build stage and a final stage",
                stages.len()
            ));
        }
    };
    check_final_base(fin)?;
    check_final_body(fin)?;
    Ok((fin, earlier))
}

fn check_final_base(fin: &Stage) -> Result<(), String> {
    if fin.base == "scratch" || fin.base.starts_with("gcr.io/distroless/") {
        return Ok(());
    }
    Err(format!(
        "final stage is FROM {}: expected scratch or a distroless image",
        fin.base
    ))
}

/// Nothing that runs or fetches in the final stage: it has no shell, and holds only the binary.
fn check_final_body(fin: &Stage) -> Result<(), String> {
    let bad = fin
        .body
        .iter()
        .find(|i| matches!(i.keyword.as_str(), "RUN" | "ADD" | "ONBUILD"));
    match bad {
        Some(ins) => Err(format!(
            "line {}: {} in the final stage (it holds only the copied binary)",
            ins.line, ins.keyword
        )),
        None => Ok(()),
    }
}

/// Exactly one COPY in the final stage: the binary.
fn check_copy(fin: &Stage) -> Result<(&Instruction, CopyArgs), String> {
    let copies: Vec<(&Instruction, CopyArgs)> = fin
        .body
        .iter()
        .filter(|i| i.keyword == "COPY")
        .map(|i| parse_copy(&i.args).map(|c| (i, c)))
        .collect::<Result<_, _>>()?;
    let [copy] = <[_; 1]>::try_from(copies).map_err(|copies| {
        format!(
            "final stage has {} COPY instructions: expected exactly one (the binary)",
            copies.len()
        )
    })?;
    Ok(copy)
}

/// The earlier stage the COPY takes the binary from, by name or index.
fn copied_stage<'a>(
    earlier: &'a [Stage],
    ins: &Instruction,
    copy: &CopyArgs,
) -> Result<&'a Stage, String> {
    let from = copy
        .from
        .as_deref()
        .ok_or_else(|| format!("line {}: COPY without --from", ins.line))?;
    earlier
        .iter()
        .find(|s| s.name.as_deref() == Some(from))
        .or_else(|| from.parse::<usize>().ok().and_then(|i| earlier.get(i)))
        .ok_or_else(|| {
            format!(
                "line {}: COPY --from={from}: no such earlier stage",
                ins.line
            )
        })
}

/// The build stage's `cargo build`: the script's, a release build of the lockfile for a musl
/// target, with the toolchain that target needs.
fn check_build_command(stage: &Stage, script: &str) -> Result<Build, String> {
    let (argv, workdir) = the_cargo_build(stage)?;
    check_same_as_script(&argv, script)?;
    check_release_locked(&argv)?;
    let triple = check_musl_target(&argv)?.to_owned();
    let bin = flag_value(&argv, "--bin")
        .ok_or("cargo build without --bin")?
        .to_owned();
    check_rustup_target(stage, &triple)?;
    check_musl_tools(stage)?;
    Ok(Build {
        argv,
        triple,
        bin,
        workdir,
    })
}

/// The stage's one `cargo build` and the WORKDIR it runs in.
fn the_cargo_build(stage: &Stage) -> Result<(Vec<String>, Option<String>), String> {
    stage.body.iter().try_for_each(check_build_env)?;
    let [build] = <[_; 1]>::try_from(cargo_runs(stage)).map_err(|builds| {
        format!(
            "build stage {:?} has {} cargo build commands: expected one",
            stage.name,
            builds.len()
        )
    })?;
    Ok(build)
}

/// No `ENV`/`ARG` that would make cargo put the binary somewhere the COPY does not look.
fn check_build_env(ins: &Instruction) -> Result<(), String> {
    if !matches!(ins.keyword.as_str(), "ENV" | "ARG") {
        return Ok(());
    }
    let vars = [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
    ];
    match vars.into_iter().find(|var| ins.args.contains(var)) {
        Some(var) => Err(format!(
            "line {}: {var} in the build stage moves the binary",
            ins.line
        )),
        None => Ok(()),
    }
}

/// Every `cargo build` of the stage's RUN lines, each with the WORKDIR in effect there.
fn cargo_runs(stage: &Stage) -> Vec<(Vec<String>, Option<String>)> {
    let mut workdir: Option<String> = None;
    let mut out = Vec::new();
    for ins in &stage.body {
        match ins.keyword.as_str() {
            "WORKDIR" => workdir = Some(join_workdir(workdir.as_deref(), &ins.args)),
            "RUN" => out.extend(
                run_cargo_builds(&ins.args)
                    .into_iter()
                    .map(|b| (b, workdir.clone())),
            ),
            _ => {}
        }
    }
    out
}

/// A relative `WORKDIR` is relative to the one before it.
fn join_workdir(current: Option<&str>, dir: &str) -> String {
    match current {
        Some(w) if !dir.starts_with('/') => format!("{}/{dir}", w.trim_end_matches('/')),
        _ => dir.to_owned(),
    }
}

fn run_cargo_builds(args: &str) -> Vec<Vec<String>> {
    match exec_form(args) {
        Some(argv) => cargo_builds(&shell_join(&argv)),
        None => cargo_builds(args),
    }
}

/// The Dockerfile builds what the script builds (and the tests run), word for word.
fn check_same_as_script(argv: &[String], script: &str) -> Result<(), String> {
    let script_builds = script_cargo_builds(script);
    let [script_argv] = script_builds.as_slice() else {
        return Err(format!(
            "scripts/static-build.sh has {} cargo build commands: expected one",
            script_builds.len()
        ));
    };
    if argv != script_argv.as_slice() {
        return Err(format!(
            "the Dockerfile builds with {:?} but scripts/static-build.sh with {:?}",
            argv.join(" "),
            script_argv.join(" ")
        ));
    }
    Ok(())
}

fn check_release_locked(argv: &[String]) -> Result<(), String> {
    let missing = ["--release", "--locked"]
        .into_iter()
        .find(|needed| !argv.iter().any(|a| a == needed));
    match missing {
        Some(needed) => Err(format!("cargo build without {needed}")),
        None => Ok(()),
    }
}

/// The `--target` triple, which must be a musl one: the glibc targets link dynamically.
fn check_musl_target(argv: &[String]) -> Result<&str, String> {
    let triple = flag_value(argv, "--target").ok_or("cargo build without --target")?;
    if !triple.ends_with("-linux-musl") {
        return Err(format!(
            "cargo build --target {triple}: not a static musl target"
        ));
    }
    Ok(triple)
}

/// The stage's RUN lines, as the shell text Docker hands over.
fn runs(stage: &Stage) -> impl Iterator<Item = &str> {
    stage
        .body
        .iter()
        .filter(|i| i.keyword == "RUN")
        .map(|i| i.args.as_str())
}

/// The build stage adds the rustup target, as the script makes sure of.
fn check_rustup_target(stage: &Stage, triple: &str) -> Result<(), String> {
    let add = format!("rustup target add {triple}");
    if runs(stage).any(|r| r.contains(&add)) {
        return Ok(());
    }
    Err(format!(
        "build stage does not add the rustup target {triple}"
    ))
}

/// The build stage installs musl-tools, as the script makes sure of: ring compiles C.
fn check_musl_tools(stage: &Stage) -> Result<(), String> {
    if runs(stage).any(|r| r.contains("musl-tools")) {
        return Ok(());
    }
    Err("build stage does not install musl-tools (ring's C compiler)".into())
}

/// The COPY takes exactly the build's artifact to an absolute path; returns that path.
fn check_copied_binary(
    ins: &Instruction,
    copy: &CopyArgs,
    build: &Build,
) -> Result<String, String> {
    let artifact = artifact(build)?;
    if copy.sources != [artifact.as_str()] {
        return Err(format!(
            "line {}: final stage copies {:?}: expected exactly [{artifact:?}]",
            ins.line, copy.sources
        ));
    }
    installed_path(ins, copy, &build.bin)
}

/// Where cargo leaves the binary: `<WORKDIR>/target/<triple>/release/<bin>`.
fn artifact(build: &Build) -> Result<String, String> {
    let workdir = build
        .workdir
        .as_deref()
        .filter(|w| w.starts_with('/'))
        .ok_or("the build stage runs cargo without an absolute WORKDIR")?;
    let workdir = workdir.trim_end_matches('/');
    Ok(format!(
        "{workdir}/target/{}/release/{}",
        build.triple, build.bin
    ))
}

/// The binary's path in the image: the COPY destination, or the binary's name in it if it is a
/// directory.
fn installed_path(ins: &Instruction, copy: &CopyArgs, bin: &str) -> Result<String, String> {
    if !copy.dest.starts_with('/') {
        return Err(format!(
            "line {}: COPY destination {:?} is not absolute",
            ins.line, copy.dest
        ));
    }
    if copy.dest.ends_with('/') {
        Ok(format!("{}{bin}", copy.dest))
    } else {
        Ok(copy.dest.clone())
    }
}

/// `USER uid[:gid]`: numeric (an empty image has no /etc/passwd to resolve a name) and not root.
fn check_user(fin: &Stage) -> Result<(u32, Option<u32>), String> {
    let user = fin
        .last("USER")
        .ok_or("final stage has no USER: it would run as root")?;
    let (uid, gid) = match user.args.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user.args.as_str(), None),
    };
    let uid = numeric_id(user, uid)?;
    let gid = gid.map(|g| numeric_id(user, g)).transpose()?;
    if uid == 0 || gid == Some(0) {
        return Err(format!("line {}: USER {} is root", user.line, user.args));
    }
    Ok((uid, gid))
}

/// Digits only: `u32::from_str` would also take a leading `+`.
fn numeric_id(user: &Instruction, id: &str) -> Result<u32, String> {
    id.parse::<u32>()
        .ok()
        .filter(|_| id.chars().all(|c| c.is_ascii_digit()))
        .ok_or_else(|| {
            format!(
                "line {}: USER {:?} is not numeric (an empty image has no /etc/passwd)",
                user.line, user.args
            )
        })
}

/// `ENTRYPOINT`: exec form (there is no shell to run a shell form), starting the copied binary.
fn check_entrypoint(fin: &Stage, binary: &str) -> Result<Vec<String>, String> {
    let entry = fin
        .last("ENTRYPOINT")
        .ok_or("final stage has no ENTRYPOINT")?;
    let entrypoint = exec_form(&entry.args).ok_or_else(|| {
        format!(
            "line {}: ENTRYPOINT {} is shell form: the image has no shell",
            entry.line, entry.args
        )
    })?;
    if entrypoint.first().map(String::as_str) != Some(binary) {
        return Err(format!(
            "line {}: ENTRYPOINT {entrypoint:?} does not start the copied binary {binary:?}",
            entry.line
        ));
    }
    Ok(entrypoint)
}

/// A `CMD`, if any, is exec form too: a shell-form one would become `/bin/sh -c ...` arguments.
fn check_cmd(fin: &Stage) -> Result<(), String> {
    match fin.last("CMD") {
        Some(cmd) if exec_form(&cmd.args).is_none() => Err(format!(
            "line {}: CMD is shell form: the image has no shell",
            cmd.line
        )),
        _ => Ok(()),
    }
}

/// The layer a `COPY` of one file makes: a tar of one 512-byte header, the file padded to a
/// 512-byte block, and the end-of-archive marker (two zero blocks). Docker's and BuildKit's tar
/// writer (Go's archive/tar) adds no record padding.
pub fn layer_tar_bytes(file: u64) -> u64 {
    512 + file.div_ceil(512) * 512 + 1024
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

/// How a binary that runs without a loader or shared libraries is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linkage {
    /// `ET_EXEC`, no loader, no shared library.
    Static,
    /// `ET_DYN` with `DF_1_PIE`: relocates itself, no loader, no shared library.
    StaticPie,
}

/// Classifies a little-endian x86-64 ELF64 file; every reason it is not static, at once.
pub fn classify_elf(data: &[u8]) -> Result<Linkage, String> {
    let elf = Elf(data);
    let e_type = elf.header()?;
    let phdrs = elf.program_headers()?;
    let dynamic = elf.dynamic(&phdrs)?;
    let linkage = linkage(e_type, dynamic.as_ref());
    let problems: Vec<String> = [
        elf.interp_problem(&phdrs),
        dynamic.as_ref().and_then(|d| elf.needed_problem(&phdrs, d)),
        linkage.clone().err(),
    ]
    .into_iter()
    .flatten()
    .collect();
    if problems.is_empty() {
        linkage
    } else {
        Err(problems.join("; "))
    }
}

/// Static or static-pie from `e_type` and the dynamic section, or why neither.
fn linkage(e_type: u16, dynamic: Option<&Dynamic>) -> Result<Linkage, String> {
    match (e_type, dynamic) {
        (ET_EXEC, _) => Ok(Linkage::Static),
        (ET_DYN, Some(d)) if d.pie => Ok(Linkage::StaticPie),
        (ET_DYN, None) => Err("ET_DYN without PT_DYNAMIC: cannot relocate itself".into()),
        (ET_DYN, Some(_)) => {
            Err("ET_DYN without DF_1_PIE: a shared library, not an executable".into())
        }
        (t, _) => Err(format!("e_type {t}: not an executable")),
    }
}

struct Elf<'a>(&'a [u8]);

#[derive(Debug)]
struct Phdr {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

/// What the `PT_DYNAMIC` entries say, up to `DT_NULL`.
#[derive(Debug, Default)]
struct Dynamic {
    /// `DT_NEEDED`: offsets of library names in the string table.
    needed: Vec<u64>,
    /// `DT_STRTAB`: the string table's address.
    strtab: Option<u64>,
    /// `DT_FLAGS_1` has `DF_1_PIE`.
    pie: bool,
}

impl Dynamic {
    fn record(&mut self, tag: u64, val: u64) {
        match tag {
            DT_NEEDED => self.needed.push(val),
            DT_STRTAB => self.strtab = Some(val),
            DT_FLAGS_1 => self.pie = val & DF_1_PIE != 0,
            _ => {}
        }
    }
}

impl Elf<'_> {
    fn bytes<const N: usize>(&self, at: u64) -> Result<[u8; N], String> {
        let start = usize::try_from(at).map_err(|e| e.to_string())?;
        (self.0.get(start..start.saturating_add(N)))
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

    /// Checks the identification (ELF, 64-bit, little-endian) and the machine; returns `e_type`.
    fn header(&self) -> Result<u16, String> {
        if self.0.get(..4) != Some(b"\x7fELF".as_slice()) {
            return Err("not an ELF file".into());
        }
        if self.0.get(4) != Some(&2) || self.0.get(5) != Some(&1) {
            return Err("not a little-endian ELF64 file".into());
        }
        let e_type = self.u16(16)?;
        let machine = self.u16(18)?;
        if machine != EM_X86_64 {
            return Err(format!("e_machine {machine}: not x86-64"));
        }
        Ok(e_type)
    }

    fn program_headers(&self) -> Result<Vec<Phdr>, String> {
        let phoff = self.u64(0x20)?;
        let phentsize = u64::from(self.u16(0x36)?);
        let phnum = self.u16(0x38)?;
        if phentsize != 56 {
            return Err(format!(
                "e_phentsize {phentsize}: not an ELF64 program header"
            ));
        }
        (0..u64::from(phnum))
            .map(|i| self.program_header(phoff + i * phentsize))
            .collect()
    }

    fn program_header(&self, at: u64) -> Result<Phdr, String> {
        Ok(Phdr {
            kind: self.u32(at)?,
            offset: self.u64(at + 8)?,
            vaddr: self.u64(at + 16)?,
            filesz: self.u64(at + 32)?,
        })
    }

    /// A `PT_INTERP` names the dynamic loader the kernel would start first.
    fn interp_problem(&self, phdrs: &[Phdr]) -> Option<String> {
        let p = phdrs.iter().find(|p| p.kind == PT_INTERP)?;
        let path = self
            .0
            .get(p.offset as usize..(p.offset + p.filesz) as usize)
            .map(|s| String::from_utf8_lossy(s).trim_end_matches('\0').to_owned())
            .unwrap_or_default();
        Some(format!("PT_INTERP {path:?}: needs a dynamic loader"))
    }

    /// The entries of the `PT_DYNAMIC` segment, if there is one.
    fn dynamic(&self, phdrs: &[Phdr]) -> Result<Option<Dynamic>, String> {
        let Some(d) = phdrs.iter().find(|p| p.kind == PT_DYNAMIC) else {
            return Ok(None);
        };
        let mut dynamic = Dynamic::default();
        for i in 0..d.filesz / 16 {
            let tag = self.u64(d.offset + i * 16)?;
            let val = self.u64(d.offset + i * 16 + 8)?;
            if tag == DT_NULL {
                break;
            }
            dynamic.record(tag, val);
        }
        Ok(Some(dynamic))
    }

    /// `DT_NEEDED` entries name shared libraries; their names make the message.
    fn needed_problem(&self, phdrs: &[Phdr], dynamic: &Dynamic) -> Option<String> {
        let strtab = dynamic.strtab.unwrap_or_default();
        let names: Vec<String> = dynamic
            .needed
            .iter()
            .map(|off| self.string_at(phdrs, strtab + off))
            .collect();
        (!names.is_empty()).then(|| format!("DT_NEEDED {names:?}: needs shared libraries"))
    }

    /// The NUL-terminated string at a virtual address (`DT_STRTAB` is one), mapped to the file
    /// through the `PT_LOAD` segment holding it.
    fn string_at(&self, phdrs: &[Phdr], addr: u64) -> String {
        phdrs
            .iter()
            .find(|p| p.kind == PT_LOAD && p.vaddr <= addr && addr < p.vaddr + p.filesz)
            .and_then(|p| self.0.get((addr - p.vaddr + p.offset) as usize..))
            .and_then(|s| s.split(|b| *b == 0).next())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .unwrap_or_else(|| format!("<name at {addr:#x}>"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's real files: every mutation below edits what is really there.
    const DOCKERFILE: &str = include_str!("../../Dockerfile");
    const SCRIPT: &str = include_str!("../../scripts/static-build.sh");

    /// The file a mutation edits.
    #[derive(Debug, Clone, Copy)]
    enum File {
        Dockerfile,
        Script,
    }

    /// (what the mistake is, the file it is made in, the edit, a fragment of the expected error).
    type Mutation = (&'static str, File, fn(&str) -> String, &'static str);

    const MUTATIONS: [Mutation; 15] = [
        (
            "a build base by tag only",
            File::Dockerfile,
            |d| {
                replace(
                    d,
                    "@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1",
                    "",
                )
            },
            "not pinned by digest",
        ),
        (
            "a base image with a shell",
            File::Dockerfile,
            |d| replace(d, "FROM scratch", "FROM debian:bookworm-slim"),
            "scratch or a distroless",
        ),
        (
            "root user",
            File::Dockerfile,
            |d| replace_line(d, "USER ", "USER 0:0"),
            "is root",
        ),
        (
            "named user",
            File::Dockerfile,
            |d| replace_line(d, "USER ", "USER nobody"),
            "not numeric",
        ),
        (
            "no user",
            File::Dockerfile,
            |d| replace_line(d, "USER ", ""),
            "no USER",
        ),
        (
            "shell-form entrypoint",
            File::Dockerfile,
            |d| replace_line(d, "ENTRYPOINT ", "ENTRYPOINT /valkey-sidecar"),
            "shell form",
        ),
        (
            "entrypoint not the binary",
            File::Dockerfile,
            |d| replace_line(d, "ENTRYPOINT ", "ENTRYPOINT [\"/bin/sh\"]"),
            "does not start the copied binary",
        ),
        (
            "the debug artifact copied",
            File::Dockerfile,
            |d| {
                let copy = line(d, "COPY --from=");
                replace(d, copy, &copy.replace("/release/", "/debug/"))
            },
            "expected exactly",
        ),
        (
            "a second COPY",
            File::Dockerfile,
            |d| {
                let copy = line(d, "COPY --from=");
                let extra = format!("{copy}\nCOPY --from=build /etc/passwd /etc/passwd");
                replace(d, copy, &extra)
            },
            "exactly one",
        ),
        (
            "RUN in the final stage",
            File::Dockerfile,
            |d| format!("{d}\nRUN true\n"),
            "RUN in the final stage",
        ),
        (
            "Dockerfile build differs",
            File::Dockerfile,
            |d| {
                replace(
                    d,
                    "--bin valkey-sidecar",
                    "--bin valkey-sidecar --features x",
                )
            },
            "but scripts/static-build.sh",
        ),
        (
            "script build without --locked",
            File::Script,
            |s| replace(s, "--locked", ""),
            "but scripts/static-build.sh",
        ),
        (
            "script build with a variable",
            File::Script,
            |s| replace(s, "cargo build", "CC=clang cargo build"),
            "but scripts/static-build.sh",
        ),
        (
            "a second script build",
            File::Script,
            |s| format!("{s}\ncargo build --release\n"),
            "2 cargo build commands",
        ),
        (
            "no musl-tools",
            File::Dockerfile,
            |d| {
                let from = "--no-install-recommends musl-tools";
                replace(d, from, "--no-install-recommends gcc")
            },
            "musl-tools",
        ),
    ];

    /// `text` with `from` replaced; `from` must be there, or the mutation tests nothing.
    fn replace(text: &str, from: &str, to: &str) -> String {
        assert!(
            text.contains(from),
            "{from:?} not found: the mutation test is stale"
        );
        text.replace(from, to)
    }

    /// The first line starting with `prefix`.
    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starts with {prefix:?}: the mutation test is stale"))
    }

    fn replace_line(text: &str, prefix: &str, to: &str) -> String {
        replace(text, line(text, prefix), to)
    }

    fn assert_refused(i: usize, (what, file, edit, expected): &Mutation) {
        let (dockerfile, script) = match file {
            File::Dockerfile => (edit(DOCKERFILE), SCRIPT.to_owned()),
            File::Script => (DOCKERFILE.to_owned(), edit(SCRIPT)),
        };
        match check_dockerfile(&dockerfile, &script) {
            Ok(_) => panic!("case {i} ({what}) passed:\n{dockerfile}\n{script}"),
            Err(e) => assert!(
                e.contains(expected),
                "case {i} ({what}): {e:?} does not say {expected:?}"
            ),
        }
    }

    /// The checks refuse what they should: each mutation of the real files is caught.
    #[test]
    fn dockerfile_checks_catch_mistakes() {
        check_dockerfile(DOCKERFILE, SCRIPT).unwrap();
        for (i, mutation) in MUTATIONS.iter().enumerate() {
            assert_refused(i, mutation);
        }
    }

    /// The shell parsing the Dockerfile-script comparison rests on.
    #[test]
    fn shell_words_and_cargo_builds() {
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
}
