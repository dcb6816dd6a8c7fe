//! kas's end of one tunnel: sends request frames, receives response frames, and checks both
//! against the shared [`FrameOrder`]. The tunnel is either a local agentk tunnel or a
//! `KasInternal.ForwardTunnel` stream to the kas that holds the agent's tunnel; callers cannot
//! tell the difference.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use kas_proto::flow::ResponseWindow;
use kas_proto::tunnel::pb::connect_response;
use kas_proto::tunnel::pb::{self, ConnectRequest, ConnectResponse, connect_request};
use kas_proto::tunnel::{FrameOrder, FrameOrderError, RequestFrame};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::Status;

use crate::error::KasError;

/// One item of a `Connect` response stream, boxed: tokio's channel allocates its first block of
/// 32 slots up front, and every idle tunnel holds one channel (2.3 KiB per idle tunnel with the
/// frame inline, 0.3 KiB boxed; the box costs one allocation per frame sent).
pub type ToAgentItem = Box<Result<ConnectResponse, Status>>;
/// The sending half of a `Connect` response stream (to agentk).
pub type ToAgent = mpsc::Sender<ToAgentItem>;
/// The sending half of a `ForwardTunnel` request stream (to the gateway kas).
pub type ToPeer = mpsc::Sender<ConnectResponse>;

#[derive(Clone, Debug)]
enum Outbound {
    Agent(ToAgent),
    Peer(ToPeer),
}

impl Outbound {
    /// Ends the tunnel with a status. Towards a peer the stream is simply dropped (a client
    /// cannot send a status); the gateway then drops the agent's tunnel.
    fn fail(&self, status: Status) {
        if let Self::Agent(tx) = self {
            let _ = tx.try_send(Box::new(Err(status)));
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Self::Agent(tx) => tx.is_closed(),
            Self::Peer(tx) => tx.is_closed(),
        }
    }

    /// Room for one frame; `Err` when the tunnel's sending side is gone.
    async fn reserve(&self) -> Result<OutboundPermit<'_>, ()> {
        match self {
            Self::Agent(tx) => tx.reserve().await.map(OutboundPermit::Agent).map_err(|_| ()),
            Self::Peer(tx) => tx.reserve().await.map(OutboundPermit::Peer).map_err(|_| ()),
        }
    }

    fn max_capacity(&self) -> usize {
        match self {
            Self::Agent(tx) => tx.max_capacity(),
            Self::Peer(tx) => tx.max_capacity(),
        }
    }

    /// Room for `n` frames at once (`n` at most the channel's capacity).
    async fn reserve_many(&self, n: usize) -> Result<Vec<OutboundPermit<'_>>, ()> {
        match self {
            Self::Agent(tx) => tx.reserve_many(n).await.map(|p| p.map(OutboundPermit::Agent).collect()).map_err(|_| ()),
            Self::Peer(tx) => tx.reserve_many(n).await.map(|p| p.map(OutboundPermit::Peer).collect()).map_err(|_| ()),
        }
    }
}

enum OutboundPermit<'a> {
    Agent(mpsc::Permit<'a, ToAgentItem>),
    Peer(mpsc::Permit<'a, ConnectResponse>),
}

impl OutboundPermit<'_> {
    fn send(self, frame: ConnectResponse) {
        match self {
            Self::Agent(permit) => permit.send(Box::new(Ok(frame))),
            Self::Peer(permit) => permit.send(frame),
        }
    }
}

type SharedOrder = Arc<Mutex<FrameOrder>>;

fn check(
    order: &SharedOrder,
    f: impl FnOnce(&mut FrameOrder) -> Result<(), FrameOrderError>,
) -> Result<(), FrameOrderError> {
    // Never held across an await; a poisoned lock still holds a consistent state machine.
    f(&mut order.lock().unwrap_or_else(PoisonError::into_inner))
}

fn lock(order: &SharedOrder) -> MutexGuard<'_, FrameOrder> {
    order.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct TunnelIo {
    sender: TunnelSender,
    receiver: TunnelReceiver,
}

