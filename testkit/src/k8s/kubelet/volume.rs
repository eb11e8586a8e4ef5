//! Pod volumes as directories of the pod's temp dir, and the path rewriting that lets the
//! processes (not chrooted) find them.
//!
//! - **Which.** Every volume some container (init or main) mounts, in
//!   `<pod dir>/volumes/<volume name>`; unmounted volumes are ignored, as by the kubelet.
//! - **Kinds.** `emptyDir` is an empty directory. `secret`, `configMap`, `downwardAPI` and
//!   `projected` (its `secret`, `configMap`, `downwardAPI` and `serviceAccountToken` sources) hold
//!   files: every key, or only `items` (key → path, mode), modes from `mode`/`defaultMode`
//!   (default 0644). Secrets and ConfigMaps are read through the API when the pod starts; a missing
//!   object or key fails the pod's set-up (retried, reported as `CreateContainerConfigError`)
//!   unless `optional`. `downwardAPI` items take the `fieldRef`s of environment variables plus
//!   `metadata.labels` and `metadata.annotations` (`key="value"` lines, sorted); not
//!   `resourceFieldRef`. A `serviceAccountToken` source is a TokenRequest bound to the pod with
//!   its `audience` and `expirationSeconds` (default 1 h). A `persistentVolumeClaim` is a link
//!   to the directory of the `local` or `hostPath` PersistentVolume bound to the claim (see
//!   `k8s::storage`), so its data outlives the pod. Any other volume type (`hostPath`, …) is an
//!   empty directory that lives as long as the pod.
//! - **Updates.** Like the kubelet (about once a minute), the files are refreshed every
//!   [`super::KubeletOptions::volume_refresh`]: Secrets and ConfigMaps read again, downward-API
//!   files recomputed (labels change), tokens renewed at 80% of their lifetime. A volume is
//!   written as the kubelet's atomic writer does: the files in a fresh `..<n>` directory, switched
//!   in by renaming the `..data` symlink, each top-level entry a symlink into `..data`, so a reader
//!   sees all old or all new files, never a mix. A refresh that fails keeps the old files.
//!   Unlike the kubelet, a `subPath` mount sees updates too.
//! - **Paths.** A container's environment value (its own `env`, after `$(VAR)` expansion),
//!   `command`/`args` token (before expansion, so `$(VAR)` picks up the rewritten variable) or
//!   `exec` probe/hook argument that is a mount's `mountPath` or starts with `mountPath/` has that
//!   prefix replaced by the volume's directory joined with the mount's `subPath` (or `subPathExpr`
//!   expanded from the container's environment); the longest matching `mountPath` wins. Only whole
//!   values are matched: `--dir=/data` is left alone, `/data` is not. `readOnly` is not enforced.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, PersistentVolume,
    PersistentVolumeClaim, Pod, Probe, Secret, ServiceAccount, ServiceAccountTokenProjection,
    Volume, VolumeProjection,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::spec::{PodFacts, expand, field_ref};
use crate::Result;
use crate::net::lock;

/// The API's default file mode for volume files (0644).
const DEFAULT_MODE: u32 = 0o644;

/// A projected token's lifetime when the pod does not say.
const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// One file of a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
struct File {
    data: Vec<u8>,
    mode: u32,
}

/// A volume's files by relative path.
type Files = BTreeMap<String, File>;

/// A token written into a projected volume, reused until it is due for renewal.
struct Token {
    data: Vec<u8>,
    renew_at: Instant,
}

#[derive(Default)]
struct State {
    /// What each file-backed volume holds now, so an unchanged refresh writes nothing.
    written: HashMap<String, Files>,
    /// By `volume/path`.
    tokens: HashMap<String, Token>,
    /// Names the next `..<n>` directory.
    generation: u64,
    next_refresh: Option<Instant>,
}

/// The pod's volumes.
pub(crate) struct Volumes {
    root: PathBuf,
    state: Mutex<State>,
}

/// What reading a volume's sources needs.
pub(crate) struct Sources<'a> {
    pub client: &'a Client,
    pub facts: &'a PodFacts<'a>,
}

