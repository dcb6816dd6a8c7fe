//! The second level of [`GitlabVerifier`](super::GitlabVerifier)'s agent_info cache: entries
//! shared by every kas of one Redis registry, so an agent that moves to another kas (a failover,
//! a rolling restart) is not verified with GitLab again, and the fleet asks GitLab about each
//! token once per `ttl` instead of once per kas.
//!
//! Only successes are shared, each for what is left of the `ttl` since GitLab said yes: a kas
//! that copies an entry keeps it locally only as long as it still lives in the store, so a revoked
//! token stops working fleet-wide `ttl` after GitLab last accepted it. Failures stay local (they
//! are short and per peer).
//!
//! Entries are keyed by an HMAC of the token ([`SharedKeys`]), never by its plain hash, and hold
//! the [`AgentInfo`] fields kas uses as JSON (never the token) with their expiry, sealed by an
//! HMAC over the entry's key and value: whoever can write to Redis can delete or shorten entries
//! (kas then asks GitLab), but not make a token another agent's, nor make a yes outlive its
//! `ttl`. The store ([`SharedAgentInfoCache`]) is the registry's Redis connection; auth knows it
//! only through this trait. Errors and slow answers of the store never fail a verification: kas
//! asks GitLab instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::AgentInfo;
use crate::auth::secret::Secret;

/// A call to the shared store that takes longer is abandoned (and counted as an error): GitLab
/// answers in about this time too, and a slow Redis must not slow every verification.
pub const SHARED_CACHE_TIMEOUT: Duration = Duration::from_secs(1);

/// Sets the HMAC's message apart from every other use of the same secret: the JWTs kas signs
/// with it (HS256) are HMAC-SHA256 of `header.payload`, base64url text that never holds a space
/// or a NUL, so no token can make a cache key equal to a JWT signature.
const KEY_CONTEXT: &[u8] = b"kas agent_info cache v1\0";
/// Sets the seal of a value apart from keys (and from JWTs, as above).
const SEAL_CONTEXT: &[u8] = b"kas agent_info cache value v1\0";
/// The seal's length: an HMAC-SHA256, before the JSON in the stored value.
const SEAL_LEN: usize = 32;

/// The key of one token's entry (an HMAC-SHA256, see [`SharedKeys`]).
pub type SharedKey = [u8; 32];

/// A store of expiring entries shared by every kas (the Redis registry's connection).
#[async_trait]
pub trait SharedAgentInfoCache: Send + Sync + 'static {
    /// The entry under `key` and how long it still lives there; `None` if there is none.
    async fn get(&self, key: &SharedKey) -> Result<Option<(Vec<u8>, Duration)>, SharedCacheError>;
    /// Stores `value` under `key` for `ttl` (replacing what was there).
    async fn put(&self, key: &SharedKey, value: &[u8], ttl: Duration) -> Result<(), SharedCacheError>;
}

/// The shared store failed (or answered something unusable); the text names no token.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SharedCacheError(pub String);

/// Derives entry keys: HMAC-SHA256 of the token under a secret every kas holds. A plain SHA-256
/// would let anyone who can read Redis test guessed tokens offline; the HMAC needs the secret.
///
/// The secret is kas_internal's (`kas_internal.authentication_secret_file`): exactly the kas
/// replicas that share a registry hold it (they authenticate each other's forwards with it), and
/// nothing else does. GitLab's secret would work as well, but GitLab holds it too, so more
/// parties could compute keys. A kas with another secret (during a rotation) finds no entry of
/// the others and asks GitLab: slower, never wrong.
#[derive(Clone)]
pub struct SharedKeys {
    secret: Secret,
}

impl std::fmt::Debug for SharedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedKeys(***)")
    }
}

/// What an entry holds (as JSON, after its seal).
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    /// When GitLab's yes lapses (the writer's wall clock): a reader keeps the entry no longer,
    /// whatever Redis's own expiry says.
    expires_at_unix_ms: u64,
    info: AgentInfo,
}

impl SharedKeys {
    pub fn new(secret: Secret) -> Self {
        Self { secret }
    }

    fn mac(&self, context: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(self.secret.bytes()) else {
            unreachable!("HMAC takes keys of any length")
        };
        mac.update(context);
        mac
    }