/// Sends request frames (RequestInfo, Message, CloseSend, WindowUpdate).
pub struct TunnelSender {
    out: Outbound,
    order: SharedOrder,
    /// The other end takes `WindowUpdate` frames (agentk's Descriptor, or the peer kas's
    /// response header); towards one that does not, they are dropped.
    takes_window_updates: bool,
    /// This kas grants the response credit (announced in `RequestInfo`); off when it relays a
    /// routing kas's tunnel, whose own `RequestInfo` and `WindowUpdate`s pass through.
    grants: bool,
    _lifetime: Arc<Lifetime>,
}

/// What lives as long as either half of a tunnel: the "done" signal for the tunnel registry
/// and the concurrency permits of the request using it. When both halves are gone after an
/// exchange that ended cleanly, a reusable agentk tunnel goes back to the registry from here.
struct Lifetime {
    /// Cancels the stream's `ClosedSignal` when dropped; handed on to the next exchange's
    /// lifetime when the tunnel is reused (one watcher per agentk stream, not per request).
    done: Option<DropGuard>,
    permits: Mutex<Vec<tokio::sync::OwnedSemaphorePermit>>,
    /// Set when the request side failed (e.g. the caller's body broke): the response side stops.
    aborted: super::Tripwire,
    abort_reason: Mutex<Option<KasError>>,
    order: SharedOrder,
    /// This side ended the stream with a status (`Outbound::fail`): never reused.
    failed: AtomicBool,
    /// The response stream after the response ended, kept for the next exchange.
    rest: Mutex<Option<BoxStream<'static, Result<ConnectRequest, Status>>>>,
    /// Set for an agentk tunnel whose Descriptor says `reusable`, and for a forwarded tunnel
    /// whose gateway kas takes further exchanges.
    reuse: Mutex<Option<Reusable>>,
    /// A kept forwarded stream (see [`Replay`]): the request frames sent so far, while they can
    /// be sent again elsewhere.
    replay: Mutex<Option<Replay>>,
}

/// Finds another tunnel for a request whose kept forwarded stream failed before any response
/// frame: the router, with the target and deadline of the request.
#[async_trait::async_trait]
pub trait Reroute: Send + Sync {
    /// `failed`: how the kept stream ended. Never returns a kept stream.
    async fn reroute(&self, failed: &Status) -> Result<TunnelIo, KasError>;
}

/// What a request sent on a kept forwarded stream needs to be sent again. A kept stream has no
/// response headers to say its peer is alive before the request goes out (a fresh one does: a
/// hung or dead peer fails it before anything is sent, and the router tries elsewhere); so a
/// request sent whole on it (CloseSend included, at most [`REPLAY_LIMIT`] bytes of body: a GET,
/// a unary call) whose stream fails before any response frame is routed again, as it would have
/// been on a fresh stream. A larger or streaming request fails, as any request does when its
/// tunnel breaks.
struct Replay {
    reroute: Box<dyn Reroute>,
    /// `None` once the request outgrew [`REPLAY_LIMIT`].
    frames: Option<Vec<ConnectResponse>>,
    bytes: usize,
}

/// Body bytes of a request kept for sending again (one body message).
const REPLAY_LIMIT: usize = kas_proto::flow::MAX_CHUNK;

impl Replay {
    fn record(&mut self, frame: &ConnectResponse) {
        let Some(frames) = &mut self.frames else { return };
        match &frame.msg {
            // Credit belongs to the stream it was granted on.
            Some(connect_response::Msg::WindowUpdate(_)) => {}
            Some(connect_response::Msg::Message(m)) if self.bytes + m.data.len() > REPLAY_LIMIT => self.frames = None,
            msg => {
                if let Some(connect_response::Msg::Message(m)) = msg {
                    self.bytes += m.data.len();
                }
                frames.push(frame.clone());
            }
        }
    }
}