impl Volumes {
    pub fn new(pod_dir: &Path) -> Self {
        Self {
            root: pod_dir.join("volumes"),
            state: Mutex::new(State::default()),
        }
    }

    /// Where the volume `name` lives.
    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Whether the periodic refresh is due (the first is `period` after the first call); if so,
    /// the next one is scheduled `period` from now.
    pub fn refresh_due(&self, period: Duration) -> bool {
        let now = Instant::now();
        let mut state = lock(&self.state);
        let next = *state.next_refresh.get_or_insert(now + period);
        if now < next {
            return false;
        }
        state.next_refresh = Some(now + period);
        true
    }

    /// Creates or refreshes every mounted volume. All are tried; the first error is returned
    /// (a volume that failed keeps what it had).
    pub async fn materialise(&self, sources: &Sources<'_>) -> Result<()> {
        let spec = sources
            .facts
            .pod
            .spec
            .as_ref()
            .context("pod without spec")?;
        let mounted = mounted_names(sources.facts.pod);
        let mut first_error = None;
        for volume in spec.volumes.iter().flatten() {
            if !mounted.contains(volume.name.as_str()) {
                continue;
            }
            let done = self
                .volume(sources, volume)
                .await
                .with_context(|| format!("volume {}", volume.name));
            if let Err(e) = done {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn volume(&self, sources: &Sources<'_>, volume: &Volume) -> Result<()> {
        let dir = self.dir(&volume.name);
        if let Some(claim) = &volume.persistent_volume_claim {
            return claimed(sources, &claim.claim_name, &dir).await;
        }
        let Some(files) = self.contents(sources, volume).await? else {
            return fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()));
        };
        let generation = {
            let mut state = lock(&self.state);
            if state.written.get(&volume.name) == Some(&files) {
                return Ok(());
            }
            state.generation += 1;
            state.generation
        };
        publish(&dir, &files, generation)?;
        lock(&self.state).written.insert(volume.name.clone(), files);
        Ok(())
    }

    /// The files of a file-backed volume; `None` for a plain directory.
    async fn contents(&self, sources: &Sources<'_>, volume: &Volume) -> Result<Option<Files>> {
        if let Some(s) = &volume.secret {
            let name = s.secret_name.as_deref().unwrap_or_default();
            let mode = mode_of(s.default_mode);
            let data = secret_data(sources, name).await?;
            return project(
                data,
                s.items.as_deref(),
                mode,
                s.optional,
                &format!("secret {name}"),
            )
            .map(Some);
        }
        if let Some(c) = &volume.config_map {
            let mode = mode_of(c.default_mode);
            let data = config_map_data(sources, &c.name).await?;
            let what = format!("configmap {}", c.name);
            return project(data, c.items.as_deref(), mode, c.optional, &what).map(Some);
        }
        if let Some(d) = &volume.downward_api {
            let mode = mode_of(d.default_mode);
            return downward(sources.facts, d.items.as_deref().unwrap_or_default(), mode).map(Some);
        }
        if let Some(p) = &volume.projected {
            let mode = mode_of(p.default_mode);
            let mut files = Files::new();
            for source in p.sources.iter().flatten() {
                files.extend(self.projection(sources, &volume.name, source, mode).await?);
            }
            return Ok(Some(files));
        }
        Ok(None)
    }

    async fn projection(
        &self,
        sources: &Sources<'_>,
        volume: &str,
        source: &VolumeProjection,
        mode: u32,
    ) -> Result<Files> {
        if let Some(s) = &source.secret {
            let data = secret_data(sources, &s.name).await?;
            let what = format!("secret {}", s.name);
            return project(data, s.items.as_deref(), mode, s.optional, &what);
        }
        if let Some(c) = &source.config_map {
            let data = config_map_data(sources, &c.name).await?;
            let what = format!("configmap {}", c.name);
            return project(data, c.items.as_deref(), mode, c.optional, &what);
        }
        if let Some(d) = &source.downward_api {
            return downward(sources.facts, d.items.as_deref().unwrap_or_default(), mode);
        }
        if let Some(t) = &source.service_account_token {
            let data = self.token(sources, volume, t).await?;
            return Ok(Files::from([(t.path.clone(), File { data, mode })]));
        }
        bail!("only secret, configMap, downwardAPI and serviceAccountToken sources are supported")
    }

    /// The token for one `serviceAccountToken` source: the one written before, or a new one
    /// once 80% of its lifetime has passed (the kubelet's rule).
    async fn token(
        &self,
        sources: &Sources<'_>,
        volume: &str,
        projection: &ServiceAccountTokenProjection,
    ) -> Result<Vec<u8>> {
        let key = format!("{volume}/{}", projection.path);
        if let Some(t) = lock(&self.state).tokens.get(&key)
            && Instant::now() < t.renew_at
        {
            return Ok(t.data.clone());
        }
        let seconds = projection
            .expiration_seconds
            .unwrap_or(DEFAULT_TOKEN_SECONDS);
        let data = request_token(sources, projection.audience.clone(), seconds).await?;
        let lifetime = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
        let renew_at = Instant::now() + lifetime.mul_f64(0.8);
        let token = Token {
            data: data.clone(),
            renew_at,
        };
        lock(&self.state).tokens.insert(key, token);
        Ok(data)
    }
}

/// Names of the volumes some container mounts.
/// Mounts the volume bound to `claim`: `dir` becomes a link to its `local` (or `hostPath`)
/// directory, which outlives the pod. A claim not bound yet fails the set-up (retried).
async fn claimed(sources: &Sources<'_>, claim: &str, dir: &Path) -> Result<()> {
    if fs::symlink_metadata(dir).is_ok() {
        return Ok(());
    }
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(sources.client.clone(), namespace(sources.facts));
    let bound = claims.get(claim).await?.spec.and_then(|s| s.volume_name);
    let Some(volume) = bound.filter(|v| !v.is_empty()) else {
        bail!("claim {claim} is not bound yet");
    };
    let pv = Api::<PersistentVolume>::all(sources.client.clone())
        .get(&volume)
        .await?;
    let spec = pv.spec.unwrap_or_default();
    let path = spec
        .local
        .map(|l| l.path)
        .or(spec.host_path.map(|h| h.path))
        .with_context(|| {
            format!("volume {volume}: only local and hostPath volumes are supported")
        })?;
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)?;
    }
    symlink(&path, dir).with_context(|| format!("linking {} to {path}", dir.display()))
}

