//! kas's end of one tunnel: sends request frames, receives response frames, and checks both
//! against the shared [`FrameOrder`].

use std::collections::HashMap;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use kas_proto::tunnel::pb::{self, ConnectRequest, ConnectResponse, connect_request};
use kas_proto::tunnel::{FrameOrder, RequestFrame};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::Status;

use crate::error::KasError;

/// The sending half of a `Connect` response stream.
pub type ToAgent = mpsc::Sender<Result<ConnectResponse, Status>>;

pub struct TunnelIo {
    to_agent: ToAgent,
    from_agent: BoxStream<'static, Result<ConnectRequest, Status>>,
    order: FrameOrder,
    done: CancellationToken,
    _done_on_drop: DropGuard,
}

impl std::fmt::Debug for TunnelIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelIo").field("order", &self.order).finish_non_exhaustive()
    }
}

/// Resolves when agentk went away or the tunnel was used and dropped.
pub struct ClosedSignal {
    to_agent: ToAgent,
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
    pub header: HashMap<String, pb::MetadataValues>,
    pub body: Bytes,
}

impl TunnelIo {
    /// `order` must already have seen the Descriptor.
    pub fn new(
        to_agent: ToAgent,
        from_agent: BoxStream<'static, Result<ConnectRequest, Status>>,
        order: FrameOrder,
    ) -> Self {
        let done = CancellationToken::new();
        Self { to_agent, from_agent, order, _done_on_drop: done.clone().drop_guard(), done }
    }

    pub fn closed_signal(&self) -> ClosedSignal {
        ClosedSignal { to_agent: self.to_agent.clone(), done: self.done.clone() }
    }

    pub fn is_closed(&self) -> bool {
        self.to_agent.is_closed()
    }

    /// Sends one frame to agentk.
    pub async fn send(&mut self, frame: ConnectResponse) -> Result<(), KasError> {
        let kind = frame.kind().map_err(|e| KasError::Internal(e.to_string()))?;
        self.order.request(kind).map_err(|e| KasError::Internal(e.to_string()))?;
        self.to_agent.send(Ok(frame)).await.map_err(|_| KasError::Tunnel("agentk closed the tunnel".into()))
    }

    /// Receives one frame from agentk; `None` when agentk ended the stream. An out-of-order frame
    /// ends the tunnel with INVALID_ARGUMENT and is returned as an error.
    pub async fn recv(&mut self) -> Result<Option<connect_request::Msg>, KasError> {
        let frame = match self.from_agent.next().await {
            None => return Ok(None),
            Some(Err(status)) => return Err(KasError::Tunnel(format!("tunnel stream failed: {}", status.message()))),
            Some(Ok(frame)) => frame,
        };
        let checked = frame.kind().and_then(|kind| self.order.response(kind));
        if let Err(violation) = checked {
            let _ = self.to_agent.try_send(Err(violation.clone().into()));
            tracing::warn!(error = %violation, "agentk broke the tunnel protocol");
            return Err(KasError::Tunnel(violation.to_string()));
        }
        Ok(frame.msg)
    }

    /// One request with one message, one response with one message.
    pub async fn unary(
        mut self,
        method: &str,
        metadata: HashMap<String, pb::MetadataValues>,
        body: Bytes,
    ) -> Result<UnaryResponse, KasError> {
        self.send(ConnectResponse::request_info(pb::RequestInfo { method: method.to_owned(), metadata })).await?;
        self.send(ConnectResponse::message(body)).await?;
        self.send(ConnectResponse::close_send()).await?;
        let mut header = HashMap::new();
        let mut body = None;
        loop {
            match self.recv().await? {
                None => return Err(KasError::Tunnel("agentk closed the tunnel before the response ended".into())),
                Some(connect_request::Msg::Header(h)) => header = h.metadata,
                Some(connect_request::Msg::Message(m)) => {
                    if body.replace(m.data).is_some() {
                        return Err(self.abort("more than one response message for a unary call"));
                    }
                }
                Some(connect_request::Msg::Trailer(_)) => break,
                Some(connect_request::Msg::Error(e)) => {
                    let status = Status::from(e);
                    return Err(KasError::AgentError { code: status.code(), message: status.message().to_owned() });
                }
                Some(connect_request::Msg::Descriptor(_)) => {
                    return Err(KasError::Internal("descriptor passed the frame-order check".into()));
                }
            }
        }
        let body = body.ok_or_else(|| self.abort("no response message for a unary call"))?;
        Ok(UnaryResponse { header, body })
    }

    fn abort(&self, why: &str) -> KasError {
        let _ = self.to_agent.try_send(Err(Status::invalid_argument(why.to_owned())));
        KasError::Tunnel(why.to_owned())
    }

    /// Whether the request side may still send (for streaming callers).
    pub fn request_frame_allowed(&self, frame: RequestFrame) -> bool {
        self.order.clone().request(frame).is_ok()
    }
}