/// Where a tunnel goes after an exchange that ended cleanly both ways.
enum Reusable {
    /// Back into the tunnel registry (an agentk tunnel).
    Agent(Reuse),
    /// Back into the routing kas's idle forwarded tunnels.
    Peer {
        pool: Arc<super::forwards::IdleForwards>,
        key: super::forwards::ForwardKey,
        to_peer: ToPeer,
        response_credit: bool,
        /// Taken from the pool (not opened for this request).
        kept: bool,
    },
}

/// What a reusable agentk tunnel needs to be registered again.
pub(super) struct Reuse {
    pub registry: super::TunnelRegistry,
    pub agent_id: kas_proto::AgentId,
    pub connection_id: kas_proto::ConnectionId,
    pub methods: Arc<[String]>,
    pub to_agent: ToAgent,
    pub response_credit: bool,
    /// The tunnel's id in the registry, the same for every exchange it carries.
    pub id: u64,
}

impl Drop for Lifetime {
    fn drop(&mut self) {
        let Some(rest) = self.rest.get_mut().unwrap_or_else(PoisonError::into_inner).take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let reuse = self.reuse.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        let finished = !*self.failed.get_mut() && !self.aborted.is_tripped() && lock(&self.order).is_finished();
        match reuse {
            Some(Reusable::Agent(r)) if finished && !r.to_agent.is_closed() => {
                crate::metrics::tunnel_reused();
                let io = TunnelIo::new(
                    Outbound::Agent(r.to_agent.clone()),
                    rest,
                    FrameOrder::after_descriptor(),
                    self.done.take(),
                    r.response_credit,
                );
                r.registry.register_again(r.agent_id, r.connection_id, r.methods, io, r.to_agent, r.id);
            }
            Some(Reusable::Peer { pool, key, to_peer, response_credit, .. }) if finished && !to_peer.is_closed() => {
                pool.put(key, to_peer, rest, response_credit);
            }
            // Not reusable, or the exchange did not end cleanly: the stream ends (kas's side is
            // dropped with this tunnel) and agentk's side is read to its end, not reset.
            _ => {
                runtime.spawn(read_to_end(rest));
            }
        }
    }
}

/// Receives response frames (Header, Message, Trailer | Error).
pub struct TunnelReceiver {
    from: BoxStream<'static, Result<ConnectRequest, Status>>,
    out: Outbound,
    order: SharedOrder,
    /// Response credit granted as the reader takes the response (`kas_proto::flow`); `None`
    /// when the other end does not take it or this kas only relays.
    window: Option<ResponseWindow>,
    /// Data bytes of the last message returned, taken by the reader once it asks for the next.
    last_message: usize,
    /// Credit granted but not sent yet (the request side's channel was full).
    pending_credit: u32,
    /// The tunnel the request was sent on again after its kept stream failed (see [`Replay`]):
    /// the response comes from there.
    rerouted: Option<Box<(TunnelSender, TunnelReceiver)>>,
    /// How the stream failed, kept for [`Reroute`] (it tells a dead peer from a refusal).
    stream_failure: Option<Status>,
    _lifetime: Arc<Lifetime>,
}

impl std::fmt::Debug for TunnelIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelIo").field("order", &*lock(&self.sender.order)).finish_non_exhaustive()
    }
}

/// Resolves when agentk went away or the tunnel was used and dropped.
pub struct ClosedSignal {
    pub(super) to_agent: ToAgent,
    done: CancellationToken,
}

impl ClosedSignal {
    pub async fn closed(self) {
        tokio::select! {
            () = self.to_agent.closed() => {}
            () = self.done.cancelled() => {}
        }
        // Dropping our sender clone here lets the response stream end once the tunnel is done.
    }
}

/// A response as agentk sends it back for a unary call.
#[derive(Debug)]
pub struct UnaryResponse {
    pub header: BTreeMap<String, pb::MetadataValues>,
    pub body: Bytes,
}

