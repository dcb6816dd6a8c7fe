//! agentk's end of one tunnel: receives the request frames and sends the response frames, both
//! checked against the shared [`FrameOrder`] (the same state machine kas uses).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use kas_proto::tunnel::pb::{self, ConnectRequest, ConnectResponse, connect_response};
use kas_proto::tunnel::{FrameOrder, FrameOrderError, ResponseFrame};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

type SharedOrder = Arc<Mutex<FrameOrder>>;

fn check(
    order: &SharedOrder,
    f: impl FnOnce(&mut FrameOrder) -> Result<(), FrameOrderError>,
) -> Result<(), FrameOrderError> {
    // Never held across an await; a poisoned lock still holds a consistent state machine.
    let mut guard = order.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut guard)
}

/// The request kas sent, as a module sees it.
pub struct TunnelRequest {
    pub method: String,
    pub metadata: HashMap<String, pb::MetadataValues>,
    inbound: Streaming<ConnectResponse>,
    order: SharedOrder,
}

/// Sends the response frames back to kas.
pub struct Responder {
    outbound: mpsc::Sender<ConnectRequest>,
    order: SharedOrder,
}

/// Builds the request/responder pair from the first frame (already checked to be RequestInfo).
pub fn split(
    info: pb::RequestInfo,
    inbound: Streaming<ConnectResponse>,
    outbound: mpsc::Sender<ConnectRequest>,
    order: FrameOrder,
) -> (TunnelRequest, Responder) {
    let order = Arc::new(Mutex::new(order));
    (
        TunnelRequest { method: info.method, metadata: info.metadata, inbound, order: order.clone() },
        Responder { outbound, order },
    )
}

impl TunnelRequest {
    /// The next body message; `None` after CloseSend.
    pub async fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        let Some(frame) = self.inbound.message().await? else {
            return Err(Status::cancelled("kas ended the tunnel before CloseSend"));
        };
        check(&self.order, |o| frame.kind().and_then(|k| o.request(k)))?;
        match frame.msg {
            Some(connect_response::Msg::Message(m)) => Ok(Some(m.data)),
            Some(connect_response::Msg::CloseSend(_)) => Ok(None),
            _ => Err(Status::invalid_argument("unexpected frame in the request body")),
        }
    }

    /// Waits until kas ends the tunnel, discarding request frames. Dropping the stream earlier
    /// would reset it, and a reset discards response frames kas has not read yet.
    pub async fn finish(&mut self) {
        while let Ok(Some(_)) = self.inbound.message().await {}
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
        check(&self.order, |o| o.response(kind))?;
        self.outbound.send(frame).await.map_err(|_| Status::cancelled("tunnel closed"))
    }

    pub async fn header(&self, metadata: HashMap<String, pb::MetadataValues>) -> Result<(), Status> {
        self.send(ConnectRequest::header(pb::Header { metadata }), ResponseFrame::Header).await
    }

    pub async fn message(&self, data: Bytes) -> Result<(), Status> {
        self.send(ConnectRequest::message(data), ResponseFrame::Message).await
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