    /// The key of `token`'s entry.
    pub fn key(&self, token: &str) -> SharedKey {
        let mut mac = self.mac(KEY_CONTEXT);
        mac.update(token.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The stored value of `key`'s entry: its seal, then the JSON of `info` and its expiry.
    fn seal(&self, key: &SharedKey, info: &AgentInfo, ttl: Duration) -> Result<Vec<u8>, SharedCacheError> {
        let entry = Entry { expires_at_unix_ms: unix_ms().saturating_add(millis(ttl)), info: info.clone() };
        let json =
            serde_json::to_vec(&entry).map_err(|e| SharedCacheError(format!("cannot encode agent info: {e}")))?;
        let mut mac = self.mac(SEAL_CONTEXT);
        mac.update(key);
        mac.update(&json);
        let mut value = mac.finalize().into_bytes().to_vec();
        value.extend_from_slice(&json);
        Ok(value)
    }

    /// The agent info in `key`'s stored value and how long it still holds by its own expiry
    /// (zero when lapsed); an error when the seal does not match (written without the secret, or
    /// for another key) or the JSON is not an entry.
    fn open(&self, key: &SharedKey, value: &[u8]) -> Result<(AgentInfo, Duration), SharedCacheError> {
        if value.len() < SEAL_LEN {
            return Err(SharedCacheError("an entry too short to be sealed".into()));
        }
        let (seal, json) = value.split_at(SEAL_LEN);
        let mut mac = self.mac(SEAL_CONTEXT);
        mac.update(key);
        mac.update(json);
        mac.verify_slice(seal).map_err(|_| {
            SharedCacheError("an entry whose seal does not match (another secret, or not written by kas)".into())
        })?;
        let entry: Entry = serde_json::from_slice(json)
            .map_err(|e| SharedCacheError(format!("a sealed entry that is not agent info: {e}")))?;
        let left = Duration::from_millis(entry.expires_at_unix_ms.saturating_sub(unix_ms()));
        Ok((entry.info, left))
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, millis)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a call to the shared level found or did (the `outcome` of
/// `kas_agent_info_shared_cache_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Hit,
    Miss,
    Error,
    Stored,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Error => "error",
            Self::Stored => "stored",
        }
    }
}

/// The shared level as [`GitlabVerifier`](super::GitlabVerifier) uses it: keys, bounded calls,
/// counting, and warnings that do not repeat while the store keeps failing.
pub(super) struct SharedLevel {
    store: Arc<dyn SharedAgentInfoCache>,
    keys: SharedKeys,
    timeout: Duration,
    /// The last call failed: further failures are logged at debug until one succeeds.
    failing: AtomicBool,
}

impl std::fmt::Debug for SharedLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLevel").field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl SharedLevel {
    pub(super) fn new(store: Arc<dyn SharedAgentInfoCache>, keys: SharedKeys, timeout: Duration) -> Self {
        Self { store, keys, timeout, failing: AtomicBool::new(false) }
    }

    pub(super) fn key(&self, token: &str) -> SharedKey {
        self.keys.key(token)
    }

    /// The shared entry and how long it still lives; `None` on a miss and on any failure (the
    /// caller asks GitLab).
    pub(super) async fn get(&self, key: &SharedKey) -> Option<(AgentInfo, Duration)> {
        let answer = match tokio::time::timeout(self.timeout, self.store.get(key)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return self.failed("get", &e),
            Err(_) => return self.failed("get", &SharedCacheError(format!("no answer within {:?}", self.timeout))),
        };
        let Some((value, stored_left)) = answer else {
            self.succeeded(Outcome::Miss);
            return None;
        };
        // Unsealed, damaged or from another version: GitLab answers, and its answer replaces it.
        match self.keys.open(key, &value) {
            Ok((info, left)) => match left.min(stored_left) {
                left if left.is_zero() => {
                    self.succeeded(Outcome::Miss);
                    None
                }
                _ if info.agent_id <= 0 || info.project_id <= 0 => {
                    self.failed("get", &SharedCacheError("an entry with invalid ids".into()))
                }
                left => {
                    self.succeeded(Outcome::Hit);
                    Some((info, left))
                }
            },
            Err(e) => self.failed("get", &e),
        }
    }

    /// Shares GitLab's answer for `ttl` (failures are logged and counted, never returned).
    pub(super) async fn put(&self, key: &SharedKey, info: &AgentInfo, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let value = match self.keys.seal(key, info, ttl) {
            Ok(value) => value,
            Err(e) => {
                self.failed::<()>("put", &e);
                return;
            }
        };
        match tokio::time::timeout(self.timeout, self.store.put(key, &value, ttl)).await {
            Ok(Ok(())) => self.succeeded(Outcome::Stored),
            Ok(Err(e)) => {
                self.failed::<()>("put", &e);
            }
            Err(_) => {
                self.failed::<()>("put", &SharedCacheError(format!("no answer within {:?}", self.timeout)));
            }
        }
    }