impl TunnelIo {
    /// A local agentk tunnel; `order` must already have seen the Descriptor. Also returns the
    /// signal that tells the tunnel registry when to forget the tunnel.
    /// `response_credit`: agentk's Descriptor says it honours response credit.
    pub fn local(
        to_agent: ToAgent,
        from_agent: BoxStream<'static, Result<ConnectRequest, Status>>,
        order: FrameOrder,
        response_credit: bool,
    ) -> (Self, ClosedSignal) {
        let done = CancellationToken::new();
        let signal = ClosedSignal { to_agent: to_agent.clone(), done: done.clone() };
        (Self::new(Outbound::Agent(to_agent), from_agent, order, Some(done.drop_guard()), response_credit), signal)
    }

    /// A tunnel through another kas (its Descriptor was consumed there); `response_credit`: the
    /// peer relays `WindowUpdate` frames (`kas_proto::metadata::HOP_RESPONSE_CREDIT`).
    /// `reuse`: the gateway takes further exchanges on this stream (`HOP_REUSABLE`), and the
    /// pool it goes back to after one that ended cleanly.
    pub fn remote(
        to_peer: ToPeer,
        from_peer: BoxStream<'static, Result<ConnectRequest, Status>>,
        response_credit: bool,
        reuse: Option<(Arc<super::forwards::IdleForwards>, super::forwards::ForwardKey)>,
        kept: bool,
    ) -> Self {
        let io = Self::new(
            Outbound::Peer(to_peer.clone()),
            from_peer,
            FrameOrder::after_descriptor(),
            None,
            response_credit,
        );
        if let Some((pool, key)) = reuse {
            *io.sender._lifetime.reuse.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(Reusable::Peer { pool, key, to_peer, response_credit, kept });
        }
        io
    }

    /// This kas relays the tunnel for a routing kas, which grants the response credit itself:
    /// its `RequestInfo` and `WindowUpdate`s pass through unchanged.
    pub fn relay(&mut self) {
        self.sender.grants = false;
        self.receiver.window = None;
    }

    fn new(
        out: Outbound,
        from: BoxStream<'static, Result<ConnectRequest, Status>>,
        order: FrameOrder,
        done: Option<DropGuard>,
        response_credit: bool,
    ) -> Self {
        let order = Arc::new(Mutex::new(order));
        let lifetime = Arc::new(Lifetime {
            done,
            permits: Mutex::default(),
            aborted: super::Tripwire::new(),
            abort_reason: Mutex::default(),
            order: order.clone(),
            failed: AtomicBool::new(false),
            rest: Mutex::default(),
            reuse: Mutex::default(),
            replay: Mutex::default(),
        });
        Self {
            sender: TunnelSender {
                out: out.clone(),
                order: order.clone(),
                takes_window_updates: response_credit,
                grants: response_credit,
                _lifetime: lifetime.clone(),
            },
            receiver: TunnelReceiver {
                from,
                out,
                order,
                window: response_credit.then(ResponseWindow::new),
                last_message: 0,
                pending_credit: 0,
                rerouted: None,
                stream_failure: None,
                _lifetime: lifetime,
            },
        }
    }

    pub fn is_closed(&self) -> bool {
        self.sender.out.is_closed()
    }

    /// Lets this agentk tunnel carry another exchange once this one ended cleanly (agentk's
    /// Descriptor said `reusable`); it then registers itself again when both halves are dropped.
    pub(super) fn enable_reuse(&self, mut reuse: Reuse) {
        reuse.response_credit = self.sender.takes_window_updates;
        *self.sender._lifetime.reuse.lock().unwrap_or_else(PoisonError::into_inner) = Some(Reusable::Agent(reuse));
    }

    /// Whether this is a kept forwarded stream (taken from the idle forwards, not opened for this
    /// request).
    pub fn is_kept(&self) -> bool {
        matches!(
            *self.sender._lifetime.reuse.lock().unwrap_or_else(PoisonError::into_inner),
            Some(Reusable::Peer { kept: true, .. })
        )
    }

