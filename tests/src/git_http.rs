//! A real Git smart-HTTP server for tests: git's own CGI program `git http-backend` behind a
//! small axum server on an ephemeral loopback port, optionally over HTTPS and behind basic auth.
//! The server side is the real Git implementation, so a passing test proves kas interoperates
//! with Git servers rather than with a fake written to agree with it.
//!
//! Also [`GitRepo`]: a bare repository written by the git CLI, with a work tree to commit to it.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::certificates::{Certificate, LOCALHOST_AND_IP};
use crate::tls_listener::TlsListener;

/// Largest request body passed to `git http-backend` (test fetches are far smaller).
const MAX_BODY: usize = 64 << 20;

/// Options of a [`GitHttpServer`].
#[derive(Debug, Clone, Default)]
pub struct GitHttpOptions {
    /// Serve HTTPS with a fresh self-signed certificate for `localhost` and `127.0.0.1`; its PEM
    /// is [`GitHttpServer::ca_file`].
    pub tls: bool,
    /// Require HTTP basic auth with this (username, password); otherwise 401 with
    /// `WWW-Authenticate: Basic realm="git"`, as Git servers do so clients retry with credentials.
    pub basic_auth: Option<(String, String)>,
    /// Answer every request with `301 Moved Permanently` to this base URL plus the request's
    /// path and query (a moved server).
    pub redirect_to: Option<String>,
}

#[derive(Default)]
struct Shared {
    root: PathBuf,
    basic_auth: Option<(String, String)>,
    redirect_to: Option<String>,
    requests: AtomicUsize,
    upload_pack_posts: AtomicUsize,
    with_credentials: AtomicUsize,
    rejected_credentials: AtomicUsize,
    protocol_v2: AtomicUsize,
}

/// Handle to a running Git HTTP server; the server stops when the last handle is dropped.
#[derive(Clone)]
pub struct GitHttpServer {
    shared: Arc<Shared>,
    url: String,
    /// Holds the certificate's PEM file, when serving TLS.
    tls_dir: Option<Arc<tempfile::TempDir>>,
    _stop_on_drop: Arc<DropGuard>,
}

impl GitHttpServer {
    /// Serves every repository under `root` over plain HTTP, without auth (URL path
    /// `/<path of the repository relative to root>`, e.g. `/group/project.git`).
    pub async fn start(root: &Path) -> Self {
        Self::start_with(root, GitHttpOptions::default()).await
    }

