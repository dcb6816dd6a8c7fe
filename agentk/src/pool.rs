//! The tunnel pool of one kas connection: keeps idle tunnels open (at least `min_idle`, more
//! under load, see `IdleTarget`; at most `max` in total) and replaces a tunnel as soon as it
//! takes a request, off the request's path.
//! The pool task alone decides what to open. The counts live in the published `PoolStats`: a
//! tunnel updates them itself as it takes a request and comes back, and wakes the pool task only
//! when the pool may have to act (idle tunnels below the target, or the target to grow), not
//! twice per request (issue 14: a reused tunnel serves thousands of requests a second).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kas_proto::ConnectionId;
use kas_proto::tunnel::pb::{self, ConnectRequest};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Channel;

use crate::backoff::Backoff;
use crate::modules::Module;
use crate::tunnel;
use crate::tunnel_codec::{self, Outbound};

/// Frames buffered towards kas per tunnel (each at most one body chunk); HTTP/2 flow control
/// does the rest.
const TUNNEL_SEND_BUFFER: usize = kas_proto::flow::HOP_BUFFER;
/// The idle target grows under load up to this (and never past half of the tunnel maximum).
const IDLE_GROWTH_CAP: usize = 64;
/// After this long without running out of idle tunnels, the idle target halves again. Extra
/// idle tunnels are closed by kas (`agent_connections.idle_tunnel_timeout`, only kas closes idle
/// tunnels of a live connection); the pool then opens no more than the target.
pub const DEFAULT_IDLE_QUIET_PERIOD: Duration = Duration::from_secs(30);
/// After a connection ended, how long its idle tunnels wait for kas to close them.
pub const IDLE_LINGER: Duration = Duration::from_secs(2);

/// How many idle tunnels to keep. One tunnel carries one request at a time, so a burst of concurrent
/// requests drains a small pool and each request then waits for a tunnel to open. The target
/// follows the concurrency seen: at least as many idle tunnels as are in use (capped), and it
/// halves back towards `min_idle` after a quiet period, so quiet agents hold few streams.
#[derive(Debug, Clone)]
struct IdleTarget {
    min: usize,
    cap: usize,
    current: usize,
    changed_at: tokio::time::Instant,
    quiet_period: Duration,
}

impl IdleTarget {
    fn new(min: usize, max_tunnels: usize, quiet_period: Duration) -> Self {
        let cap = IDLE_GROWTH_CAP.min(max_tunnels / 2).max(min);
        Self { min, cap, current: min, changed_at: tokio::time::Instant::now(), quiet_period }
    }

    /// A tunnel got a request; `in_use` tunnels are now serving requests.
    fn on_busy(&mut self, in_use: usize) {
        let wanted = in_use.min(self.cap);
        if wanted > self.current {
            self.current = wanted;
            self.changed_at = tokio::time::Instant::now();
        }
    }

    fn get(&mut self) -> usize {
        let now = tokio::time::Instant::now();
        while self.current > self.min && now.duration_since(self.changed_at) >= self.quiet_period {
            self.current = (self.current / 2).max(self.min);
            self.changed_at += self.quiet_period;
        }
        self.current
    }
}

#[derive(Clone)]
pub struct PoolContext {
    pub channel: Channel,
    pub token: Arc<str>,
    pub connection_id: ConnectionId,
    pub modules: Arc<[Arc<dyn Module>]>,
    /// No new tunnels: the connection ended (kas closes the idle ones it holds).
    pub stop_opening: CancellationToken,
    /// Ends idle tunnels (the linger after the connection ended is over).
    pub stop_idle: CancellationToken,
    /// Ends in-use tunnels too (grace period over).
    pub stop_all: CancellationToken,
    /// Tracks in-use tunnels, so shutdown can wait for them.
    pub in_flight: TaskTracker,
    pub min_idle: usize,
    pub max: usize,
    /// See [`DEFAULT_IDLE_QUIET_PERIOD`].
    pub idle_quiet_period: Duration,
    /// Published counts (readiness, tests).
    pub stats: watch::Sender<PoolStats>,
}

pub use crate::status::PoolStats;

/// Why a tunnel wakes the pool task (it has updated the counts itself).
enum Event {
    /// A tunnel got a request and the pool may have to open another (or grow its target).
    Busy,
    /// A tunnel ended while idle; `failed` when it could not be opened or kas rejected it.
    EndedIdle { failed: bool },
    /// A tunnel ended after a request.
    EndedBusy,
}

/// What tunnel tasks share with the pool task.
struct Shared {
    events: mpsc::UnboundedSender<Event>,
    /// The idle target as the pool task last computed it: a tunnel that takes a request wakes
    /// the pool only when the idle tunnels fall below it or the tunnels in use pass it.
    target: AtomicUsize,
}