    /// Lets a request on a kept forwarded stream be routed again if the stream fails before any
    /// response frame (see [`Replay`]).
    pub fn enable_replay(&self, reroute: Box<dyn Reroute>) {
        *self.sender._lifetime.replay.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Replay { reroute, frames: Some(Vec::new()), bytes: 0 });
    }

    /// Keeps concurrency permits until the tunnel (both halves) is dropped: a streaming request
    /// counts against the limits for as long as it streams.
    pub fn hold(&self, permits: Vec<tokio::sync::OwnedSemaphorePermit>) {
        self.sender._lifetime.permits.lock().unwrap_or_else(PoisonError::into_inner).extend(permits);
    }

    pub fn split(self) -> (TunnelSender, TunnelReceiver) {
        (self.sender, self.receiver)
    }

    /// One request with one message, one response with one message.
    pub async fn unary(
        self,
        method: &str,
        metadata: BTreeMap<String, pb::MetadataValues>,
        body: Bytes,
    ) -> Result<UnaryResponse, KasError> {
        let (sender, mut receiver) = self.split();
        let info = pb::RequestInfo { method: method.to_owned(), metadata, response_window: 0 };
        sender
            .send_all(vec![
                ConnectResponse::request_info(info),
                ConnectResponse::message(body),
                ConnectResponse::close_send(),
            ])
            .await?;
        let mut header = BTreeMap::new();
        let mut body = None;
        loop {
            match receiver.recv().await? {
                None => return Err(KasError::Tunnel("agentk closed the tunnel before the response ended".into())),
                Some(connect_request::Msg::Header(h)) => header = h.metadata,
                Some(connect_request::Msg::Message(m)) => {
                    if body.replace(m.data).is_some() {
                        return Err(receiver.abort("more than one response message for a unary call"));
                    }
                }
                Some(connect_request::Msg::Trailer(_)) => break,
                Some(connect_request::Msg::Error(e)) => return Err(agent_error(e)),
                Some(connect_request::Msg::Descriptor(_)) => {
                    return Err(KasError::Internal("descriptor passed the frame-order check".into()));
                }
            }
        }
        let body = body.ok_or_else(|| receiver.abort("no response message for a unary call"))?;
        Ok(UnaryResponse { header, body })
    }
}

/// An `Error` frame from agentk as the caller sees it.
pub fn agent_error(e: pb::Error) -> KasError {
    let status = Status::from(e);
    KasError::AgentError { code: status.code(), message: status.message().to_owned() }
}

impl TunnelSender {
    /// Ends the exchange because the request side failed: agentk's tunnel ends with a status
    /// (which cancels the API server request) and the receiving side stops with an error.
    /// `error` is what the caller sees (e.g. OUT_OF_RANGE for a message over the limit).
    pub fn abort(&self, error: KasError) {
        self._lifetime.failed.store(true, Ordering::Release);
        self.out.fail(Status::cancelled(error.to_string()));
        *self._lifetime.abort_reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
        self._lifetime.aborted.trip();
    }

    /// Sends one frame (checked against the frame order first).
    pub async fn send(&self, mut frame: ConnectResponse) -> Result<(), KasError> {
        if !self.prepare(&mut frame) {
            return Ok(());
        }
        // Room first, then the order check and the send with no await between: a send cancelled
        // while waiting for room must not count as sent (a reusable tunnel would otherwise be
        // put back believing agentk got a CloseSend it never got).
        let permit = self.out.reserve().await.map_err(|()| KasError::Tunnel("the tunnel closed".into()))?;
        self.check(&frame)?;
        self.record(&frame);
        permit.send(frame);
        Ok(())
    }

