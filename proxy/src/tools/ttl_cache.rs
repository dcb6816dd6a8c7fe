//! A per-key TTL cache with single-flight loading, for answers of a slow backend (GitLab).
//!
//! Keys are 32-byte digests (the SHA-256 of an agent token: the token itself is never kept).
//! Each key maps to a `tokio::sync::OnceCell`: the first caller loads, concurrent callers for
//! the same key await that one load. The std mutex guards only the map and is never held across
//! an `.await`. Successes and failures are kept for separate TTLs (refusals of kas's own rate
//! limit only serve the callers waiting for them); a fetch may shorten a success's life (an
//! answer copied from a cache shared between kas lives only as long as it has left there). The
//! map holds at most `max_entries` keys (expired entries are evicted first, then those expiring
//! soonest).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::error::KasError;

pub type CacheKey = [u8; 32];

#[derive(Debug, Clone)]
struct Stored<V> {
    value: Result<V, KasError>,
    expires_at: Instant,
}

/// One answer, loaded once; `created` is when its load began.
#[derive(Debug)]
struct Slot<V> {
    created: Instant,
    cell: OnceCell<Stored<V>>,
}

type Cell<V> = Arc<Slot<V>>;

#[derive(Debug)]
pub struct TtlCache<V> {
    entries: Mutex<HashMap<CacheKey, Cell<V>>>,
    ttl: Duration,
    error_ttl: Duration,
    max_entries: usize,
}

impl<V: Clone> TtlCache<V> {
    pub fn new(ttl: Duration, error_ttl: Duration, max_entries: usize) -> Self {
        Self { entries: Mutex::default(), ttl, error_ttl, max_entries: max_entries.max(1) }
    }

    /// The cached answer for `key`, or the answer of `fetch` (run by one caller at a time per
    /// key; the others wait for it). The answer is kept for `ttl` (Ok) or `error_ttl` (Err).
    pub async fn get_or_fetch<F, Fut>(&self, key: CacheKey, fetch: F) -> Result<V, KasError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, KasError>>,
    {
        self.get_or_fetch_since(key, None, fetch).await
    }

    /// [`TtlCache::get_or_fetch`], but an answer whose load began before `since` counts as
    /// expired (something changed at `since`: only a load begun after it may answer). Callers
    /// passing the same `since` still share one load.
    pub async fn get_or_fetch_since<F, Fut>(
        &self,
        key: CacheKey,
        since: Option<Instant>,
        fetch: F,
    ) -> Result<V, KasError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, KasError>>,
    {
        self.load(key, since, || async { fetch().await.map(|value| (value, self.ttl)) }).await
    }

    /// [`TtlCache::get_or_fetch`], but `fetch` says how long its answer lives (at most `ttl`): an
    /// answer copied from another cache expires when its source does, not a full `ttl` later.
    pub async fn get_or_fetch_expiring<F, Fut>(&self, key: CacheKey, fetch: F) -> Result<V, KasError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(V, Duration), KasError>>,
    {
        self.load(key, None, fetch).await
    }

    async fn load<F, Fut>(&self, key: CacheKey, since: Option<Instant>, fetch: F) -> Result<V, KasError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(V, Duration), KasError>>,
    {
        let slot = self.cell(key, since);
        let stored = slot
            .cell
            .get_or_init(|| async {
                let (value, ttl) = match fetch().await {
                    Ok((value, ttl)) => (Ok(value), ttl.min(self.ttl)),
                    // kas's own limiter refused: the next caller may find room at once.
                    Err(e @ KasError::RateLimited(_)) => (Err(e), Duration::ZERO),
                    Err(e) => (Err(e), self.error_ttl),
                };
                Stored { value, expires_at: Instant::now() + ttl }
            })
            .await;
        stored.value.clone()
    }

    /// How long the answer held for `key` still lives, when it is a loaded success.
    pub fn remaining(&self, key: &CacheKey) -> Option<Duration> {
        let entries = self.lock();
        let stored = entries.get(key)?.cell.get()?;
        stored.value.as_ref().ok()?;
        Some(stored.expires_at.saturating_duration_since(Instant::now()))
    }