    /// Serves every repository under `root` (see [`GitHttpServer::start`]) with these options.
    pub async fn start_with(root: &Path, options: GitHttpOptions) -> Self {
        git_binary();
        let shared = Arc::new(Shared {
            root: root.to_owned(),
            basic_auth: options.basic_auth,
            redirect_to: options.redirect_to,
            ..Default::default()
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind git http server");
        let port = listener.local_addr().expect("addr").port();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let (url, tls_dir) = if options.tls {
            let dir = tempfile::tempdir().expect("tempdir");
            let certificate = Certificate::self_signed(LOCALHOST_AND_IP);
            std::fs::write(dir.path().join("ca.pem"), certificate.pem()).expect("write ca file");
            let tls = TlsListener::start(listener, certificate.acceptor(&[]), shutdown.clone(), || {});
            tokio::spawn(async move {
                let _ = axum::serve(tls, app).with_graceful_shutdown(stop.cancelled_owned()).await;
            });
            (format!("https://localhost:{port}"), Some(Arc::new(dir)))
        } else {
            tokio::spawn(async move {
                let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
            });
            (format!("http://127.0.0.1:{port}"), None)
        };
        Self { shared, url, tls_dir, _stop_on_drop: Arc::new(shutdown.drop_guard()) }
    }

    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT` with TLS.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// PEM file of the TLS certificate (it is its own CA), when serving TLS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        self.tls_dir.as_ref().map(|d| d.path().join("ca.pem"))
    }

    /// Requests received (any path, any answer).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// `git-upload-pack` POSTs that passed auth: ref listings (protocol v2) and pack negotiations.
    pub fn upload_pack_posts(&self) -> usize {
        self.shared.upload_pack_posts.load(Ordering::SeqCst)
    }

    /// Requests that carried an `Authorization` header (proves a client sends credentials).
    pub fn requests_with_credentials(&self) -> usize {
        self.shared.with_credentials.load(Ordering::SeqCst)
    }

    /// Requests whose `Authorization` header was not the expected basic credentials (with
    /// `basic_auth`): proves a client sent the wrong ones rather than none.
    pub fn rejected_credentials(&self) -> usize {
        self.shared.rejected_credentials.load(Ordering::SeqCst)
    }

    /// Requests that asked for Git protocol v2 (`Git-Protocol: version=2`).
    pub fn protocol_v2_requests(&self) -> usize {
        self.shared.protocol_v2.load(Ordering::SeqCst)
    }
}

/// Fails (never skips) when git is missing, with how to install it.
fn git_binary() -> &'static str {
    let found = std::process::Command::new("git").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "git is required for this test: install it with `apt-get install git`");
    "git"
}

/// Environment variables that make git ignore the user's and the system's configuration (so tests
/// are hermetic), and unset variables that override configuration: `GIT_SSL_CAINFO` (set on
/// some hosts) would win over `-c http.sslCAInfo=...`.
fn hermetic_git(cmd: &mut std::process::Command) {
    cmd.env("GIT_CONFIG_GLOBAL", "/dev/null").env("GIT_CONFIG_NOSYSTEM", "1"); // so no signing, hooks...
    for var in ["GIT_DIR", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "GIT_SSL_NO_VERIFY"] {
        cmd.env_remove(var);
    }
}

/// Git, async (for anything talking to a server on the same runtime), configured hermetically.
fn git_command() -> tokio::process::Command {
    let mut cmd = std::process::Command::new(git_binary());
    hermetic_git(&mut cmd);
    cmd.into()
}

fn header_str(headers: &HeaderMap, name: HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Checks basic auth: `Ok(user)` is the authenticated user, if any; `Err(())` means answer 401.
fn authenticate(shared: &Shared, headers: &HeaderMap) -> Result<Option<String>, ()> {
    let given = header_str(headers, header::AUTHORIZATION);
    if given.is_some() {
        shared.with_credentials.fetch_add(1, Ordering::SeqCst);
    }
    let Some((user, password)) = &shared.basic_auth else { return Ok(None) };
    let expected = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    match given.map(|g| g.strip_prefix("Basic ") == Some(&expected)) {
        Some(true) => Ok(Some(user.clone())),
        Some(false) => {
            shared.rejected_credentials.fetch_add(1, Ordering::SeqCst);
            Err(())
        }
        None => Err(()),
    }
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    if let Some(base) = &shared.redirect_to {
        let target = format!("{base}{}", request.uri().path_and_query().map_or("/", |p| p.as_str()));
        return (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, target)]).into_response();
    }
    let (parts, body) = request.into_parts();
    let Ok(user) = authenticate(&shared, &parts.headers) else {
        let challenge = [(header::WWW_AUTHENTICATE, "Basic realm=\"git\"")];
        return (StatusCode::UNAUTHORIZED, challenge, "authentication required\n").into_response();
    };
    let path = parts.uri.path().to_owned();
    if parts.method == axum::http::Method::POST && path.ends_with("/git-upload-pack") {
        shared.upload_pack_posts.fetch_add(1, Ordering::SeqCst);
    }
    let git_protocol = header_str(&parts.headers, HeaderName::from_static("git-protocol")).unwrap_or_default();
    if git_protocol.split(':').any(|p| p == "version=2") {
        shared.protocol_v2.fetch_add(1, Ordering::SeqCst);
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(e) => return (StatusCode::PAYLOAD_TOO_LARGE, e.to_string()).into_response(),
    };

    // The CGI environment of git-http-backend(1).
    let mut cgi = git_command();
    cgi.arg("http-backend")
        .env("GIT_PROJECT_ROOT", &shared.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", &path)
        .env("QUERY_STRING", parts.uri.query().unwrap_or_default())
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("GIT_PROTOCOL", git_protocol)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(content_type) = header_str(&parts.headers, header::CONTENT_TYPE) {
        cgi.env("CONTENT_TYPE", content_type);
    }
    if !body.is_empty() {
        cgi.env("CONTENT_LENGTH", body.len().to_string());
    }
    // Git clients gzip request bodies; http-backend inflates them itself.
    if let Some(encoding) = header_str(&parts.headers, header::CONTENT_ENCODING) {
        cgi.env("HTTP_CONTENT_ENCODING", encoding);
    }
    if let Some(user) = user {
        cgi.env("REMOTE_USER", user);
    }
    let mut child = match cgi.spawn() {
        Ok(child) => child,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("spawn git http-backend: {e}")).into_response(),
    };
    // Written concurrently with reading the output: either may fill a pipe.
    let mut stdin = child.stdin.take().unwrap();
    tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let output = match child.wait_with_output().await {
        Ok(output) => output,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("git http-backend: {e}")).into_response(),
    };
    if !output.status.success() && output.stdout.is_empty() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return (StatusCode::INTERNAL_SERVER_ERROR, format!("git http-backend: {}: {stderr}", output.status))
            .into_response();
    }
    cgi_response(output.stdout)
}

/// Parses CGI output: header lines (`Status: 200 OK` among them, default 200) ending at a blank
/// line (`\r\n` or `\n` line ends), then the body.
fn cgi_response(stdout: Vec<u8>) -> Response {
    let mut response = Response::new(Body::empty());
    let mut rest = &stdout[..];
    loop {
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            return (StatusCode::BAD_GATEWAY, "CGI output without a header block").into_response();
        };
        let line = rest[..end].strip_suffix(b"\r").unwrap_or(&rest[..end]);
        rest = &rest[end + 1..];
        if line.is_empty() {
            break;
        }
        let line = String::from_utf8_lossy(line);
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().and_then(|c| c.parse().ok());
            *response.status_mut() = code.and_then(|c| StatusCode::from_u16(c).ok()).unwrap_or(StatusCode::BAD_GATEWAY);
        } else if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            response.headers_mut().append(name, value);
        }
    }
    *response.body_mut() = Body::from(rest.to_vec());
    response
}

/// A bare repository (default branch `main`) written by the git CLI, and a work tree that
/// pushes to it.
pub struct GitRepo {
    pub bare: PathBuf,
    work: tempfile::TempDir,
    _bare_dir: Option<tempfile::TempDir>,
}

impl Default for GitRepo {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs git synchronously (repositories are written before a server serves them) and panics
/// with its stderr when it fails; returns its stdout.
fn git_sync(dir: &Path, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new(git_binary());
    hermetic_git(&mut cmd);
    let output = cmd.current_dir(dir).args(args).output().expect("run git");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "git {args:?} failed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

impl GitRepo {
    /// A new bare repository at `<dir>/<relative>` (e.g. `group/project-1.git`; parent
    /// directories created); its work tree lives in a fresh temp dir owned by the `GitRepo`.
    pub fn create_in(dir: &Path, relative: &str) -> Self {
        Self::create(dir.join(relative), None)
    }

    /// A new bare repository in its own temp dir.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::create(dir.path().join("repo.git"), Some(dir))
    }

    fn create(bare: PathBuf, bare_dir: Option<tempfile::TempDir>) -> Self {
        std::fs::create_dir_all(&bare).expect("create bare repository dir");
        git_sync(&bare, &["init", "--quiet", "--bare", "--initial-branch=main", "."]);
        let work = tempfile::tempdir().expect("tempdir");
        git_sync(work.path(), &["init", "--quiet", "--initial-branch=main", "."]);
        Self { bare, work, _bare_dir: bare_dir }
    }

    /// The work tree that commits are made in.
    pub fn work_tree(&self) -> &Path {
        self.work.path()
    }

    /// Writes `content` at `path` in the work tree, commits it (as `kas-test
    /// <kas@test.invalid>`; a new commit even if nothing changed) and pushes `main` to the
    /// bare repository. Returns the new commit id (40 hex digits).
    pub fn commit(&self, path: &str, content: &[u8]) -> String {
        let file = self.work.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).expect("create dirs");
        std::fs::write(&file, content).expect("write file");
        let work = self.work.path();
        git_sync(work, &["add", "--", path]);
        let message = format!("update {path}");
        let commit = ["commit", "--quiet", "--allow-empty", "-m", &message];
        git_sync(work, &[&["-c", "user.name=kas-test", "-c", "user.email=kas@test.invalid"][..], &commit].concat());
        git_sync(work, &["push", "--quiet", &self.bare.display().to_string(), "HEAD:refs/heads/main"]);
        git_sync(work, &["rev-parse", "HEAD"]).trim().to_owned()
    }

    /// Writes `content` at `path` in the work tree and stages it, without committing: the next
    /// [`GitRepo::commit`] carries it too (one commit changing several files).
    pub fn stage(&self, path: &str, content: &[u8]) {
        let file = self.work.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).expect("create dirs");
        std::fs::write(&file, content).expect("write file");
        git_sync(self.work.path(), &["add", "--", path]);
    }