    /// Keeps a copy of the frame while the request may be sent again (see [`Replay`]).
    fn record(&self, frame: &ConnectResponse) {
        if let Some(replay) = self._lifetime.replay.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            replay.record(frame);
        }
    }

    /// Sends frames together (at most [`kas_proto::flow::HOP_BUFFER`]): queued with no await
    /// between them, the stream's encoder takes them in one HTTP/2 write (a GET's RequestInfo,
    /// head and CloseSend). Each is checked against the frame order, as by [`Self::send`].
    pub async fn send_all(&self, mut frames: Vec<ConnectResponse>) -> Result<(), KasError> {
        frames.retain_mut(|frame| self.prepare(frame));
        if frames.len() > self.out.max_capacity() {
            for frame in frames {
                self.send(frame).await?;
            }
            return Ok(());
        }
        let permits =
            self.out.reserve_many(frames.len()).await.map_err(|()| KasError::Tunnel("the tunnel closed".into()))?;
        for (frame, permit) in frames.into_iter().zip(permits) {
            self.check(&frame)?;
            self.record(&frame);
            permit.send(frame);
        }
        Ok(())
    }

    /// Fills in what this kas adds to a frame; `false` for a frame the other end does not take.
    fn prepare(&self, frame: &mut ConnectResponse) -> bool {
        match &mut frame.msg {
            Some(connect_response::Msg::WindowUpdate(_)) => self.takes_window_updates,
            Some(connect_response::Msg::RequestInfo(info)) if self.grants => {
                info.response_window = kas_proto::flow::INITIAL_RESPONSE_WINDOW;
                true
            }
            _ => true,
        }
    }

    fn check(&self, frame: &ConnectResponse) -> Result<(), KasError> {
        check(&self.order, |o| frame.kind().and_then(|kind| o.request(kind)))
            .map_err(|e| KasError::InvalidArgument(e.to_string()))
    }
}

impl TunnelReceiver {
    /// Receives one frame; `None` when the stream ended. An out-of-order frame ends the tunnel
    /// with INVALID_ARGUMENT and is returned as an error.
    /// Asking for the next frame means the reader took the previous one: that grants response
    /// credit, sent while waiting for the next frame.
    pub async fn recv(&mut self) -> Result<Option<connect_request::Msg>, KasError> {
        if self.rerouted.is_some() {
            return self.recv_rerouted().await;
        }
        let failed = match self.recv_here().await {
            Err(KasError::Tunnel(failed)) => Err(KasError::Tunnel(failed)),
            Ok(None) => Ok(None),
            other => return other,
        };
        match self.replay_elsewhere().await {
            Some(Ok(())) => self.recv_rerouted().await,
            Some(Err(e)) => Err(e),
            None => failed,
        }
    }

    /// The response from the tunnel the request was sent on again.
    async fn recv_rerouted(&mut self) -> Result<Option<connect_request::Msg>, KasError> {
        let aborted = self._lifetime.aborted.clone();
        let Some(rerouted) = self.rerouted.as_mut() else {
            return Err(KasError::Internal("no rerouted tunnel".into()));
        };
        tokio::select! {
            biased;
            () = aborted.tripped() => {
                let error = self._lifetime.abort_reason.lock().unwrap_or_else(PoisonError::into_inner).clone();
                Err(error.unwrap_or_else(|| KasError::InvalidArgument("the request was aborted".into())))
            }
            // Boxed: a rerouted tunnel's receiver is a receiver too (it never reroutes again).
            next = Box::pin(rerouted.1.recv()) => next,
        }
    }

    /// After this kept stream failed: the request sent again through another tunnel, if it was
    /// sent whole and nothing of the response came (`None`: it cannot be).
    async fn replay_elsewhere(&mut self) -> Option<Result<(), KasError>> {
        let replay = {
            let mut replay = self._lifetime.replay.lock().unwrap_or_else(PoisonError::into_inner);
            let complete = replay.as_ref().is_some_and(|r| r.frames.is_some())
                && !self._lifetime.failed.load(Ordering::Acquire)
                && lock(&self.order).is_request_closed()
                && lock(&self.order).is_awaiting_header();
            if !complete {
                return None;
            }
            replay.take()?
        };
        let frames = replay.frames?;
        let failed = self.stream_failure.take().unwrap_or_else(|| Status::unavailable("the kept stream ended"));
        tracing::debug!(error = %failed.message(), "a kept forwarded stream failed before the response; routing the request again");
        crate::metrics::forward_rerouted();
        let io = match replay.reroute.reroute(&failed).await {
            Ok(io) => io,
            Err(e) => return Some(Err(e)),
        };
        let (sender, receiver) = io.split();
        if let Err(e) = sender.send_all(frames).await {
            return Some(Err(e));
        }
        self._lifetime.failed.store(true, Ordering::Release);
        self.rerouted = Some(Box::new((sender, receiver)));
        Some(Ok(()))
    }