    /// Replaces the answer for `key` with `value`, kept for `ttl` (at most the cache's ttl): a
    /// renewal done aside from the callers.
    pub fn insert(&self, key: CacheKey, value: V, ttl: Duration) {
        let now = Instant::now();
        let stored = Stored { value: Ok(value), expires_at: now + ttl.min(self.ttl) };
        let slot = Arc::new(Slot { created: now, cell: OnceCell::new_with(Some(stored)) });
        insert_bounded(&mut self.lock(), key, slot, now, self.max_entries);
    }

    /// Keys currently held (loaded or loading, expired or not).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` is held (for tests: proves what the cache is keyed by).
    pub fn contains(&self, key: &CacheKey) -> bool {
        self.lock().contains_key(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<CacheKey, Cell<V>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cell for `key`: the current one unless it holds an expired answer or began loading
    /// before `since`.
    fn cell(&self, key: CacheKey, since: Option<Instant>) -> Cell<V> {
        let now = Instant::now();
        let mut entries = self.lock();
        if let Some(slot) = entries.get(&key) {
            let outdated = since.is_some_and(|since| slot.created < since);
            match slot.cell.get() {
                Some(stored) if stored.expires_at <= now => {} // expired: replaced below
                _ if outdated => {}
                _ => return slot.clone(),
            }
        }
        let slot = Arc::new(Slot { created: now, cell: OnceCell::new() });
        insert_bounded(&mut entries, key, slot.clone(), now, self.max_entries);
        slot
    }
}

/// Puts `slot` under `key`, making room first when `key` is new and the map is full.
fn insert_bounded<V>(
    entries: &mut HashMap<CacheKey, Cell<V>>,
    key: CacheKey,
    slot: Cell<V>,
    now: Instant,
    max_entries: usize,
) {
    if !entries.contains_key(&key) && entries.len() >= max_entries {
        evict(entries, now, max_entries);
    }
    entries.insert(key, slot);
}

/// Makes room for one more entry: expired answers go first, then the answers expiring soonest,
/// then (only if every entry is still loading) any entry.
fn evict<V>(entries: &mut HashMap<CacheKey, Cell<V>>, now: Instant, max_entries: usize) {
    entries.retain(|_, c| c.cell.get().is_none_or(|s| s.expires_at > now));
    while entries.len() >= max_entries {
        let victim = entries
            .iter()
            .filter_map(|(k, c)| c.cell.get().map(|s| (s.expires_at, *k)))
            .min()
            .map(|(_, k)| k)
            .or_else(|| entries.keys().next().copied());
        match victim {
            Some(k) => {
                entries.remove(&k);
            }
            None => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn key(n: u8) -> CacheKey {
        [n; 32]
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_one_fetch() {
        let cache = Arc::new(TtlCache::<u32>::new(Duration::from_secs(60), Duration::from_secs(1), 10));
        let fetches = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let (cache, fetches) = (cache.clone(), fetches.clone());
                tokio::spawn(async move {
                    cache
                        .get_or_fetch(key(1), || async {
                            fetches.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            Ok(7)
                        })
                        .await
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), 7);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn success_and_error_have_their_own_ttl() {
        let cache = TtlCache::<u32>::new(Duration::from_secs(60), Duration::from_secs(5), 10);
        let fetches = AtomicUsize::new(0);
        let ok = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        };
        let err = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            Err(KasError::Unauthenticated("no".into()))
        };
        cache.get_or_fetch(key(1), ok).await.unwrap();
        cache.get_or_fetch(key(2), err).await.unwrap_err();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);

        tokio::time::advance(Duration::from_secs(4)).await;
        cache.get_or_fetch(key(1), ok).await.unwrap();
        cache.get_or_fetch(key(2), ok).await.unwrap_err(); // the error is still cached
        assert_eq!(fetches.load(Ordering::SeqCst), 2);

        tokio::time::advance(Duration::from_secs(2)).await; // 6 s: error expired, success not
        cache.get_or_fetch(key(1), err).await.unwrap();
        assert_eq!(cache.get_or_fetch(key(2), ok).await.unwrap(), 1);
        assert_eq!(fetches.load(Ordering::SeqCst), 3);

        tokio::time::advance(Duration::from_secs(60)).await; // success expired too
        cache.get_or_fetch(key(1), err).await.unwrap_err();
        assert_eq!(fetches.load(Ordering::SeqCst), 4);

        // A refusal of kas's own rate limit is not kept: the next call fetches at once.
        let limited = || async { Err(KasError::RateLimited("rate limited".into())) };
        cache.get_or_fetch(key(3), limited).await.unwrap_err();
        assert_eq!(cache.get_or_fetch(key(3), ok).await.unwrap(), 1);
        assert_eq!(fetches.load(Ordering::SeqCst), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_may_shorten_but_not_lengthen_its_answers_life() {
        let cache = TtlCache::<u32>::new(Duration::from_secs(60), Duration::from_secs(5), 10);
        let fetches = AtomicUsize::new(0);
        let lives = |ttl: Duration| {
            let fetches = &fetches;
            move || async move {
                fetches.fetch_add(1, Ordering::SeqCst);
                Ok((1, ttl))
            }
        };
        // An answer copied from elsewhere with 10 s left expires after 10 s, not 60 s.
        cache.get_or_fetch_expiring(key(1), lives(Duration::from_secs(10))).await.unwrap();
        // One claiming longer than the cache's ttl lives the ttl.
        cache.get_or_fetch_expiring(key(2), lives(Duration::from_secs(600))).await.unwrap();
        tokio::time::advance(Duration::from_secs(9)).await;
        cache.get_or_fetch_expiring(key(1), lives(Duration::from_secs(10))).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        tokio::time::advance(Duration::from_secs(2)).await; // 11 s
        cache.get_or_fetch_expiring(key(1), lives(Duration::from_secs(10))).await.unwrap();
        cache.get_or_fetch_expiring(key(2), lives(Duration::from_secs(600))).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 3, "only the shortened answer expired");
        tokio::time::advance(Duration::from_secs(50)).await; // 61 s
        cache.get_or_fetch_expiring(key(2), lives(Duration::from_secs(600))).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 4, "capped at the cache's ttl");
    }

    #[tokio::test(start_paused = true)]
    async fn size_is_bounded_and_soonest_expiring_go_first() {
        let cache = TtlCache::<u32>::new(Duration::from_secs(60), Duration::from_secs(5), 3);
        cache.get_or_fetch(key(1), || async { Ok(1) }).await.unwrap();
        cache.get_or_fetch(key(2), || async { Err(KasError::Unauthenticated("x".into())) }).await.unwrap_err();
        cache.get_or_fetch(key(3), || async { Ok(3) }).await.unwrap();
        cache.get_or_fetch(key(4), || async { Ok(4) }).await.unwrap();
        assert_eq!(cache.len(), 3);
        assert!(!cache.contains(&key(2)), "the entry expiring soonest was evicted");
        for n in 5..50 {
            cache.get_or_fetch(key(n), || async { Ok(0) }).await.unwrap();
            assert!(cache.len() <= 3);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_loaded_before_since_is_loaded_again_once() {
        let cache = Arc::new(TtlCache::<u32>::new(Duration::from_secs(60), Duration::from_secs(5), 10));
        let fetches = Arc::new(AtomicUsize::new(0));
        let fetch = |fetches: Arc<AtomicUsize>| async move {
            let n = fetches.fetch_add(1, Ordering::SeqCst) as u32;
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(n)
        };
        assert_eq!(cache.get_or_fetch(key(1), || fetch(fetches.clone())).await.unwrap(), 0);
        tokio::time::advance(Duration::from_secs(2)).await;
        // Something changed now: callers asking for answers since then share one new load.
        let since = Instant::now();
        let tasks: Vec<_> = (0..5)
            .map(|_| {
                let (cache, fetches) = (cache.clone(), fetches.clone());
                tokio::spawn(async move { cache.get_or_fetch_since(key(1), Some(since), || fetch(fetches)).await })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), 1);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        // Without `since` (or with an older one) the new answer is reused.
        assert_eq!(cache.get_or_fetch(key(1), || fetch(fetches.clone())).await.unwrap(), 1);
        let older = since - Duration::from_secs(1);
        assert_eq!(cache.get_or_fetch_since(key(1), Some(older), || fetch(fetches.clone())).await.unwrap(), 1);
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
    }
}