fn mounted_names(pod: &Pod) -> BTreeSet<&str> {
    let spec = pod.spec.iter();
    let containers = spec.flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers));
    containers
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .map(|m| m.name.as_str())
        .collect()
}

fn mode_of(mode: Option<i32>) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok())
        .map_or(DEFAULT_MODE, |m| m & 0o777)
}

/// `None` if the Secret does not exist.
async fn secret_data(
    sources: &Sources<'_>,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
    let api: Api<Secret> = Api::namespaced(sources.client.clone(), namespace(sources.facts));
    let secret = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading secret {name}"))?;
    Ok(secret.map(|s| {
        let data = s.data.unwrap_or_default();
        data.into_iter().map(|(k, v)| (k, v.0)).collect()
    }))
}

/// `None` if the ConfigMap does not exist.
async fn config_map_data(
    sources: &Sources<'_>,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
    let api: Api<ConfigMap> = Api::namespaced(sources.client.clone(), namespace(sources.facts));
    let map = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading configmap {name}"))?;
    Ok(map.map(|c| {
        let text = c.data.unwrap_or_default().into_iter();
        let text = text.map(|(k, v)| (k, v.into_bytes()));
        let binary = c.binary_data.unwrap_or_default().into_iter();
        text.chain(binary.map(|(k, v)| (k, v.0))).collect()
    }))
}

