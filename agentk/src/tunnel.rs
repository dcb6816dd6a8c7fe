//! agentk's end of one tunnel: receives the request frames and sends the response frames, both
//! checked against the shared [`FrameOrder`] (the same state machine kas uses).
//!
//! One task per tunnel reads what kas sends ([`read_frames`]), for every exchange the tunnel
//! carries (a tunnel is reusable: see `kas_proto::tunnel`): response credit
//! (`WindowUpdate`, see `kas_proto::flow`) must arrive while a module waits for it to send, and
//! the module may not be reading the request body then. Request frames are read ahead of the
//! module up to [`REQUEST_READ_AHEAD`] bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use kas_proto::tunnel::pb::{self, ConnectRequest, ConnectResponse, connect_response};
use kas_proto::tunnel::{FrameOrder, FrameOrderError, RequestFrame, ResponseFrame};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::{Status, Streaming};

/// Request body bytes read from the tunnel ahead of the module. Response credit that kas sends
/// behind more than this (a module that neither reads the request body nor can send) waits
/// until the module reads.
pub const REQUEST_READ_AHEAD: usize = 1024 * 1024;

type SharedOrder = Arc<Mutex<FrameOrder>>;

fn check(
    order: &SharedOrder,
    f: impl FnOnce(&mut FrameOrder) -> Result<(), FrameOrderError>,
) -> Result<(), FrameOrderError> {
    // Never held across an await; a poisoned lock still holds a consistent state machine.
    let mut guard = order.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut guard)
}

/// A request frame as the reader task hands it on.
enum Inbound {
    /// Body data, holding its share of the read-ahead until the module takes it.
    Message(Bytes, OwnedSemaphorePermit),
    CloseSend,
}

/// The request kas sent, as a module sees it.
pub struct TunnelRequest {
    pub method: String,
    pub metadata: HashMap<String, pb::MetadataValues>,
    inbound: mpsc::UnboundedReceiver<Result<Inbound, Status>>,
    close_send_seen: bool,
}

/// Sends the response frames back to kas.
pub struct Responder {
    outbound: mpsc::Sender<ConnectRequest>,
    order: SharedOrder,
    credit: Arc<SendCredit>,
}

/// Response credit, the sending side: bytes of `Message` data agentk may still send.
struct SendCredit {
    /// kas grants credit (`RequestInfo.response_window` > 0) and it is still applied.
    limited: AtomicBool,
    available: AtomicI64,
    /// kas ended the tunnel: no more credit will come.
    ended: AtomicBool,
    changed: tokio::sync::Notify,
}

impl SendCredit {
    fn grant(&self, bytes: u32) {
        self.available.fetch_add(i64::from(bytes), Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }
}

/// One request on a tunnel: what the module reads and how it answers.
pub type Exchange = (TunnelRequest, Responder);

/// Starts the task that reads everything kas sends on a tunnel whose Descriptor was sent, and
/// returns the exchanges it starts: one per `RequestInfo` (a reusable tunnel carries the next
/// once the previous ended cleanly). A stream error while no exchange is open comes as an
/// error item; the end of the stream closes the channel.
pub fn start(
    inbound: Streaming<ConnectResponse>,
    outbound: mpsc::Sender<ConnectRequest>,
) -> mpsc::Receiver<Result<Exchange, Status>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(read_frames(inbound, outbound, tx));
    rx
}

/// The exchange the reader is feeding.
struct Current {
    order: SharedOrder,
    credit: Arc<SendCredit>,
    tx: mpsc::UnboundedSender<Result<Inbound, Status>>,
    read_ahead: Arc<Semaphore>,
}