    async fn recv_here(&mut self) -> Result<Option<connect_request::Msg>, KasError> {
        if let Some(window) = &mut self.window
            && self.last_message > 0
        {
            let credit = window.consumed(std::mem::take(&mut self.last_message)).unwrap_or(0);
            self.pending_credit = self.pending_credit.saturating_add(credit);
        }
        let next = loop {
            tokio::select! {
                biased;
                () = self._lifetime.aborted.tripped() => {
                    let error = self._lifetime.abort_reason.lock().unwrap_or_else(PoisonError::into_inner).clone();
                    return Err(error.unwrap_or_else(|| KasError::InvalidArgument("the request was aborted".into())));
                }
                permit = self.out.reserve(), if self.pending_credit > 0 => {
                    let credit = std::mem::take(&mut self.pending_credit);
                    if let Ok(permit) = permit
                        && check(&self.order, |o| o.request(RequestFrame::WindowUpdate)).is_ok()
                    {
                        permit.send(ConnectResponse::window_update(credit));
                    }
                }
                next = self.from.next() => break next,
            }
        };
        let frame = match next {
            None => return Ok(None),
            Some(Err(status)) => {
                let error = stream_error(&status);
                self.stream_failure = Some(status);
                return Err(error);
            }
            Some(Ok(frame)) => frame,
        };
        if let Err(violation) = check(&self.order, |o| frame.kind().and_then(|kind| o.response(kind))) {
            self._lifetime.failed.store(true, Ordering::Release);
            self.out.fail(violation.clone().into());
            tracing::warn!(error = %violation, "agentk broke the tunnel protocol");
            return Err(KasError::Tunnel(violation.to_string()));
        }
        if let Some(connect_request::Msg::Message(m)) = &frame.msg {
            self.last_message = m.data.len();
        }
        if lock(&self.order).is_done() {
            // The response ended. A reusable tunnel's stream carries the next exchange: the
            // lifetime keeps it until both halves are gone. Otherwise its own end (agentk's
            // END_STREAM, the gateway's gRPC trailers) follows at once and is read elsewhere
            // (see `read_to_end`).
            let rest = std::mem::replace(&mut self.from, futures::stream::empty().boxed());
            if self._lifetime.reuse.lock().unwrap_or_else(PoisonError::into_inner).is_some() {
                *self._lifetime.rest.lock().unwrap_or_else(PoisonError::into_inner) = Some(rest);
            } else {
                tokio::spawn(read_to_end(rest));
            }
        }
        Ok(frame.msg)
    }

    /// Whether the response has ended (Trailer or Error seen).
    pub fn is_done(&self) -> bool {
        match &self.rerouted {
            Some(rerouted) => rerouted.1.is_done(),
            None => lock(&self.order).is_done(),
        }
    }

    fn abort(&self, why: &str) -> KasError {
        self._lifetime.failed.store(true, Ordering::Release);
        self.out.fail(Status::invalid_argument(why.to_owned()));
        KasError::Tunnel(why.to_owned())
    }
}

/// How long the other end's end of a tunnel stream is waited for once the exchange ended (it
/// follows at once from a well-behaved peer).
const STREAM_END_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads what is left of a tunnel stream (gRPC, either direction) to its end, within
/// [`STREAM_END_WAIT`]. Dropping a stream before its end makes HTTP/2 reset it, and at thousands
/// of requests a second the frames arriving on reset streams h2 no longer remembers count as
/// errors until h2 closes the whole connection ("locally-reset streams reached limit").
pub async fn read_to_end<T, E>(mut rest: impl futures::Stream<Item = Result<T, E>> + Unpin) {
    let _ = tokio::time::timeout(STREAM_END_WAIT, async { while let Some(Ok(_)) = rest.next().await {} }).await;
}