fn namespace<'a>(facts: &'a PodFacts<'_>) -> &'a str {
    facts.pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Keys to files: all of them, or the `items`. Missing object or key: an error unless
/// `optional` (then it is left out).
fn project(
    data: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    mode: u32,
    optional: Option<bool>,
    what: &str,
) -> Result<Files> {
    let optional = optional == Some(true);
    let Some(mut data) = data else {
        if optional {
            return Ok(Files::new());
        }
        bail!("{what} not found");
    };
    let Some(items) = items else {
        return Ok(data
            .into_iter()
            .map(|(k, data)| (k, File { data, mode }))
            .collect());
    };
    let mut files = Files::new();
    for item in items {
        let Some(value) = data.remove(&item.key) else {
            if optional {
                continue;
            }
            bail!("{what} has no key {}", item.key);
        };
        let mode = item.mode.map_or(mode, |m| mode_of(Some(m)));
        files.insert(item.path.clone(), File { data: value, mode });
    }
    Ok(files)
}

/// The files of `downwardAPI` items.
fn downward(facts: &PodFacts<'_>, items: &[DownwardAPIVolumeFile], mode: u32) -> Result<Files> {
    let mut files = Files::new();
    for item in items {
        let Some(field) = &item.field_ref else {
            bail!("downwardAPI {}: only fieldRef is supported", item.path);
        };
        let meta = &facts.pod.metadata;
        let text = match field.field_path.as_str() {
            "metadata.labels" => format_map(meta.labels.as_ref()),
            "metadata.annotations" => format_map(meta.annotations.as_ref()),
            path => field_ref(facts, path)?,
        };
        let mode = item.mode.map_or(mode, |m| mode_of(Some(m)));
        let data = text.into_bytes();
        files.insert(item.path.clone(), File { data, mode });
    }
    Ok(files)
}

/// `key="value"` lines, sorted by key, as the kubelet writes labels and annotations.
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    let lines = map.into_iter().flatten().map(|(k, v)| {
        let quoted = serde_json::to_string(v).unwrap_or_default();
        format!("{k}={quoted}")
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// A TokenRequest for the pod's ServiceAccount bound to the pod.
async fn request_token(
    sources: &Sources<'_>,
    audience: Option<String>,
    seconds: i64,
) -> Result<Vec<u8>> {
    let pod = sources.facts.pod;
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.map(|a| vec![a]),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(seconds),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let ns = namespace(sources.facts);
    let api: Api<ServiceAccount> = Api::namespaced(sources.client.clone(), ns);
    let issued = api
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for serviceaccount {ns}/{account}"))?;
    let token = issued.status.and_then(|s| s.token);
    Ok(token.context("TokenRequest without a token")?.into_bytes())
}

/// Writes a volume atomically (see the module docs) as generation `generation`.
fn publish(dir: &Path, files: &Files, generation: u64) -> Result<()> {
    let name = format!("..{generation}");
    let fresh = dir.join(&name);
    fs::create_dir_all(&fresh).with_context(|| format!("creating {}", fresh.display()))?;
    for (path, file) in files {
        let target = fresh.join(relative(path)?);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&target, &file.data).with_context(|| format!("writing {}", target.display()))?;
        fs::set_permissions(&target, fs::Permissions::from_mode(file.mode))?;
    }
    let data = dir.join("..data");
    let old = fs::read_link(&data).ok();
    let staged = dir.join("..data_tmp");
    // A leftover from an interrupted switch would make `symlink` fail.
    let _ = fs::remove_file(&staged);
    symlink(&name, &staged)?;
    fs::rename(&staged, &data).with_context(|| format!("switching {}", data.display()))?;
    let tops: BTreeSet<&str> = files.keys().filter_map(|p| p.split('/').next()).collect();
    for top in &tops {
        let link = dir.join(top);
        if fs::symlink_metadata(&link).is_err() {
            symlink(Path::new("..data").join(top), &link)?;
        }
    }
    remove_stale_links(dir, &tops)?;
    if let Some(old) = old.filter(|o| o != Path::new(&name)) {
        fs::remove_dir_all(dir.join(old))?;
    }
    Ok(())
}

/// Removes the top-level links of keys that are gone.
fn remove_stale_links(dir: &Path, keep: &BTreeSet<&str>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let link = entry.file_type()?.is_symlink();
        if link && !name.starts_with("..") && !keep.contains(name.as_ref()) {
            fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// A relative path that stays inside its volume.
fn relative(path: &str) -> Result<&Path> {
    let p = Path::new(path);
    let escapes = p
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if path.is_empty() || escapes {
        bail!("path {path:?} must be relative and stay inside the volume");
    }
    Ok(p)
}

/// A container's mount paths and where they are on this host (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct Mounts(Vec<(String, PathBuf)>);

impl Mounts {
    /// `env`: the container's own variables, for `subPathExpr`.
    pub fn new(container: &Container, volumes: &Volumes, env: &[(String, String)]) -> Result<Self> {
        let mut mounts = Vec::new();
        for m in container.volume_mounts.iter().flatten() {
            let mut target = volumes.dir(&m.name);
            let expr = m.sub_path_expr.as_deref().map(|e| expand(e, env));
            let sub = m.sub_path.clone().filter(|s| !s.is_empty()).or(expr);
            if let Some(sub) = sub.filter(|s| !s.is_empty()) {
                target = target.join(relative(&sub)?);
                // The kubelet creates a missing subPath as a directory.
                if fs::symlink_metadata(&target).is_err() {
                    fs::create_dir_all(&target)
                        .with_context(|| format!("creating subPath {}", target.display()))?;
                }
            }
            let path = m.mount_path.trim_end_matches('/');
            // A mount on `/` would capture every absolute path.
            if !path.is_empty() {
                mounts.push((path.to_owned(), target));
            }
        }
        mounts.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        Ok(Self(mounts))
    }

    /// `value` with a mount path prefix replaced by its directory.
    pub fn rewrite(&self, value: &str) -> String {
        for (path, target) in &self.0 {
            if let Some(rest) = value.strip_prefix(path.as_str())
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return format!("{}{rest}", target.display());
            }
        }
        value.to_owned()
    }

    /// Rewrites `command`, `args` and the `exec` commands of probes and hooks.
    pub fn rewrite_spec(&self, c: &mut Container) {
        let rewrite_all = |v: &mut Option<Vec<String>>| {
            for token in v.iter_mut().flatten() {
                *token = self.rewrite(token);
            }
        };
        rewrite_all(&mut c.command);
        rewrite_all(&mut c.args);
        let probes = [
            &mut c.startup_probe,
            &mut c.liveness_probe,
            &mut c.readiness_probe,
        ];
        for probe in probes.into_iter().flatten() {
            rewrite_probe(probe, &rewrite_all);
        }
        for hook in c
            .lifecycle
            .iter_mut()
            .flat_map(|l| [&mut l.pre_stop, &mut l.post_start])
        {
            if let Some(exec) = hook.as_mut().and_then(|h| h.exec.as_mut()) {
                rewrite_all(&mut exec.command);
            }
        }
    }
}

fn rewrite_probe(probe: &mut Probe, rewrite_all: &impl Fn(&mut Option<Vec<String>>)) {
    if let Some(exec) = probe.exec.as_mut() {
        rewrite_all(&mut exec.command);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mounts(pairs: &[(&str, &str)]) -> Mounts {
        let mut m: Vec<(String, PathBuf)> = pairs
            .iter()
            .map(|(p, t)| ((*p).to_owned(), PathBuf::from(t)))
            .collect();
        m.sort_by_key(|(path, _)| std::cmp::Reverse(path.len()));
        Mounts(m)
    }

    #[test]
    fn mount_paths_are_rewritten_on_whole_components() {
        let m = mounts(&[
            ("/etc/auth", "/v/auth"),
            ("/etc/auth/tls", "/v/tls"),
            ("/data", "/v/data"),
        ]);
        assert_eq!(m.rewrite("/etc/auth/password"), "/v/auth/password");
        assert_eq!(m.rewrite("/etc/auth"), "/v/auth");
        assert_eq!(
            m.rewrite("/etc/auth/tls/ca.crt"),
            "/v/tls/ca.crt",
            "longest mount wins"
        );
        assert_eq!(m.rewrite("/etc/authx"), "/etc/authx");
        assert_eq!(m.rewrite("--dir=/data"), "--dir=/data");
        assert_eq!(m.rewrite("/data/"), "/v/data/");
        assert_eq!(m.rewrite("data"), "data");
    }

    #[test]
    fn sub_paths_and_expressions_join_the_volume_dir() {
        let root = tempfile::tempdir().unwrap();
        let volumes = Volumes::new(root.path());
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "volumeMounts": [
                { "name": "conf", "mountPath": "/etc/valkey/valkey.conf", "subPath": "valkey.conf" },
                { "name": "data", "mountPath": "/data/", "subPathExpr": "$(POD_NAME)" },
            ],
        }))
        .unwrap();
        let env = vec![("POD_NAME".to_owned(), "valkey-0".to_owned())];
        let m = Mounts::new(&container, &volumes, &env).unwrap();
        let conf = volumes.dir("conf").join("valkey.conf");
        assert_eq!(
            m.rewrite("/etc/valkey/valkey.conf"),
            conf.display().to_string()
        );
        let data = volumes.dir("data").join("valkey-0");
        assert_eq!(
            m.rewrite("/data/dump.rdb"),
            format!("{}/dump.rdb", data.display())
        );
        assert!(data.is_dir(), "a missing subPath is created");
    }

    #[test]
    fn escaping_paths_are_refused() {
        assert!(relative("a/b").is_ok());
        assert!(relative("../x").is_err());
        assert!(relative("/etc").is_err());
        assert!(relative("").is_err());
    }

    #[test]
    fn items_select_keys_and_optional_tolerates_absence() {
        let data = BTreeMap::from([
            ("a".to_owned(), b"1".to_vec()),
            ("b".to_owned(), b"2".to_vec()),
        ]);
        let all = project(Some(data.clone()), None, 0o644, None, "s").unwrap();
        assert_eq!(all.len(), 2);
        let item: KeyToPath = serde_json::from_value(
            serde_json::json!({ "key": "b", "path": "sub/b.txt", "mode": 0o400 }),
        )
        .unwrap();
        let one = project(
            Some(data.clone()),
            Some(std::slice::from_ref(&item)),
            0o644,
            None,
            "s",
        )
        .unwrap();
        assert_eq!(
            one["sub/b.txt"],
            File {
                data: b"2".to_vec(),
                mode: 0o400
            }
        );
        assert!(project(None, None, 0o644, None, "s").is_err());
        assert!(
            project(None, None, 0o644, Some(true), "s")
                .unwrap()
                .is_empty()
        );
        let missing: KeyToPath =
            serde_json::from_value(serde_json::json!({ "key": "zz", "path": "z" })).unwrap();
        assert!(
            project(
                Some(data.clone()),
                Some(std::slice::from_ref(&missing)),
                0o644,
                None,
                "s"
            )
            .is_err()
        );
        assert!(
            project(Some(data), Some(&[missing]), 0o644, Some(true), "s")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn publishing_swaps_all_files_at_once() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("v");
        let file = |s: &str| File {
            data: s.as_bytes().to_vec(),
            mode: 0o644,
        };
        let first = Files::from([("a".into(), file("1")), ("d/b".into(), file("2"))]);
        publish(&dir, &first, 1).unwrap();
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(fs::read_to_string(dir.join("d/b")).unwrap(), "2");
        let second = Files::from([("a".into(), file("3"))]);
        publish(&dir, &second, 2).unwrap();
        assert_eq!(fs::read_to_string(dir.join("a")).unwrap(), "3");
        assert!(
            fs::symlink_metadata(dir.join("d")).is_err(),
            "a removed key is gone"
        );
        assert!(!dir.join("..1").exists(), "the old generation is removed");
    }
}
