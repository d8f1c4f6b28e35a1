//! A reader for the subset of Dockerfile syntax the image uses (one
//! instruction per logical line, `\` continuations, exec-form JSON arrays)
//! and the checks of the image against the repository.

use std::collections::BTreeMap;
use std::path::Path;

/// One instruction: its keyword (upper case) and the rest of the line.
#[derive(Debug, Clone)]
pub struct Instr {
    pub keyword: String,
    pub args: String,
}

#[derive(Debug, Clone)]
pub struct Stage {
    /// The base image; for a stage built `FROM` an earlier stage, that
    /// stage's base image.
    pub image: String,
    pub name: Option<String>,
    /// The earlier stage this one is built `FROM`, if any.
    pub parent: Option<String>,
    /// Every instruction in force: the parent's first (a stage `FROM` an
    /// earlier one inherits its ENV, USER, CMD, ...), then its own.
    pub instrs: Vec<Instr>,
    /// How many of `instrs` come from the parent.
    pub inherited: usize,
}

/// `COPY [--from=S] [--chmod=M] SRC... DEST`.
#[derive(Debug, Clone)]
pub struct Copy {
    pub from: Option<String>,
    pub chmod: Option<String>,
    pub sources: Vec<String>,
    pub dest: String,
}

#[derive(Debug, Clone)]
pub struct Dockerfile {
    pub stages: Vec<Stage>,
}

impl Dockerfile {
    pub fn parse(text: &str) -> Result<Dockerfile, String> {
        let mut logical = Vec::new();
        let mut cur = String::new();
        for line in text.lines() {
            let t = line.trim();
            if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
                continue;
            }
            // A comment inside a continued instruction is dropped, as Docker does.
            if t.starts_with('#') {
                continue;
            }
            if let Some(head) = t.strip_suffix('\\') {
                cur.push_str(head);
                cur.push(' ');
            } else {
                cur.push_str(t);
                logical.push(std::mem::take(&mut cur));
            }
        }
        if !cur.is_empty() {
            return Err("the last instruction ends in a line continuation".into());
        }
        let mut stages: Vec<Stage> = Vec::new();
        for l in logical {
            let (kw, args) = l.split_once(char::is_whitespace).unwrap_or((&l, ""));
            let instr = Instr {
                keyword: kw.to_ascii_uppercase(),
                args: args.trim().to_owned(),
            };
            if instr.keyword == "FROM" {
                let words: Vec<&str> = instr.args.split_whitespace().collect();
                let name = match words.as_slice() {
                    [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some((*name).to_owned()),
                    [_] => None,
                    _ => return Err(format!("FROM {}: expected IMAGE [AS NAME]", instr.args)),
                };
                let parent = stages
                    .iter()
                    .find(|s| s.name.as_deref() == Some(words[0]))
                    .cloned();
                stages.push(match parent {
                    Some(p) => Stage {
                        image: p.image,
                        name,
                        parent: p.name,
                        inherited: p.instrs.len(),
                        instrs: p.instrs,
                    },
                    None => Stage {
                        image: words[0].to_owned(),
                        name,
                        parent: None,
                        instrs: Vec::new(),
                        inherited: 0,
                    },
                });
            } else {
                let stage = stages
                    .last_mut()
                    .ok_or_else(|| format!("{} before any FROM", instr.keyword))?;
                stage.instrs.push(instr);
            }
        }
        if stages.is_empty() {
            return Err("no FROM".into());
        }
        Ok(Dockerfile { stages })
    }

    /// The stage the image is made of.
    pub fn final_stage(&self) -> &Stage {
        self.stages
            .last()
            .expect("parse refuses a file with no stage")
    }

    pub fn stage(&self, name: &str) -> Option<&Stage> {
        self.stages.iter().find(|s| s.name.as_deref() == Some(name))
    }
}

