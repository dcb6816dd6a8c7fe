//! agentk's end of one tunnel: receives the request frames and sends the response frames, both
//! checked against the shared [`FrameOrder`] (the same state machine kas uses).
//!
//! One task per tunnel reads what kas sends ([`read_frames`]), for every exchange the tunnel
//! carries (a tunnel is reusable: see `kas_proto::tunnel`): response credit
//! (`WindowUpdate`, see `kas_proto::flow`) must arrive while a module waits for it to send, and
//! the module may not be reading the request body then. Request frames are read ahead of the
//! module up to [`REQUEST_READ_AHEAD`] bytes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use kas_proto::tunnel::pb::{self, ConnectRequest, ConnectResponse, connect_response};
use kas_proto::tunnel::{FrameOrder, FrameOrderError, RequestFrame, ResponseFrame};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::{Status, Streaming};

use crate::tunnel_codec::Outbound;

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
    pub metadata: BTreeMap<String, pb::MetadataValues>,
    inbound: mpsc::UnboundedReceiver<Result<Inbound, Status>>,
    /// Read by [`TunnelRequest::ended_now`] and not taken yet.
    peeked: Option<Result<Inbound, Status>>,
    close_send_seen: bool,
}

/// Sends the response frames back to kas.
pub struct Responder {
    outbound: mpsc::Sender<Outbound>,
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
    outbound: mpsc::Sender<Outbound>,
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
    fn new(info: pb::RequestInfo, order: FrameOrder, outbound: &mpsc::Sender<Outbound>) -> (Self, Exchange) {
        let order = Arc::new(Mutex::new(order));
        let credit = Arc::new(SendCredit {
            limited: AtomicBool::new(info.response_window > 0),
            available: AtomicI64::new(i64::from(info.response_window)),
            ended: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let request = TunnelRequest {
            method: info.method,
            metadata: info.metadata,
            inbound: rx,
            peeked: None,
            close_send_seen: false,
        };
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
    outbound: mpsc::Sender<Outbound>,
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
        let next = match self.peeked.take() {
            Some(item) => Some(item),
            None => self.inbound.recv().await,
        };
        match next {
            None => Err(Status::cancelled("kas ended the tunnel before CloseSend")),
            Some(Err(status)) => Err(status),
            Some(Ok(Inbound::Message(data, _read_ahead))) => Ok(Some(data)),
            Some(Ok(Inbound::CloseSend)) => {
                self.close_send_seen = true;
                Ok(None)
            }
        }
    }

    /// Whether the request's CloseSend has been read already (taking it if it is the next
    /// frame), without waiting: the request has no more body.
    pub fn ended_now(&mut self) -> bool {
        if self.peeked.is_none() {
            self.peeked = self.inbound.try_recv().ok();
        }
        if matches!(self.peeked, Some(Ok(Inbound::CloseSend))) {
            self.peeked = None;
            self.close_send_seen = true;
        }
        self.close_send_seen
    }

    /// Waits until kas ends the tunnel (or starts the next exchange on it), discarding request
    /// frames: after CloseSend, the sign that the caller is gone.
    pub async fn finish(&mut self) {
        if matches!(self.peeked.take(), Some(Err(_))) {
            return;
        }
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

/// Response frames sent together ([`Responder::send_batch`]): queued with no await between
/// them, the stream's encoder takes them in one HTTP/2 write. A small response goes out whole,
/// header to trailer, as one write instead of four.
#[derive(Default)]
pub struct Batch(Vec<(Outbound, ResponseFrame)>);

impl Batch {
    pub fn header(&mut self, metadata: BTreeMap<String, pb::MetadataValues>) -> &mut Self {
        self.0.push((ConnectRequest::header(pb::Header { metadata }).into(), ResponseFrame::Header));
        self
    }

    /// A body message; it takes response credit as [`Responder::message`] does.
    pub fn message(&mut self, data: Bytes) -> &mut Self {
        self.0.push((ConnectRequest::message(data).into(), ResponseFrame::Message));
        self
    }

    /// A body message carrying a proxied HTTP body's data (an `HttpFrame` body), encoded with
    /// one copy ([`Outbound::HttpBody`]); it takes response credit as [`Self::message`] does.
    pub fn http_body(&mut self, data: Bytes) -> &mut Self {
        self.0.push((Outbound::HttpBody(data), ResponseFrame::Message));
        self
    }

    pub fn trailer(&mut self, metadata: BTreeMap<String, pb::MetadataValues>) -> &mut Self {
        self.0.push((ConnectRequest::trailer(pb::Trailer { metadata }).into(), ResponseFrame::Trailer));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Responder {
    /// Sends a batch's frames in order, together as far as the channel's capacity and the
    /// response credit allow (a message waits for positive credit, as [`Self::message`]).
    pub async fn send_batch(&self, batch: Batch) -> Result<(), Status> {
        let mut frames = batch.0.into_iter().peekable();
        let capacity = self.outbound.max_capacity();
        while frames.peek().is_some() {
            let mut ready = Vec::new();
            while let Some((frame, _)) = frames.peek()
                && ready.len() < capacity
            {
                if let Some(len) = frame.message_len()
                    && !self.take_credit(len)
                {
                    break;
                }
                ready.extend(frames.next());
            }
            if ready.is_empty() {
                self.wait_for_credit().await?;
                continue;
            }
            // Room first, then the order checks and the sends with no await between (see `send`).
            let permits =
                self.outbound.reserve_many(ready.len()).await.map_err(|_| Status::cancelled("tunnel closed"))?;
            for ((frame, kind), permit) in ready.into_iter().zip(permits) {
                check(&self.order, |o| o.response(kind))?;
                permit.send(frame);
            }
        }
        Ok(())
    }

    /// Takes `len` bytes of response credit if there is some now (or credit does not apply);
    /// `false`: the message must wait for kas to grant more.
    fn take_credit(&self, len: usize) -> bool {
        if !self.credit.limited.load(Ordering::Acquire) {
            return true;
        }
        if self.credit.available.load(Ordering::Acquire) <= 0 {
            return false;
        }
        self.credit.available.fetch_sub(i64::try_from(len).unwrap_or(i64::MAX), Ordering::AcqRel);
        true
    }

    /// How much body may go into a message now: at most `max`, and no more than the credit;
    /// `None` when the credit is used up (see [`Self::wait_for_credit`]).
    pub fn message_size_now(&self, max: usize) -> Option<usize> {
        if !self.credit.limited.load(Ordering::Acquire) {
            return Some(max);
        }
        let available = self.credit.available.load(Ordering::Acquire);
        (available > 0).then(|| max.min(usize::try_from(available).unwrap_or(usize::MAX)))
    }

    async fn send(&self, frame: Outbound, kind: ResponseFrame) -> Result<(), Status> {
        // Room first, then the order check and the send with no await between: a send cancelled
        // while waiting must not count as sent (the tunnel would look reusable).
        let permit = self.outbound.reserve().await.map_err(|_| Status::cancelled("tunnel closed"))?;
        check(&self.order, |o| o.response(kind))?;
        permit.send(frame);
        Ok(())
    }

    /// Sends one body message once there is response credit (a message may take the credit
    /// below zero; the next one waits for kas to grant more).
    pub async fn message(&self, data: Bytes) -> Result<(), Status> {
        self.send_message(ConnectRequest::message(data).into()).await
    }

    /// [`Self::message`] for a proxied HTTP body's data ([`Batch::http_body`]).
    pub async fn http_body(&self, data: Bytes) -> Result<(), Status> {
        self.send_message(Outbound::HttpBody(data)).await
    }

    async fn send_message(&self, message: Outbound) -> Result<(), Status> {
        if self.wait_for_credit().await?.is_some() {
            let len = i64::try_from(message.message_len().unwrap_or(0)).unwrap_or(i64::MAX);
            self.credit.available.fetch_sub(len, Ordering::AcqRel);
        }
        self.send(message, ResponseFrame::Message).await
    }

    /// Stops applying response credit: an upgraded connection carries both directions on this
    /// tunnel, and its response must not wait for credit queued behind request bytes that the
    /// API server is not reading. HTTP/2's stream window still bounds it.
    pub fn without_credit(&self) {
        self.credit.limited.store(false, Ordering::Release);
        self.credit.changed.notify_waiters();
    }

    /// `Some(available)` once the credit is positive; `None` if credit does not apply.
    pub async fn wait_for_credit(&self) -> Result<Option<usize>, Status> {
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

    pub async fn trailer(&self, metadata: BTreeMap<String, pb::MetadataValues>) -> Result<(), Status> {
        self.send(ConnectRequest::trailer(pb::Trailer { metadata }).into(), ResponseFrame::Trailer).await
    }

    /// Resolves when the tunnel's outbound stream is gone (the stream was reset or the
    /// connection to kas broke), which needs no inbound frame to be read.
    pub async fn closed(&self) {
        self.outbound.closed().await;
    }

    pub async fn error(&self, status: &Status) -> Result<(), Status> {
        self.send(ConnectRequest::error(status).into(), ResponseFrame::Error).await
    }

    /// Header, one message, trailer (in one write); or the error.
    pub async fn unary(&self, result: Result<Bytes, Status>) -> Result<(), Status> {
        match result {
            Ok(body) => {
                let mut batch = Batch::default();
                batch.header(BTreeMap::new()).message(body).trailer(BTreeMap::new());
                self.send_batch(batch).await
            }
            Err(status) => self.error(&status).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kas_proto::tunnel::pb::connect_request::Msg;

    use super::*;

    /// A responder for an exchange that got its RequestInfo, with the channel to kas.
    fn responder(response_window: u32) -> (Responder, mpsc::Receiver<Outbound>) {
        let (outbound, to_kas) = mpsc::channel(kas_proto::flow::HOP_BUFFER);
        let mut order = FrameOrder::after_descriptor();
        order.request(RequestFrame::RequestInfo).unwrap();
        let info = pb::RequestInfo { response_window, ..Default::default() };
        let (_current, (_request, responder)) = Current::new(info, order, &outbound);
        (responder, to_kas)
    }

    fn kinds(to_kas: &mut mpsc::Receiver<Outbound>) -> Vec<&'static str> {
        std::iter::from_fn(|| to_kas.try_recv().ok())
            .map(|f| match f.into_frame().msg {
                Some(Msg::Header(_)) => "header",
                Some(Msg::Message(_)) => "message",
                Some(Msg::Trailer(_)) => "trailer",
                _ => "other",
            })
            .collect()
    }

    /// A GET's CloseSend comes with its head: `ended_now` sees it without waiting, and a body
    /// message that comes first is still read, in order.
    #[tokio::test]
    async fn ended_now_takes_a_close_send_that_is_there_and_keeps_a_body() {
        let (outbound, _to_kas) = mpsc::channel(kas_proto::flow::HOP_BUFFER);
        let mut order = FrameOrder::after_descriptor();
        order.request(RequestFrame::RequestInfo).unwrap();
        let (current, (mut request, _responder)) = Current::new(pb::RequestInfo::default(), order, &outbound);
        assert!(!request.ended_now(), "nothing read yet");
        let permit = || current.read_ahead.clone().try_acquire_many_owned(4).unwrap();
        current.tx.send(Ok(Inbound::Message(Bytes::from_static(b"body"), permit()))).unwrap();
        current.tx.send(Ok(Inbound::CloseSend)).unwrap();
        assert!(!request.ended_now(), "a body message comes first");
        assert!(!request.ended_now(), "asking again does not skip it");
        assert_eq!(request.next_message().await.unwrap().as_deref(), Some(&b"body"[..]));
        assert!(request.ended_now());
        assert!(request.drain_to_close_send().await, "the request is complete");
    }

    /// A small response is queued whole before anything else runs, so tonic's encoder takes it
    /// in one write.
    #[tokio::test]
    async fn a_batch_is_queued_whole() {
        let (responder, mut to_kas) = responder(1024);
        let mut batch = Batch::default();
        batch.header(BTreeMap::new()).message(Bytes::from_static(b"head")).message(Bytes::from_static(b"body"));
        batch.trailer(BTreeMap::new());
        responder.send_batch(batch).await.unwrap();
        assert_eq!(kinds(&mut to_kas), ["header", "message", "message", "trailer"]);
        assert!(responder.is_done());
    }

    /// Within a batch, a message still waits for positive response credit: one message may take
    /// it below zero, the next waits for kas to grant more.
    #[tokio::test(start_paused = true)]
    async fn a_batch_message_waits_for_credit() {
        let (responder, mut to_kas) = responder(10);
        let mut batch = Batch::default();
        batch.header(BTreeMap::new()).message(Bytes::from(vec![0; 100])).message(Bytes::from_static(b"rest"));
        batch.trailer(BTreeMap::new());
        let send = responder.send_batch(batch);
        tokio::pin!(send);
        assert!(tokio::time::timeout(Duration::from_secs(1), &mut send).await.is_err(), "the second message waits");
        assert_eq!(kinds(&mut to_kas), ["header", "message"]);
        responder.credit.grant(100);
        send.await.unwrap();
        assert_eq!(kinds(&mut to_kas), ["message", "trailer"]);
    }

    /// An HTTP body message takes the credit kas will count for it: its `Message` data is the
    /// encoded `HttpFrame`, tag and length included, not only the body bytes.
    #[tokio::test]
    async fn an_http_body_takes_credit_for_its_encoded_frame() {
        let (responder, mut to_kas) = responder(1024);
        responder.send_batch(std::mem::take(Batch::default().header(BTreeMap::new()))).await.unwrap();
        assert_eq!(kinds(&mut to_kas), ["header"]);
        responder.http_body(Bytes::from(vec![7; 200])).await.unwrap();
        let mut batch = Batch::default();
        batch.http_body(Bytes::from(vec![7; 100]));
        responder.send_batch(batch).await.unwrap();
        // 200 bytes: tag, a 2-byte length; 100 bytes: tag, a 1-byte length.
        assert_eq!(responder.credit.available.load(Ordering::Acquire), 1024 - 203 - 102);
        let sent: Vec<usize> = std::iter::from_fn(|| to_kas.try_recv().ok())
            .map(|f| match f.into_frame().msg {
                Some(Msg::Message(m)) => m.data.len(),
                other => panic!("not a message: {other:?}"),
            })
            .collect();
        assert_eq!(sent, [203, 102], "what kas counts is what was taken");
    }
}