    /// Removes `path` from the work tree in a new commit pushed to `main`; returns its id.
    pub fn remove(&self, path: &str) -> String {
        let work = self.work.path();
        git_sync(work, &["rm", "--quiet", "--", path]);
        let message = format!("remove {path}");
        let commit = ["commit", "--quiet", "-m", &message];
        git_sync(work, &[&["-c", "user.name=kas-test", "-c", "user.email=kas@test.invalid"][..], &commit].concat());
        git_sync(work, &["push", "--quiet", &self.bare.display().to_string(), "HEAD:refs/heads/main"]);
        git_sync(work, &["rev-parse", "HEAD"]).trim().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `git clone` through the server (hermetic config, no prompts, packet trace on stderr).
    async fn clone(server: &GitHttpServer, url: &str, dest: &Path, config: &[&str]) -> std::process::Output {
        let mut cmd = git_command();
        cmd.args(["-c", "credential.helper="]);
        if let Some(ca) = server.ca_file() {
            cmd.arg("-c").arg(format!("http.sslCAInfo={}", ca.display()));
        }
        for c in config {
            cmd.args(["-c", c]);
        }
        cmd.args(["clone", url]).arg(dest);
        cmd.env("GIT_TERMINAL_PROMPT", "0").env_remove("GIT_ASKPASS").env_remove("SSH_ASKPASS");
        cmd.env("GIT_TRACE_PACKET", "1").kill_on_drop(true);
        cmd.output().await.expect("run git clone")
    }

    fn assert_cloned(output: &std::process::Output, dest: &Path, commit: &str) {
        assert!(output.status.success(), "clone failed: {}", String::from_utf8_lossy(&output.stderr));
        assert_eq!(std::fs::read(dest.join("dir/file.txt")).unwrap(), b"hello\n");
        assert_eq!(git_sync(dest, &["rev-parse", "HEAD"]).trim(), commit);
    }

    #[tokio::test]
    async fn clones_over_http_and_https_with_each_protocol_version() {
        let root = tempfile::tempdir().unwrap();
        let repo = GitRepo::create_in(root.path(), "group/p.git");
        let commit = repo.commit("dir/file.txt", b"hello\n");
        assert_eq!(commit.len(), 40);
        let out = tempfile::tempdir().unwrap();
        for tls in [false, true] {
            let server = GitHttpServer::start_with(root.path(), GitHttpOptions { tls, ..Default::default() }).await;
            assert_eq!(server.ca_file().is_some(), tls);
            let url = format!("{}/group/p.git", server.url());
            for version in [0, 1, 2] {
                let (v2_before, posts_before) = (server.protocol_v2_requests(), server.upload_pack_posts());
                let dest = out.path().join(format!("tls-{tls}-v{version}"));
                let output = clone(&server, &url, &dest, &[&format!("protocol.version={version}")]).await;
                assert_cloned(&output, &dest, &commit);
                let trace = String::from_utf8_lossy(&output.stderr);
                let v2_requests = server.protocol_v2_requests() - v2_before;
                let posts = server.upload_pack_posts() - posts_before;
                if version == 2 {
                    // The server answered in v2: ls-refs and fetch are both upload-pack POSTs.
                    assert!(trace.contains("git< version 2"), "{trace}");
                    assert!(v2_requests >= 2 && posts >= 2, "{v2_requests} v2 requests, {posts} posts");
                } else {
                    assert!(!trace.contains("git< version 2"), "{trace}");
                    assert_eq!((v2_requests, posts), (0, 1));
                }
            }
            assert_eq!(server.requests_with_credentials(), 0);
        }
    }

    #[tokio::test]
    async fn https_clone_fails_without_the_ca() {
        let root = tempfile::tempdir().unwrap();
        GitRepo::create_in(root.path(), "p.git").commit("dir/file.txt", b"hello\n");
        let server = GitHttpServer::start_with(root.path(), GitHttpOptions { tls: true, ..Default::default() }).await;
        let dest = tempfile::tempdir().unwrap();
        let mut cmd = git_command();
        cmd.args(["clone", &format!("{}/p.git", server.url())]).arg(dest.path().join("p"));
        let output = cmd.env("GIT_TERMINAL_PROMPT", "0").kill_on_drop(true).output().await.unwrap();
        assert!(!output.status.success());
        assert_eq!(server.requests(), 0, "no request gets past the TLS handshake");
    }

    #[tokio::test]
    async fn basic_auth_is_required() {
        let root = tempfile::tempdir().unwrap();
        let commit = GitRepo::create_in(root.path(), "group/p.git").commit("dir/file.txt", b"hello\n");
        let basic_auth = Some(("user".to_owned(), "pa55".to_owned()));
        let server =
            GitHttpServer::start_with(root.path(), GitHttpOptions { tls: true, basic_auth, ..Default::default() })
                .await;
        let port = server.url().rsplit(':').next().unwrap().to_owned();
        let out = tempfile::tempdir().unwrap();

        let output = clone(&server, &format!("{}/group/p.git", server.url()), &out.path().join("a"), &[]).await;
        assert!(!output.status.success());
        assert_eq!((server.requests_with_credentials(), server.upload_pack_posts()), (0, 0));

        let wrong = format!("https://user:wrong@localhost:{port}/group/p.git");
        let output = clone(&server, &wrong, &out.path().join("b"), &[]).await;
        assert!(!output.status.success());
        assert!(server.rejected_credentials() > 0);
        assert_eq!(server.upload_pack_posts(), 0);

        let (rejected, requests) = (server.rejected_credentials(), server.requests());
        let right = format!("https://user:pa55@localhost:{port}/group/p.git");
        let dest = out.path().join("c");
        assert_cloned(&clone(&server, &right, &dest, &[]).await, &dest, &commit);
        assert_eq!(server.rejected_credentials(), rejected);
        assert!(server.requests_with_credentials() > 0);
        assert!(server.upload_pack_posts() >= 1);
        assert!(server.requests() > requests);
    }

    #[test]
    fn cgi_headers_are_parsed() {
        let response = cgi_response(b"Status: 404 Not Found\nContent-Type: text/plain\r\nX-A: b\n\r\nbody\n".to_vec());
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()["content-type"], "text/plain");
        assert_eq!(response.headers()["x-a"], "b");
        let response = cgi_response(b"Content-Type: x\n\n".to_vec());
        assert_eq!(response.status(), StatusCode::OK);
    }
}