pub async fn run(ctx: PoolContext) {
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared { events: events_tx, target: AtomicUsize::new(ctx.min_idle) });
    // Opening failures back off so a kas that rejects tunnels is not hammered.
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(5));
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut target = IdleTarget::new(ctx.min_idle, ctx.max, ctx.idle_quiet_period);
    loop {
        if retry_at.is_none_or(|t| t <= tokio::time::Instant::now()) {
            retry_at = None;
            let want = if ctx.stop_opening.is_cancelled() { 0 } else { target.get() };
            shared.target.store(want, Ordering::Relaxed);
            loop {
                let PoolStats { idle, in_use } = *ctx.stats.borrow();
                if idle >= want || idle + in_use >= ctx.max {
                    break;
                }
                ctx.stats.send_modify(|s| s.idle += 1);
                spawn_tunnel(ctx.clone(), shared.clone());
            }
        }
        let sleep_until = retry_at.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            () = ctx.stop_idle.cancelled() => break,
            () = tokio::time::sleep_until(sleep_until), if retry_at.is_some() => {}
            ev = events.recv() => match ev {
                Some(Event::Busy) => {
                    target.on_busy(ctx.stats.borrow().in_use);
                    backoff.reset();
                }
                Some(Event::EndedIdle { failed }) => {
                    if failed {
                        retry_at = Some(tokio::time::Instant::now() + backoff.next_delay());
                    }
                }
                Some(Event::EndedBusy) => {}
                None => break,
            },
        }
    }
    // Not reset here: this connection's idle tunnels count themselves out as they end (on
    // `stop_idle`), also when the next connection's pool has started counting its own.
}

fn spawn_tunnel(ctx: PoolContext, shared: Arc<Shared>) {
    tokio::spawn(async move {
        let outcome = open_and_serve(&ctx, &shared).await;
        // Waiters for `idle == 0` (the end of the connection) are told when it gets there.
        ctx.stats.send_if_modified(|s| {
            match outcome {
                Event::EndedIdle { .. } => s.idle = s.idle.saturating_sub(1),
                _ => s.in_use = s.in_use.saturating_sub(1),
            }
            s.idle == 0
        });
        let _ = shared.events.send(outcome);
    });
}

/// A tunnel took a request: counted, and the pool woken if it may have to open another.
fn took_request(stats: &watch::Sender<PoolStats>, shared: &Shared) {
    let mut counts = PoolStats::default();
    stats.send_if_modified(|s| {
        s.idle = s.idle.saturating_sub(1);
        s.in_use += 1;
        counts = *s;
        s.idle == 0
    });
    let target = shared.target.load(Ordering::Relaxed);
    if counts.idle < target || counts.in_use > target {
        let _ = shared.events.send(Event::Busy);
    }
}

/// A tunnel finished a request and waits for the next one (kas reuses it): counted, no wakeup.
fn back_to_idle(stats: &watch::Sender<PoolStats>) {
    stats.send_if_modified(|s| {
        s.in_use = s.in_use.saturating_sub(1);
        s.idle += 1;
        s.idle == 1
    });
}

fn authorized<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Ok(v) = format!("Bearer {token}").parse() {
        req.metadata_mut().insert(kas_proto::metadata::AUTHORIZATION, v);
    }
    req
}