impl Stage {
    /// The stage's own instructions, without its parent's.
    pub fn own(&self) -> Stage {
        Stage {
            instrs: self.instrs[self.inherited..].to_vec(),
            inherited: 0,
            ..self.clone()
        }
    }

    pub fn all(&self, keyword: &'static str) -> impl Iterator<Item = &str> + '_ {
        self.instrs
            .iter()
            .filter(move |i| i.keyword == keyword)
            .map(|i| i.args.as_str())
    }

    /// The last instruction of a kind (the one in force).
    pub fn last(&self, keyword: &'static str) -> Option<&str> {
        self.all(keyword).last()
    }

    /// `ENV K=V ...` merged in order.
    pub fn env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for args in self.all("ENV") {
            for word in args.split_whitespace() {
                if let Some((k, v)) = word.split_once('=') {
                    env.insert(k.to_owned(), v.trim_matches('"').to_owned());
                }
            }
        }
        env
    }

    pub fn copies(&self) -> Vec<Copy> {
        self.all("COPY")
            .map(|args| {
                let mut from = None;
                let mut chmod = None;
                let mut paths = Vec::new();
                for w in args.split_whitespace() {
                    if let Some(f) = w.strip_prefix("--from=") {
                        from = Some(f.to_owned());
                    } else if let Some(m) = w.strip_prefix("--chmod=") {
                        chmod = Some(m.to_owned());
                    } else if !w.starts_with("--") {
                        paths.push(w.to_owned());
                    }
                }
                let dest = paths.pop().unwrap_or_default();
                Copy {
                    from,
                    chmod,
                    sources: paths,
                    dest,
                }
            })
            .collect()
    }

    /// Every package named after `apt-get install` in the stage's RUNs.
    pub fn apt_packages(&self) -> Vec<String> {
        let mut out = Vec::new();
        for run in self.all("RUN") {
            for part in run.split("&&") {
                let words: Vec<&str> = part.split_whitespace().collect();
                if let Some(i) = words.windows(2).position(|w| w == ["apt-get", "install"]) {
                    out.extend(
                        words[i + 2..]
                            .iter()
                            .filter(|w| !w.starts_with('-'))
                            .map(|w| (*w).to_owned()),
                    );
                }
            }
        }
        out
    }

    /// An exec-form instruction (`["a", "b"]`) as its words.
    pub fn exec_form(&self, keyword: &'static str) -> Option<Result<Vec<String>, String>> {
        let args = self.last(keyword)?;
        Some(exec_words(args).map_err(|e| format!("{keyword} {args}: {e}")))
    }

    /// `HEALTHCHECK [--opts] CMD ["..."]`: the command's words.
    pub fn healthcheck(&self) -> Option<Result<Vec<String>, String>> {
        let args = self.last("HEALTHCHECK")?;
        let cmd = args
            .split_once("CMD")
            .map(|(_, c)| c.trim())
            .ok_or_else(|| format!("HEALTHCHECK {args}: no CMD"));
        Some(cmd.and_then(|c| exec_words(c).map_err(|e| format!("HEALTHCHECK CMD {c}: {e}"))))
    }
}

/// `["a", "b"]`: the exec form every instruction here uses (a shell form
/// would make `docker stop`'s SIGTERM go to a shell, not the worker).
fn exec_words(args: &str) -> Result<Vec<String>, String> {
    serde_json::from_str::<Vec<String>>(args)
        .map_err(|e| format!("not the exec form (a JSON array): {e}"))
}

/// `.dockerignore` patterns in order; the last that matches a path decides
/// (`!` re-includes). Supports what an allow-list needs: `*`, plain paths
/// and directories.
pub struct DockerIgnore {
    patterns: Vec<(bool, String)>,
}