/// A failed tunnel stream (agentk went away, or the gateway kas ended the forwarded stream; agent
/// errors travel as `Error` frames, not as stream statuses).
fn stream_error(status: &Status) -> KasError {
    KasError::Tunnel(format!("tunnel stream failed: {}", status.message()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A tunnel as kas holds it after agentk's Descriptor: the channel to agentk (capacity 1)
    /// and what agentk sends.
    fn tunnel() -> (TunnelIo, mpsc::Receiver<ToAgentItem>) {
        tunnel_with_room(1)
    }

    fn tunnel_with_room(frames: usize) -> (TunnelIo, mpsc::Receiver<ToAgentItem>) {
        let (to_agent, from_kas) = mpsc::channel(frames);
        let mut order = FrameOrder::new();
        order.response(kas_proto::tunnel::ResponseFrame::Descriptor).unwrap();
        let (io, _closed) = TunnelIo::local(to_agent, futures::stream::pending().boxed(), order, true);
        (io, from_kas)
    }

    /// The kas -> kas 502s of issue 14: a send cancelled while it waited for room must not count
    /// as sent, or a reused tunnel believes agentk got a CloseSend it never got.
    #[tokio::test]
    async fn a_send_cancelled_while_waiting_for_room_is_not_counted() {
        let (io, mut from_kas) = tunnel();
        let (sender, _receiver) = io.split();
        sender.send(ConnectResponse::request_info(pb::RequestInfo::default())).await.unwrap();
        // The channel is full now: CloseSend waits for room, and gives up.
        let waited = tokio::time::timeout(Duration::from_millis(50), sender.send(ConnectResponse::close_send())).await;
        assert!(waited.is_err(), "the send should still be waiting for room");
        assert!(!lock(&sender.order).is_finished() && !format!("{:?}", lock(&sender.order)).contains("Closed"));
        // Once there is room, CloseSend goes out and is counted.
        assert!(from_kas.recv().await.is_some());
        sender.send(ConnectResponse::close_send()).await.unwrap();
        assert!(format!("{:?}", lock(&sender.order)).contains("Closed"), "{:?}", lock(&sender.order));
        let frame = from_kas.recv().await.unwrap().unwrap();
        assert!(matches!(frame.msg, Some(connect_response::Msg::CloseSend(_))));
    }

    /// A GET's frames are queued together (one HTTP/2 write); where the channel has less room
    /// than that, they go one by one, in order.
    #[tokio::test]
    async fn frames_sent_together_are_queued_together() {
        let frames = || {
            vec![
                ConnectResponse::request_info(pb::RequestInfo::default()),
                ConnectResponse::message(Bytes::from_static(b"head")),
                ConnectResponse::close_send(),
            ]
        };
        let kind = |f: Option<ToAgentItem>| format!("{:?}", f.unwrap().unwrap().kind().unwrap());
        let (io, mut from_kas) = tunnel_with_room(kas_proto::flow::HOP_BUFFER);
        let (sender, _receiver) = io.split();
        sender.send_all(frames()).await.unwrap();
        let queued: Vec<_> = std::iter::from_fn(|| from_kas.try_recv().ok()).map(|f| kind(Some(f))).collect();
        assert_eq!(queued, ["RequestInfo", "Message", "CloseSend"]);
        assert!(format!("{:?}", lock(&sender.order)).contains("Closed"), "{:?}", lock(&sender.order));

        let (io, mut from_kas) = tunnel_with_room(1);
        let (sender, _receiver) = io.split();
        let send = tokio::spawn(async move { sender.send_all(frames()).await });
        let mut received = Vec::new();
        for _ in 0..3 {
            received.push(kind(from_kas.recv().await));
        }
        send.await.unwrap().unwrap();
        assert_eq!(received, ["RequestInfo", "Message", "CloseSend"]);
    }
}