async fn open_and_serve(ctx: &PoolContext, shared: &Shared) -> Event {
    let methods: Vec<String> = ctx.modules.iter().flat_map(|m| m.methods().iter().map(|s| (*s).to_owned())).collect();
    let (outbound, rx) = mpsc::channel::<Outbound>(TUNNEL_SEND_BUFFER);
    let descriptor =
        pb::Descriptor { connection_id: ctx.connection_id.0, methods, response_credit: true, reusable: true };
    if outbound.try_send(ConnectRequest::descriptor(descriptor).into()).is_err() {
        return Event::EndedIdle { failed: true };
    }
    let opened = tokio::select! {
        () = ctx.stop_idle.cancelled() => return Event::EndedIdle { failed: false },
        r = tunnel_codec::connect(ctx.channel.clone(), authorized(ReceiverStream::new(rx), &ctx.token)) => r,
    };
    let inbound = match opened {
        Ok(r) => r.into_inner(),
        Err(status) => {
            tracing::debug!(code = ?status.code(), error = %status.message(), "opening a tunnel failed");
            return Event::EndedIdle { failed: true };
        }
    };
    let mut exchanges = tunnel::start(inbound, outbound);
    // Whether this tunnel has served a request: kas may then send it the next one at any time.
    let mut served = false;
    loop {
        let next = if served && ctx.stop_idle.is_cancelled() {
            // Idle tunnels were let go while this one served a request. kas reuses a tunnel as
            // soon as its exchange ended, and lets go of the connection's tunnels only a moment
            // after it ended the connection, so a request may be on its way: this tunnel waits
            // for kas to end it (or for that request), as idle tunnels did (issue 14: a request
            // was lost this way under `agent_connections.max_age`).
            match tokio::time::timeout(IDLE_LINGER, exchanges.recv()).await {
                Ok(next) => next,
                Err(_) => return Event::EndedIdle { failed: false },
            }
        } else {
            tokio::select! {
                // A request kas already sent is served rather than dropped.
                biased;
                next = exchanges.recv() => next,
                () = ctx.stop_idle.cancelled() => return Event::EndedIdle { failed: false },
            }
        };
        let (mut request, responder) = match next {
            Some(Ok(exchange)) => exchange,
            // kas closed an idle tunnel (it is shutting down, or the tunnel idled out).
            None => return Event::EndedIdle { failed: false },
            Some(Err(status)) => {
                tracing::debug!(code = ?status.code(), error = %status.message(), "idle tunnel ended");
                return Event::EndedIdle { failed: status.code() != tonic::Code::Cancelled };
            }
        };
        took_request(&ctx.stats, shared);
        served = true;
        tracing::debug!(
            request_id = kas_proto::metadata::request_id(&request.metadata).unwrap_or_default(),
            method = %request.method,
            connection_id = %ctx.connection_id,
            "serving a request"
        );
        // A handful of modules: a scan costs less than building a map per tunnel.
        let module = ctx.modules.iter().find(|m| m.methods().contains(&request.method.as_str())).cloned();
        let method = request.method.clone();
        let stop_all = ctx.stop_all.clone();
        let reusable = ctx
            .in_flight
            .track_future(async move {
                let serve = async {
                    match module {
                        Some(module) => module.handle(&mut request, &responder).await,
                        None => {
                            let status = tonic::Status::unimplemented(format!("agentk does not serve {method}"));
                            let _ = responder.error(&status).await;
                        }
                    }
                    let response_ended = responder.is_done();
                    drop(responder);
                    // An exchange that ended cleanly both ways leaves the tunnel ready for the
                    // next one; otherwise wait for kas to end the tunnel.
                    if response_ended && request.drain_to_close_send().await {
                        return true;
                    }
                    request.finish().await;
                    false
                };
                tokio::select! {
                    reusable = serve => reusable,
                    () = stop_all.cancelled() => {
                        tracing::warn!(%method, "request cancelled: shutdown grace period over");
                        false
                    }
                }
            })
            .await;
        if !reusable {
            return Event::EndedBusy;
        }
        back_to_idle(&ctx.stats);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reused tunnel counts itself busy and idle again without waking the pool task, until
    /// the idle tunnels fall below the target (or those in use pass it): then the pool is woken
    /// to open another.
    #[test]
    fn a_tunnel_wakes_the_pool_only_when_it_may_have_to_open_one() {
        let (events, mut woken) = mpsc::unbounded_channel();
        let shared = Shared { events, target: AtomicUsize::new(2) };
        let (stats, counts) = watch::channel(PoolStats { idle: 4, in_use: 0 });
        took_request(&stats, &shared);
        assert_eq!(*counts.borrow(), PoolStats { idle: 3, in_use: 1 });
        back_to_idle(&stats);
        assert_eq!(*counts.borrow(), PoolStats { idle: 4, in_use: 0 });
        took_request(&stats, &shared);
        took_request(&stats, &shared);
        assert_eq!(*counts.borrow(), PoolStats { idle: 2, in_use: 2 });
        assert!(woken.try_recv().is_err(), "at the target: nothing to open");
        took_request(&stats, &shared);
        assert_eq!(*counts.borrow(), PoolStats { idle: 1, in_use: 3 });
        assert!(matches!(woken.try_recv(), Ok(Event::Busy)), "below the target: the pool is woken");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_target_grows_under_load_and_shrinks_when_quiet() {
        let mut t = IdleTarget::new(2, 500, DEFAULT_IDLE_QUIET_PERIOD);
        assert_eq!(t.get(), 2);
        t.on_busy(1); // below the minimum: no change
        assert_eq!(t.get(), 2);
        for (in_use, expected) in [(5, 5), (16, 16), (3, 16), (200, 64)] {
            t.on_busy(in_use);
            assert_eq!(t.get(), expected, "in use {in_use}");
        }
        tokio::time::advance(DEFAULT_IDLE_QUIET_PERIOD).await;
        assert_eq!(t.get(), 32);
        tokio::time::advance(DEFAULT_IDLE_QUIET_PERIOD * 10).await;
        assert_eq!(t.get(), 2);
        // A small maximum caps growth at half of it, never below the minimum.
        let mut small = IdleTarget::new(2, 6, DEFAULT_IDLE_QUIET_PERIOD);
        small.on_busy(6);
        assert_eq!(small.get(), 3);
    }
}
