//! Connections to other kas instances (KasInternal), reused across requests: one lazily
//! connected channel per peer address, never a dial per request.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kas_proto::kas::ConnectedAgentInfo;
use kas_proto::kas::kas_internal_client::KasInternalClient;
use kas_proto::metadata::{AUTHORIZATION, HOP_AGENT_ID, HOP_CONNECTION_ID, HOP_METHOD};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::auth::jwt::{KAS_AUDIENCE, KAS_ISSUER};
use crate::auth::{Secret, mint_jwt};
use crate::error::KasError;
use crate::tunnel::TunnelIo;

/// kas -> kas tokens live this long: enough for clock skew, useless if captured.
const PEER_TOKEN_TTL: Duration = Duration::from_secs(60);
/// A peer that does not accept a connection within this is treated as gone.
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Frames buffered towards the gateway kas (each at most one body chunk); HTTP/2 flow control
/// does the rest.
const PEER_SEND_BUFFER: usize = kas_proto::flow::HOP_BUFFER;

/// Why a peer could not take a request; the router tries the next connection in both cases.
#[derive(Debug)]
pub enum PeerError {
    /// The peer does not hold the connection (any more).
    NotHere,
    /// The peer is unreachable or failed.
    Unavailable(String),
    /// The peer answered with an error the caller should see (e.g. its wait ran out).
    Failed(KasError),
}

pub struct Peers {
    secret: Secret,
    /// TLS towards peers (`kas_internal.tls`), plaintext when absent.
    tls: Option<tonic::transport::ClientTlsConfig>,
    /// Address -> channel. A cache behind a lock held only for a map lookup (never across an
    /// await); channels themselves are cheap clones sharing one HTTP/2 connection.
    channels: Mutex<HashMap<String, Channel>>,
}

impl Peers {
    pub fn new(secret: Secret) -> Self {
        Self { secret, tls: None, channels: Mutex::default() }
    }

    /// Dials peers with TLS (verifying their certificate, presenting this kas's).
    pub fn with_tls(mut self, tls: tonic::transport::ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    fn channel(&self, address: &str) -> Result<Channel, PeerError> {
        let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = channels.get(address) {
            return Ok(c.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| PeerError::Unavailable(format!("bad peer address {address}: {e}")))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| PeerError::Unavailable(format!("peer TLS configuration: {e}")))?;
        }
        let channel = endpoint
            .connect_timeout(PEER_CONNECT_TIMEOUT)
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            // Responses of all forwarded tunnels share this connection: one unread stream must
            // not hold its window (`kas_proto::flow`).
            .initial_stream_window_size(kas_proto::flow::STREAM_WINDOW)
            .initial_connection_window_size(kas_proto::flow::CONNECTION_WINDOW)
            .connect_lazy();
        channels.insert(address.to_owned(), channel.clone());
        Ok(channel)
    }

    /// Opens a forwarded tunnel to the kas holding `connection`. Returns once that kas has
    /// found a local tunnel for it (its response headers arrived), so nothing is sent to a kas
    /// that cannot serve the request.
    pub async fn open(
        &self,
        connection: &ConnectedAgentInfo,
        method: &str,
        wait: Duration,
    ) -> Result<TunnelIo, PeerError> {
        let address = connection
            .kas_address
            .as_ref()
            .map(|a| if a.ip.contains(':') { format!("[{}]:{}", a.ip, a.port) } else { format!("{}:{}", a.ip, a.port) })
            .ok_or_else(|| PeerError::Unavailable("connection record without a kas address".into()))?;
        let mut client = KasInternalClient::new(self.channel(&address)?);
        let (tx, rx) = mpsc::channel(PEER_SEND_BUFFER);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        let token = mint_jwt(&self.secret, KAS_ISSUER, KAS_AUDIENCE, PEER_TOKEN_TTL)
            .map_err(|e| PeerError::Unavailable(e.to_string()))?;
        let md = request.metadata_mut();
        let mut insert = |key: &'static str, value: String| {
            if let Ok(v) = value.parse() {
                md.insert(key, v);
            }
        };
        insert(AUTHORIZATION, format!("Bearer {token}"));
        insert(HOP_AGENT_ID, connection.id.to_string());
        insert(HOP_CONNECTION_ID, connection.connection_id.to_string());
        insert(HOP_METHOD, method.to_owned());
        // Bounds the gateway's wait for a free tunnel (it ends at the response headers; the
        // stream itself is not limited, so long watches are not cut).
        request.set_timeout(wait);
        match client.forward_tunnel(request).await {
            Ok(response) => Ok(TunnelIo::remote(tx, response.into_inner().boxed())),
            Err(status) => Err(match status.code() {
                tonic::Code::NotFound => PeerError::NotHere,
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal => {
                    PeerError::Unavailable(format!("kas {address}: {}", status.message()))
                }
                code => PeerError::Failed(KasError::AgentError { code, message: status.message().to_owned() }),
            }),
        }
    }
}