impl Current {
    fn new(info: pb::RequestInfo, order: FrameOrder, outbound: &mpsc::Sender<ConnectRequest>) -> (Self, Exchange) {
        let order = Arc::new(Mutex::new(order));
        let credit = Arc::new(SendCredit {
            limited: AtomicBool::new(info.response_window > 0),
            available: AtomicI64::new(i64::from(info.response_window)),
            ended: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let request =
            TunnelRequest { method: info.method, metadata: info.metadata, inbound: rx, close_send_seen: false };
        let responder = Responder { outbound: outbound.clone(), order: order.clone(), credit: credit.clone() };
        let current = Self { order, credit, tx, read_ahead: Arc::new(Semaphore::new(REQUEST_READ_AHEAD)) };
        (current, (request, responder))
    }

    fn finished(&self) -> bool {
        self.order.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_finished()
    }
}

/// Reads kas's frames until the stream ends or the serve loop is gone: `RequestInfo` starts an
/// exchange, credit goes to its responder at once, request frames to its module (body data
/// within [`REQUEST_READ_AHEAD`]). The stream lives as long as this task: dropping it earlier
/// would reset the stream, and a reset discards response frames kas has not read yet.
async fn read_frames(
    mut inbound: Streaming<ConnectResponse>,
    outbound: mpsc::Sender<ConnectRequest>,
    exchanges: mpsc::Sender<Result<Exchange, Status>>,
) {
    let mut current: Option<Current> = None;
    loop {
        let next = tokio::select! {
            next = inbound.message() => next,
            () = exchanges.closed() => break,
        };
        let frame = match next {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(status) => {
                match current.as_ref().filter(|c| !c.finished()) {
                    Some(c) => drop(c.tx.send(Err(status))),
                    None => drop(exchanges.send(Err(status)).await),
                }
                break;
            }
        };
        let kind = match frame.kind() {
            Ok(kind) => kind,
            Err(violation) => {
                fail(current.as_ref(), &exchanges, violation).await;
                break;
            }
        };
        if kind == RequestFrame::RequestInfo && current.as_ref().is_none_or(Current::finished) {
            let Some(connect_response::Msg::RequestInfo(info)) = frame.msg else { break };
            let mut order = FrameOrder::after_descriptor();
            if let Err(violation) = order.request(kind) {
                fail(None, &exchanges, violation).await;
                break;
            }
            if let Some(previous) = current.take() {
                previous.credit.end();
            }
            let (next, exchange) = Current::new(info, order, &outbound);
            if exchanges.send(Ok(exchange)).await.is_err() {
                break;
            }
            current = Some(next);
            continue;
        }
        let Some(c) = current.as_ref() else {
            // Before the first RequestInfo: a fresh order names the violation.
            let violation = FrameOrder::after_descriptor().request(kind).err();
            let violation = violation.unwrap_or(FrameOrderError { frame: "frame", state: "before RequestInfo" });
            fail(None, &exchanges, violation).await;
            break;
        };
        if let Err(violation) = check(&c.order, |o| o.request(kind)) {
            fail(Some(c), &exchanges, violation).await;
            break;
        }
        // A module that stopped reading (it answered already) is not sent more; the exchange's
        // frames are still read, so the tunnel can carry the next one.
        let item = match frame.msg {
            Some(connect_response::Msg::WindowUpdate(update)) => {
                c.credit.grant(update.bytes);
                continue;
            }
            Some(connect_response::Msg::Message(m)) => {
                let share = u32::try_from(m.data.len().min(REQUEST_READ_AHEAD)).unwrap_or(u32::MAX);
                let permit = tokio::select! {
                    permit = c.read_ahead.clone().acquire_many_owned(share) => permit,
                    () = c.tx.closed() => continue,
                    () = exchanges.closed() => break,
                };
                let Ok(permit) = permit else { break };
                Inbound::Message(m.data, permit)
            }
            Some(connect_response::Msg::CloseSend(_)) => Inbound::CloseSend,
            _ => {
                let _ = c.tx.send(Err(Status::invalid_argument("unexpected frame in the request body")));
                break;
            }
        };
        let _ = c.tx.send(Ok(item));
    }
    if let Some(c) = current {
        c.credit.end();
    }
}

/// A protocol violation ends the tunnel: the open exchange's module sees it, or else the serve
/// loop does.
async fn fail(
    current: Option<&Current>,
    exchanges: &mpsc::Sender<Result<Exchange, Status>>,
    violation: FrameOrderError,
) {
    match current.filter(|c| !c.finished()) {
        Some(c) => drop(c.tx.send(Err(violation.into()))),
        None => drop(exchanges.send(Err(violation.into())).await),
    }
}

impl TunnelRequest {
    /// The next body message; `None` after CloseSend.
    pub async fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        match self.inbound.recv().await {
            None => Err(Status::cancelled("kas ended the tunnel before CloseSend")),
            Some(Err(status)) => Err(status),
            Some(Ok(Inbound::Message(data, _read_ahead))) => Ok(Some(data)),
            Some(Ok(Inbound::CloseSend)) => {
                self.close_send_seen = true;
                Ok(None)
            }
        }
    }

    /// Waits until kas ends the tunnel (or starts the next exchange on it), discarding request
    /// frames: after CloseSend, the sign that the caller is gone.
    pub async fn finish(&mut self) {
        while let Some(Ok(_)) = self.inbound.recv().await {}
    }

    /// Reads (and discards) the rest of the request up to its CloseSend; `false` when the tunnel
    /// ended first. The exchange is then over on agentk's side if its response ended too.
    pub async fn drain_to_close_send(&mut self) -> bool {
        while !self.close_send_seen {
            match self.next_message().await {
                Ok(Some(_)) => {}
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
        true
    }

    /// Exactly one body message followed by CloseSend (unary calls).
    pub async fn unary_body(&mut self) -> Result<Bytes, Status> {
        let body =
            self.next_message().await?.ok_or_else(|| Status::invalid_argument("unary request without a message"))?;
        if self.next_message().await?.is_some() {
            return Err(Status::invalid_argument("unary request with more than one message"));
        }
        Ok(body)
    }
}

impl Responder {
    async fn send(&self, frame: ConnectRequest, kind: ResponseFrame) -> Result<(), Status> {
        // Room first, then the order check and the send with no await between: a send cancelled
        // while waiting must not count as sent (the tunnel would look reusable).
        let permit = self.outbound.reserve().await.map_err(|_| Status::cancelled("tunnel closed"))?;
        check(&self.order, |o| o.response(kind))?;
        permit.send(frame);
        Ok(())
    }

    pub async fn header(&self, metadata: HashMap<String, pb::MetadataValues>) -> Result<(), Status> {
        self.send(ConnectRequest::header(pb::Header { metadata }), ResponseFrame::Header).await
    }

    /// Sends one body message once there is response credit (a message may take the credit
    /// below zero; the next one waits for kas to grant more).
    pub async fn message(&self, data: Bytes) -> Result<(), Status> {
        if self.wait_for_credit().await?.is_some() {
            let len = i64::try_from(data.len()).unwrap_or(i64::MAX);
            self.credit.available.fetch_sub(len, Ordering::AcqRel);
        }
        self.send(ConnectRequest::message(data), ResponseFrame::Message).await
    }

    /// How much body to put into the next message: at most `max`, and no more than the credit
    /// (waiting for some). Streams split their data by it, so a reader that stopped leaves
    /// small messages in flight.
    pub async fn next_message_size(&self, max: usize) -> Result<usize, Status> {
        Ok(match self.wait_for_credit().await? {
            Some(credit) => max.min(credit),
            None => max,
        })
    }

    /// Stops applying response credit: an upgraded connection carries both directions on this
    /// tunnel, and its response must not wait for credit queued behind request bytes that the
    /// API server is not reading. HTTP/2's stream window still bounds it.
    pub fn without_credit(&self) {
        self.credit.limited.store(false, Ordering::Release);
        self.credit.changed.notify_waiters();
    }

    /// `Some(available)` once the credit is positive; `None` if credit does not apply.
    async fn wait_for_credit(&self) -> Result<Option<usize>, Status> {
        loop {
            let changed = self.credit.changed.notified();
            if !self.credit.limited.load(Ordering::Acquire) {
                return Ok(None);
            }
            let available = self.credit.available.load(Ordering::Acquire);
            if available > 0 {
                return Ok(Some(usize::try_from(available).unwrap_or(usize::MAX)));
            }
            if self.credit.ended.load(Ordering::Acquire) {
                return Err(Status::cancelled("kas ended the tunnel while the response waited for credit"));
            }
            tokio::select! {
                () = changed => {}
                () = self.outbound.closed() => return Err(Status::cancelled("tunnel closed")),
            }
        }
    }

    /// Whether this response has ended (Trailer or Error sent).
    pub fn is_done(&self) -> bool {
        self.order.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_done()
    }

    pub async fn trailer(&self, metadata: HashMap<String, pb::MetadataValues>) -> Result<(), Status> {
        self.send(ConnectRequest::trailer(pb::Trailer { metadata }), ResponseFrame::Trailer).await
    }

    /// Resolves when the tunnel's outbound stream is gone (the stream was reset or the
    /// connection to kas broke), which needs no inbound frame to be read.
    pub async fn closed(&self) {
        self.outbound.closed().await;
    }

    pub async fn error(&self, status: &Status) -> Result<(), Status> {
        self.send(ConnectRequest::error(status), ResponseFrame::Error).await
    }

    /// Header, one message, trailer; or the error.
    pub async fn unary(&self, result: Result<Bytes, Status>) -> Result<(), Status> {
        match result {
            Ok(body) => {
                self.header(HashMap::new()).await?;
                self.message(body).await?;
                self.trailer(HashMap::new()).await
            }
            Err(status) => self.error(&status).await,
        }
    }
}