impl DockerIgnore {
    pub fn parse(text: &str) -> DockerIgnore {
        let patterns = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| match l.strip_prefix('!') {
                Some(p) => (false, p.trim_end_matches('/').to_owned()),
                None => (true, l.trim_end_matches('/').to_owned()),
            })
            .collect();
        DockerIgnore { patterns }
    }

    /// Whether `path` (relative to the context) reaches the build.
    pub fn included(&self, path: &str) -> bool {
        let path = path.trim_start_matches("./").trim_end_matches('/');
        let mut excluded = false;
        for (exclude, p) in &self.patterns {
            let matches = p == "*" || p == "**" || path == p || path.starts_with(&format!("{p}/"));
            if matches {
                excluded = *exclude;
            }
        }
        !excluded
    }
}

/// Packages of `scripts/install-deps.sh` (what `.ci/run` installs) that the
/// image does not need: the Redis server and client, procps and openssl
/// (test certificates) serve the integration tests, python3-venv
/// `scripts/check-deploy.sh`.
pub const TEST_ONLY_PACKAGES: &[&str] = &[
    "redis-server",
    "redis-tools",
    "procps",
    "openssl",
    "python3-venv",
];

/// The `pkgs=(...)` list of `scripts/install-deps.sh` (what `.ci/run` installs).
pub fn ci_packages(ci_run: &str) -> Vec<String> {
    ci_run
        .lines()
        .find_map(|l| l.trim().strip_prefix("pkgs=("))
        .map(|rest| {
            rest.trim_end_matches(')')
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Paths the crate compiles in with `include_str!` / `include_bytes!`,
/// relative to the repository.
pub fn compiled_in_files(repo: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![repo.join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ readable") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source readable");
            for m in ["include_str!(\"", "include_bytes!(\""] {
                for (i, _) in text.match_indices(m) {
                    let rest = &text[i + m.len()..];
                    let Some(end) = rest.find('"') else { continue };
                    let target =
                        super::resolve(path.parent().expect("file in a dir"), &rest[..end]);
                    if let Ok(rel) = target.strip_prefix(repo) {
                        out.push(rel.display().to_string());
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Whether a file copied into the build stage as `src` covers `path`.
pub fn copied(copies: &[Copy], path: &str) -> bool {
    copies
        .iter()
        .filter(|c| c.from.is_none())
        .flat_map(|c| c.sources.iter())
        .any(|s| {
            let s = s.trim_start_matches("./").trim_end_matches('/');
            path == s || path.starts_with(&format!("{s}/"))
        })
}

/// The checks of the image that need only the repository. `ci_run` is
/// `scripts/install-deps.sh`'s text (the packages `.ci/run` installs), `dockerignore` `.dockerignore`'s.
pub fn check(df: &Dockerfile, dockerignore: &str, ci_run: &str, repo: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let ignore = DockerIgnore::parse(dockerignore);
    let Some(build) = df.stage("build") else {
        return vec!["Dockerfile: no stage named `build`".into()];
    };
    let run = df.final_stage();
    if build.image != "rust:1-bookworm" {
        problems.push(format!(
            "Dockerfile: build stage FROM {} (want rust:1-bookworm)",
            build.image
        ));
    }
    if run.image != "debian:bookworm-slim" {
        problems.push(format!(
            "Dockerfile: run stage FROM {} (want debian:bookworm-slim)",
            run.image
        ));
    }
    // The build has every package CI builds with.
    let have = build.apt_packages();
    let want = ci_packages(ci_run);
    if want.is_empty() {
        problems.push("scripts/install-deps.sh: no pkgs=(...) list found".into());
    }
    for p in want
        .iter()
        .filter(|p| !TEST_ONLY_PACKAGES.contains(&p.as_str()))
    {
        if !have.contains(p) {
            problems.push(format!("Dockerfile: build stage does not install {p}, which scripts/install-deps.sh installs for the build"));
        }
    }
    if !build
        .all("RUN")
        .any(|r| r.contains("cargo build --release --locked"))
    {
        problems
            .push("Dockerfile: build stage does not run `cargo build --release --locked`".into());
    }
    // The production image ships no dev tools: its binary is built
    // without the default features (dev-tools: demo, stub, load generator,
    // mock broker). The tools get a stage of their own, `dev`.
    if !build
        .all("RUN")
        .any(|r| r.contains("cargo build") && r.contains("--no-default-features"))
    {
        problems.push("Dockerfile: the build stage does not build with --no-default-features: the production image would ship the dev tools".into());
    }
    problems.extend(check_dev_stage(df));
    // Every COPY source exists and reaches the build context.
    for stage in &df.stages {
        for c in stage.own().copies().iter().filter(|c| c.from.is_none()) {
            for s in &c.sources {
                if !repo.join(s).exists() {
                    problems.push(format!(
                        "Dockerfile: COPY {s}: no such file in the repository"
                    ));
                } else if !ignore.included(s) {
                    problems.push(format!("Dockerfile: COPY {s}: excluded by .dockerignore"));
                }
            }
        }
    }
    // What the crate needs to compile is copied into the build stage.
    let copies = build.copies();
    let mut needed = vec![
        "Cargo.toml".to_owned(),
        "Cargo.lock".to_owned(),
        "src".to_owned(),
    ];
    needed.extend(compiled_in_files(repo));
    needed.extend(declared_targets(repo));
    for f in needed {
        if !copied(&copies, &f) {
            problems.push(format!(
                "Dockerfile: the build needs {f}, which no COPY of the build stage brings in"
            ));
        }
    }
    // The binary, on PATH, as the entrypoint.
    let binary = run
        .copies()
        .into_iter()
        .find(|c| c.from.as_deref() == Some("build") && c.dest.ends_with("/throttle-worker"));
    match &binary {
        Some(c) if c.dest == "/usr/local/bin/throttle-worker" => {}
        Some(c) => problems.push(format!(
            "Dockerfile: the binary is copied to {}, not /usr/local/bin (on PATH)",
            c.dest
        )),
        None => problems.push(
            "Dockerfile: the run stage does not copy throttle-worker from the build stage".into(),
        ),
    }
    match run.exec_form("ENTRYPOINT") {
        Some(Ok(w)) if w == ["throttle-worker"] => {}
        Some(Ok(w)) => problems.push(format!(
            "Dockerfile: ENTRYPOINT {w:?} (want [\"throttle-worker\"])"
        )),
        Some(Err(e)) => problems.push(format!("Dockerfile: {e}")),
        None => problems.push("Dockerfile: no ENTRYPOINT".into()),
    }
    match run.exec_form("CMD") {
        Some(Ok(w)) if w == ["run"] => {}
        Some(Ok(w)) => problems.push(format!("Dockerfile: CMD {w:?} (want [\"run\"])")),
        Some(Err(e)) => problems.push(format!("Dockerfile: {e}")),
        None => problems.push("Dockerfile: no CMD".into()),
    }
    // A numeric, non-root user that exists.
    match user_id(run) {
        Ok(uid) => {
            let created = run
                .all("RUN")
                .any(|r| r.contains("useradd") && r.contains(&format!("--uid {uid}")));
            if !created {
                problems.push(format!(
                    "Dockerfile: USER {uid} is not created by a useradd --uid {uid}"
                ));
            }
        }
        Err(e) => problems.push(format!("Dockerfile: {e}")),
    }
    // The listener is reachable from outside the container and exposed.
    let env = run.env();
    match env.get("THROTTLE__HTTP__LISTEN") {
        Some(listen) => {
            if !listen.starts_with("0.0.0.0:") {
                problems.push(format!("Dockerfile: THROTTLE__HTTP__LISTEN={listen}: not reachable from outside the container (bind 0.0.0.0)"));
            }
            let port = super::port_of(listen).map(|p| p.to_string());
            let exposed: Vec<&str> = run.all("EXPOSE").flat_map(str::split_whitespace).collect();
            if !port.as_deref().is_some_and(|p| exposed.contains(&p)) {
                problems.push(format!("Dockerfile: EXPOSE {exposed:?} does not include the listen port of {listen}"));
            }
        }
        None => problems.push("Dockerfile: no ENV THROTTLE__HTTP__LISTEN (the default 127.0.0.1:9898 is unreachable in a container)".into()),
    }
    // The healthcheck is the repository's script, copied executable.
    match run.healthcheck() {
        Some(Ok(cmd)) => {
            let script = run.copies().into_iter().find(|c| c.dest == cmd[0]);
            match script {
                Some(c)
                    if c.chmod
                        .as_deref()
                        .is_some_and(|m| m.ends_with('5') || m.ends_with('7')) => {}
                Some(c) => problems.push(format!(
                    "Dockerfile: HEALTHCHECK {} is copied without --chmod=0755 ({:?})",
                    cmd[0], c.chmod
                )),
                None => problems.push(format!(
                    "Dockerfile: HEALTHCHECK runs {}, which no COPY puts there",
                    cmd[0]
                )),
            }
        }
        Some(Err(e)) => problems.push(format!("Dockerfile: {e}")),
        None => problems.push("Dockerfile: no HEALTHCHECK".into()),
    }
    problems
}

/// The `dev` stage: the production runtime (the final stage's parent) with
/// a binary built with the default features, i.e. with the tools.
fn check_dev_stage(df: &Dockerfile) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(dev) = df.stage("dev") else {
        return vec!["Dockerfile: no stage named `dev` (the image with the dev tools, for docker-compose's stub and load generator)".into()];
    };
    let run = df.final_stage();
    if run.name.as_deref() == Some("dev") {
        problems.push(
            "Dockerfile: `dev` is the last stage, so the default image would ship the dev tools"
                .into(),
        );
    }
    if dev.parent.is_none() || dev.parent != run.parent {
        problems.push(format!(
            "Dockerfile: the dev stage is FROM {:?}, the run stage FROM {:?}: want the same runtime stage",
            dev.parent, run.parent
        ));
    }
    let from = dev
        .own()
        .copies()
        .into_iter()
        .find(|c| c.dest == "/usr/local/bin/throttle-worker")
        .and_then(|c| c.from);
    let Some(from) = from else {
        return vec![
            "Dockerfile: the dev stage copies no /usr/local/bin/throttle-worker from a build stage"
                .into(),
        ];
    };
    let builds_tools = df.stage(&from).is_some_and(|b| {
        b.own().all("RUN").any(|r| {
            r.contains("cargo build --release --locked") && !r.contains("--no-default-features")
        })
    });
    if !builds_tools {
        problems.push(format!("Dockerfile: the dev stage's binary (from {from}) is not built with the default features (dev-tools)"));
    }
    problems
}

/// The numeric uid of the run stage's `USER uid[:gid]`.
pub fn user_id(stage: &Stage) -> Result<u32, String> {
    let user = stage
        .last("USER")
        .ok_or("no USER: the image would run as root")?;
    let uid = user.split(':').next().unwrap_or("");
    match uid.parse::<u32>() {
        Ok(0) => Err(format!("USER {user} is root")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "USER {user} is not numeric (Kubernetes' runAsNonRoot cannot verify a name)"
        )),
    }
}

/// The bench and example files Cargo.toml declares: cargo refuses the
/// manifest when one is missing, even for `cargo build`.
fn declared_targets(repo: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(repo.join("Cargo.toml")).expect("Cargo.toml");
    let mut out = Vec::new();
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_owned();
            continue;
        }
        let dir = match section.as_str() {
            "[[bench]]" => "benches",
            "[[example]]" => "examples",
            _ => continue,
        };
        if let Some(name) = line
            .strip_prefix("name")
            .map(|r| r.trim_start_matches([' ', '=']).trim_matches('"'))
        {
            out.push(format!("{dir}/{name}.rs"));
        }
    }
    out
}