    fn succeeded(&self, outcome: Outcome) {
        crate::metrics::shared_agent_info(outcome.label());
        if self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!("the shared agent_info cache answers again");
        }
    }

    fn failed<T>(&self, operation: &'static str, e: &SharedCacheError) -> Option<T> {
        crate::metrics::shared_agent_info(Outcome::Error.label());
        if self.failing.swap(true, Ordering::Relaxed) {
            tracing::debug!(operation, error = %e, "shared agent_info cache failed; asking GitLab");
        } else {
            tracing::warn!(operation, error = %e, "shared agent_info cache failed; asking GitLab until it answers");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use sha2::Digest;

    use super::*;

    #[test]
    fn keys_are_an_hmac_of_the_token_not_its_hash() {
        let secret = Secret::generate();
        let keys = SharedKeys::new(secret.clone());
        let token = "glagent-secret-token";
        let key = keys.key(token);
        assert_eq!(key, keys.key(token), "stable");
        assert_ne!(key, keys.key("glagent-other-token"));
        let plain: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        assert_ne!(key, plain, "not the token's plain SHA-256");
        // HMAC-SHA256 over the context and the token, under the secret.
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.bytes()).unwrap();
        mac.update(b"kas agent_info cache v1\0glagent-secret-token");
        assert_eq!(key, <[u8; 32]>::from(mac.finalize().into_bytes()));
        // Not the bare HMAC of the token either (that could equal a JWT signature).
        let mut bare = Hmac::<Sha256>::new_from_slice(secret.bytes()).unwrap();
        bare.update(token.as_bytes());
        assert_ne!(key, <[u8; 32]>::from(bare.finalize().into_bytes()));
        // Another secret, other keys.
        assert_ne!(key, SharedKeys::new(Secret::generate()).key(token));
        assert_eq!(format!("{keys:?}"), "SharedKeys(***)");
    }

    #[test]
    fn values_are_sealed_to_their_key_and_carry_their_expiry() {
        let keys = SharedKeys::new(Secret::generate());
        let (key, other_key) = (keys.key("token-one"), keys.key("token-two"));
        let value = keys.seal(&key, &info(), Duration::from_secs(300)).unwrap();
        let (opened, left) = keys.open(&key, &value).unwrap();
        assert_eq!(opened, info());
        assert!(left > Duration::from_secs(299) && left <= Duration::from_secs(300), "{left:?}");
        assert!(!String::from_utf8_lossy(&value).contains("token-one"));
        // Moved to another token's key, sealed with another secret, or changed: refused.
        assert!(keys.open(&other_key, &value).is_err());
        let stranger = SharedKeys::new(Secret::generate());
        assert!(stranger.open(&key, &value).is_err());
        let mut forged = value.clone();
        let json = String::from_utf8(forged.split_off(SEAL_LEN)).unwrap().replace(r#""agent_id":3"#, r#""agent_id":4"#);
        forged.extend_from_slice(json.as_bytes());
        assert!(keys.open(&key, &forged).unwrap_err().to_string().contains("seal does not match"));
        assert!(keys.open(&key, b"short").is_err());
        // A lapsed yes holds no longer, whatever the store's own expiry says.
        let lapsed = keys.seal(&key, &info(), Duration::ZERO).unwrap();
        assert_eq!(keys.open(&key, &lapsed).unwrap().1, Duration::ZERO);
    }

    /// An in-memory store whose entries expire on tokio's clock, and that can fail or stall.
    #[derive(Default)]
    struct Store {
        entries: Mutex<HashMap<SharedKey, (Vec<u8>, tokio::time::Instant)>>,
        broken: AtomicBool,
        stalled: AtomicBool,
    }

    #[async_trait]
    impl SharedAgentInfoCache for Store {
        async fn get(&self, key: &SharedKey) -> Result<Option<(Vec<u8>, Duration)>, SharedCacheError> {
            self.trouble().await?;
            let now = tokio::time::Instant::now();
            let entries = self.entries.lock().unwrap();
            Ok(entries.get(key).filter(|(_, until)| *until > now).map(|(v, until)| (v.clone(), *until - now)))
        }

        async fn put(&self, key: &SharedKey, value: &[u8], ttl: Duration) -> Result<(), SharedCacheError> {
            self.trouble().await?;
            let until = tokio::time::Instant::now() + ttl;
            self.entries.lock().unwrap().insert(*key, (value.to_vec(), until));
            Ok(())
        }
    }

    impl Store {
        async fn trouble(&self) -> Result<(), SharedCacheError> {
            if self.stalled.load(Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            if self.broken.load(Ordering::Relaxed) {
                return Err(SharedCacheError("connection refused".into()));
            }
            Ok(())
        }
    }

    fn info() -> AgentInfo {
        serde_json::from_str(r#"{"project_id": 7, "agent_id": 3, "agent_name": "prod", "default_branch": "main"}"#)
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_entry_lives_what_is_left_of_its_ttl_and_failures_are_misses() {
        let store = Arc::new(Store::default());
        let level = SharedLevel::new(store.clone(), SharedKeys::new(Secret::generate()), SHARED_CACHE_TIMEOUT);
        let key = level.key("token");
        assert!(level.get(&key).await.is_none());
        level.put(&key, &info(), Duration::from_secs(300)).await;
        tokio::time::advance(Duration::from_secs(100)).await;
        let (got, left) = level.get(&key).await.unwrap();
        assert_eq!(got, info());
        assert_eq!(left, Duration::from_secs(200), "what is left, not a new ttl");
        // The value is the sealed agent info as JSON, without any token.
        let stored = store.entries.lock().unwrap()[&key].0.clone();
        assert!(!String::from_utf8_lossy(&stored).contains("token"));
        assert!(String::from_utf8_lossy(&stored[SEAL_LEN..]).starts_with(r#"{"expires_at_unix_ms":"#));
        tokio::time::advance(Duration::from_secs(200)).await;
        assert!(level.get(&key).await.is_none(), "expired with its source");

        // An entry the store would keep past its sealed expiry is a miss.
        let lapsed = level.keys.seal(&key, &info(), Duration::ZERO).unwrap();
        store.entries.lock().unwrap().insert(key, (lapsed, tokio::time::Instant::now() + Duration::from_secs(9)));
        assert!(level.get(&key).await.is_none());

        // A damaged entry, a failing store and a stalled one are misses (GitLab answers).
        store
            .entries
            .lock()
            .unwrap()
            .insert(key, (b"{not json".to_vec(), tokio::time::Instant::now() + Duration::from_secs(9)));
        assert!(level.get(&key).await.is_none());
        store.broken.store(true, Ordering::Relaxed);
        level.put(&key, &info(), Duration::from_secs(300)).await;
        assert!(level.get(&key).await.is_none());
        store.broken.store(false, Ordering::Relaxed);
        store.stalled.store(true, Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        assert!(level.get(&key).await.is_none());
        level.put(&key, &info(), Duration::from_secs(300)).await;
        assert_eq!(started.elapsed(), 2 * SHARED_CACHE_TIMEOUT, "each call waits at most the timeout");
    }

    /// The address of a GitLab that cannot answer (nothing listens there).
    fn unreachable_gitlab() -> String {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", closed.local_addr().unwrap())
    }

    /// A GitLab whose agent_info answers the n-th request (0-based) with `answer(n)`, and how
    /// many it was asked.
    async fn fake_gitlab(
        answer: fn(usize) -> (http::StatusCode, &'static str),
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        let gitlab = axum::Router::new().route(
            super::super::AGENT_INFO_PATH,
            axum::routing::get(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move { answer(n) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, gitlab).await });
        (address, asked)
    }

    const YES: (http::StatusCode, &str) =
        (http::StatusCode::OK, r#"{"project_id": 7, "agent_id": 3, "agent_name": "prod"}"#);

    /// A verifier of GitLab at `address` with the in-memory shared store (`ttl`: the default
    /// when None).
    fn verifier(address: &str, ttl: Option<Duration>) -> (super::super::GitlabVerifier, Arc<Store>, SharedKeys) {
        let mut config = super::super::GitlabConfig::default();
        if let Some(ttl) = ttl {
            config.agent_info_cache.ttl = ttl;
        }
        let (store, keys) = (Arc::new(Store::default()), SharedKeys::new(Secret::generate()));
        let verifier = super::super::GitlabVerifier::new(&config, address, Secret::generate())
            .unwrap()
            .with_shared_cache(store.clone(), keys.clone());
        (verifier, store, keys)
    }

    #[tokio::test(start_paused = true)]
    async fn the_verifier_keeps_a_shared_answer_only_as_long_as_it_lives_there() {
        use crate::auth::agent_token::TokenVerifier;
        // A GitLab that cannot answer: every success below comes from the shared entry.
        let (verifier, store, keys) = verifier(&unreachable_gitlab(), None);
        // Another kas had GitLab's yes 4 of the 5 minutes ago: one minute is left.
        let key = keys.key("tok");
        let value = keys.seal(&key, &info(), Duration::from_secs(60)).unwrap();
        store.put(&key, &value, Duration::from_secs(60)).await.unwrap();
        assert_eq!(verifier.verify("tok").await.unwrap().agent_id, kas_proto::AgentId(3));
        store.entries.lock().unwrap().clear();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(verifier.verify("tok").await.unwrap().agent_id, kas_proto::AgentId(3), "kept locally");
        tokio::time::advance(Duration::from_secs(2)).await;
        let e = verifier.verify("tok").await.unwrap_err();
        assert_eq!(e.grpc_code(), tonic::Code::Unavailable, "expired with the shared entry: {e}");
    }

    /// Another kas renewed the shared entry: an answer in its last quarter is renewed from it in
    /// the background, so it outlives the copy it was made from (GitLab cannot answer here).
    #[tokio::test(start_paused = true)]
    async fn an_answer_near_its_end_adopts_the_entry_another_kas_renewed() {
        use crate::auth::agent_token::TokenVerifier;
        let (verifier, store, keys) = verifier(&unreachable_gitlab(), None);
        let key = keys.key("tok");
        let put = |left: u64| {
            let value = keys.seal(&key, &info(), Duration::from_secs(left)).unwrap();
            store.entries.lock().unwrap().insert(key, (value, tokio::time::Instant::now() + Duration::from_secs(left)));
        };
        // 100 s left: more than a quarter of the 5 min ttl, so no renewal yet.
        put(100);
        verifier.verify("tok").await.unwrap();
        tokio::time::advance(Duration::from_secs(40)).await;
        // 60 s left now; another kas has renewed the entry meanwhile.
        put(300);
        verifier.verify("tok").await.unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        // Whatever the store holds from now on, this kas holds its renewed copy.
        store.entries.lock().unwrap().clear();
        tokio::time::advance(Duration::from_secs(100)).await;
        assert_eq!(
            verifier.verify("tok").await.unwrap().agent_id,
            kas_proto::AgentId(3),
            "the copy would have expired 40 s ago without the renewal"
        );
    }

    /// No kas renewed it: the answer is renewed with GitLab before it expires, and the shared
    /// entry is written again, so it never lapses while the agent is verified.
    #[tokio::test]
    async fn an_answer_in_use_is_renewed_with_gitlab_before_it_expires() {
        use crate::auth::agent_token::TokenVerifier;
        let (address, asked) = fake_gitlab(|_| YES).await;
        let (verifier, store, keys) = verifier(&address, Some(Duration::from_secs(2)));
        verifier.verify("tok").await.unwrap();
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        let first = store.entries.lock().unwrap()[&keys.key("tok")].1;
        // Verified as agentk's tunnels do it, until the renewal (in the last 0.5 s) happened.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while asked.load(Ordering::SeqCst) < 2 {
            assert!(tokio::time::Instant::now() < deadline, "no renewal within 10 s");
            verifier.verify("tok").await.expect("the answer never lapsed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(tokio::time::Instant::now() < first, "renewed while the first answer still held, not after it lapsed");
        let renewed = store.entries.lock().unwrap()[&keys.key("tok")].1;
        assert!(renewed > first, "the shared entry was written again");
        assert!(renewed > tokio::time::Instant::now() + Duration::from_secs(1), "a fresh ttl");
        assert_eq!(asked.load(Ordering::SeqCst), 2, "one renewal");
    }

    /// GitLab says no to the renewal (the token was revoked): the answer still holds until its
    /// end, and the verifications meanwhile do not ask GitLab again.
    #[tokio::test]
    async fn a_refused_renewal_is_not_repeated() {
        use crate::auth::agent_token::TokenVerifier;
        let (address, asked) = fake_gitlab(|n| if n == 0 { YES } else { (http::StatusCode::UNAUTHORIZED, "") }).await;
        let (verifier, _store, _keys) = verifier(&address, Some(Duration::from_secs(2)));
        verifier.verify("tok").await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while verifier.verify("tok").await.is_ok() {
            assert!(tokio::time::Instant::now() < deadline, "the yes outlived its ttl");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The yes, one refused renewal, and the request once the answer expired.
        assert_eq!(asked.load(Ordering::SeqCst), 3);
    }
}
