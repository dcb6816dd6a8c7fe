//! A minimal SPDY/3.1 server side for the fake API server's `pods/portforward`
//! (`portforward.k8s.io`), enough for kubectl's client (moby/spdystream via client-go
//! tools/portforward): frames (SYN_STREAM, SYN_REPLY, DATA, RST_STREAM, SETTINGS, PING, GOAWAY,
//! WINDOW_UPDATE), header blocks compressed with one zlib stream per direction primed with SPDY/3's
//! dictionary, and the port-forward streams: per forwarded connection the client opens an
//! `error` stream and a `data` stream (headers `streamType`, `port`, `requestID`); the server
//! replies to each. The pod's ports all echo: every byte on a data stream comes back on it, and a
//! FIN is answered with a FIN. Flow control windows are not enforced (spdystream does not either).
//!
//! Served over the raw upgraded connection (kubectl ≤ 1.30) and inside WebSocket binary messages
//! (`SPDY/3.1+portforward.k8s.io`, kubectl ≥ 1.31): see [`serve`].

use std::collections::HashMap;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const VERSION: u16 = 3;
pub(crate) const SYN_STREAM: u16 = 1;
pub(crate) const SYN_REPLY: u16 = 2;
pub(crate) const PING: u16 = 6;
pub(crate) const GOAWAY: u16 = 7;
pub(crate) const FLAG_FIN: u8 = 1;

/// SPDY/3's header compression dictionary (draft-mbelshe-httpbis-spdy-00 §2.6.10.1): the
/// length-prefixed names, then a run of common values.
pub fn dictionary() -> Vec<u8> {
    const NAMES: [&str; 65] = [
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    const TAIL: &str = "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505\
        203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized\
        403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable\
        Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT\
        chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,\
        text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";
    let mut dict = Vec::with_capacity(1423);
    for name in NAMES {
        dict.extend_from_slice(&(name.len() as u32).to_be_bytes());
        dict.extend_from_slice(name.as_bytes());
    }
    dict.extend_from_slice(TAIL.as_bytes());
    dict
}

/// What one connection saw (for tests' assertions).
#[derive(Debug, Default, Clone)]
pub struct PortForwardRecord {
    /// (streamType, port, requestID) of every stream the client opened.
    pub streams: Vec<(String, String, String)>,
    /// Bytes echoed on data streams.
    pub echoed: u64,
    /// Whether the session ended (the client's side closed, or GOAWAY).
    pub ended: bool,
}

/// A session's record, updated as frames arrive.
pub type SharedRecord = std::sync::Arc<std::sync::Mutex<PortForwardRecord>>;

fn update(record: &SharedRecord, f: impl FnOnce(&mut PortForwardRecord)) {
    f(&mut record.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
}

#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("header block: {0}")]
    Headers(String),
}

pub(crate) struct HeaderCodec {
    dictionary: Vec<u8>,
    inflate: Decompress,
    deflate: Compress,
    deflate_primed: bool,
}

impl HeaderCodec {
    pub(crate) fn new() -> Self {
        Self {
            dictionary: dictionary(),
            inflate: Decompress::new(true),
            deflate: Compress::new(Compression::best(), true),
            deflate_primed: false,
        }
    }

    pub(crate) fn decode(&mut self, block: &[u8]) -> Result<HashMap<String, String>, SpdyError> {
        let mut out = Vec::with_capacity(block.len() * 4 + 256);
        let mut consumed = 0usize;
        loop {
            let before = self.inflate.total_in();
            let result = self.inflate.decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync);
            consumed += (self.inflate.total_in() - before) as usize;
            match result {
                Ok(_) if consumed >= block.len() && out.len() < out.capacity() => break,
                Ok(Status::BufError) if consumed >= block.len() => break,
                Ok(_) => out.reserve(out.capacity().max(1024)),
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate.set_dictionary(&self.dictionary).map_err(|e| SpdyError::Headers(e.to_string()))?;
                }
                Err(e) => return Err(SpdyError::Headers(e.to_string())),
            }
        }
        parse_header_block(&out)
    }

    pub(crate) fn encode(&mut self, headers: &[(&str, &str)]) -> Result<Vec<u8>, SpdyError> {
        if !self.deflate_primed {
            self.deflate.set_dictionary(&self.dictionary).map_err(|e| SpdyError::Headers(e.to_string()))?;
            self.deflate_primed = true;
        }
        let mut plain = (headers.len() as u32).to_be_bytes().to_vec();
        for (name, value) in headers {
            for part in [name, value] {
                plain.extend_from_slice(&(part.len() as u32).to_be_bytes());
                plain.extend_from_slice(part.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let start = self.deflate.total_in();
        loop {
            let done = (self.deflate.total_in() - start) as usize;
            self.deflate
                .compress_vec(&plain[done..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Headers(e.to_string()))?;
            if (self.deflate.total_in() - start) as usize >= plain.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            out.reserve(out.capacity().max(256));
        }
    }
}

fn parse_header_block(block: &[u8]) -> Result<HashMap<String, String>, SpdyError> {
    let bad = || SpdyError::Headers("truncated header block".to_owned());
    let mut rest = block;
    let mut take = |n: usize| -> Result<&[u8], SpdyError> {
        if rest.len() < n {
            return Err(bad());
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let count = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad())?);
    let mut headers = HashMap::new();
    for _ in 0..count {
        let len = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad())?) as usize;
        let name = String::from_utf8_lossy(take(len)?).into_owned();
        let len = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad())?) as usize;
        let value = String::from_utf8_lossy(take(len)?).into_owned();
        headers.insert(name.to_ascii_lowercase(), value);
    }
    Ok(headers)
}

pub(crate) fn control_frame(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(8 + payload.len());
    frame.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    frame.extend_from_slice(&kind.to_be_bytes());
    frame.push(flags);
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    frame.extend_from_slice(payload);
    frame
}

pub(crate) fn data_frame(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(8 + payload.len());
    frame.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    frame.push(flags);
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    frame.extend_from_slice(payload);
    frame
}

/// One SPDY/3 frame as read from the connection.
pub(crate) enum Frame {
    Data { stream: u32, fin: bool, payload: Vec<u8> },
    Control { kind: u16, payload: Vec<u8> },
}

/// Reads the next frame; `None` when the client closed the connection between frames.
pub(crate) async fn read_frame(reader: &mut (impl AsyncRead + Unpin)) -> Result<Option<Frame>, SpdyError> {
    let mut head = [0u8; 8];
    match reader.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let mut payload = vec![0u8; len];
    reader.read_exact(&mut payload).await?;
    Ok(Some(if head[0] & 0x80 == 0 {
        let stream = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        Frame::Data { stream, fin: head[4] & FLAG_FIN != 0, payload }
    } else {
        Frame::Control { kind: u16::from_be_bytes([head[2], head[3]]), payload }
    }))
}

/// A SYN_STREAM's stream id and headers.
pub(crate) type SynStream = (u32, HashMap<String, String>);

/// A SYN_STREAM's stream id and headers; `None` for a frame too short to be one.
pub(crate) fn syn_stream(payload: &[u8], codec: &mut HeaderCodec) -> Result<Option<SynStream>, SpdyError> {
    if payload.len() < 10 {
        return Ok(None);
    }
    let stream = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
    Ok(Some((stream, codec.decode(&payload[10..])?)))
}

/// The SYN_REPLY accepting `stream`, with no headers.
pub(crate) fn syn_reply(stream: u32, codec: &mut HeaderCodec) -> Result<Vec<u8>, SpdyError> {
    let mut reply = stream.to_be_bytes().to_vec();
    reply.extend_from_slice(&codec.encode(&[])?);
    Ok(control_frame(SYN_REPLY, 0, &reply))
}

/// Serves one port-forward SPDY session until the client goes away, keeping `record` up to date.
pub async fn serve(io: impl AsyncRead + AsyncWrite + Send + Unpin, record: &SharedRecord) -> Result<(), SpdyError> {
    let result = session(io, record).await;
    update(record, |r| r.ended = true);
    result
}

async fn session(io: impl AsyncRead + AsyncWrite + Send + Unpin, record: &SharedRecord) -> Result<(), SpdyError> {
    let (mut reader, mut writer) = tokio::io::split(io);
    let mut codec = HeaderCodec::new();
    // stream id -> is a data stream (echoed)
    let mut data_streams: HashMap<u32, bool> = HashMap::new();
    while let Some(frame) = read_frame(&mut reader).await? {
        match frame {
            Frame::Data { stream, fin, payload } => {
                if data_streams.get(&stream).copied().unwrap_or(false) {
                    update(record, |r| r.echoed += payload.len() as u64);
                    let flags = if fin { FLAG_FIN } else { 0 };
                    writer.write_all(&data_frame(stream, flags, &payload)).await?;
                }
                continue;
            }
            Frame::Control { kind: SYN_STREAM, payload } => {
                let Some((stream, headers)) = syn_stream(&payload, &mut codec)? else { continue };
                let get = |k: &str| headers.get(k).cloned().unwrap_or_default();
                let stream_type = get("streamtype");
                data_streams.insert(stream, stream_type == "data");
                update(record, |r| r.streams.push((stream_type, get("port"), get("requestid"))));
                writer.write_all(&syn_reply(stream, &mut codec)?).await?;
            }
            Frame::Control { kind: PING, payload } => writer.write_all(&control_frame(PING, 0, &payload)).await?,
            Frame::Control { kind: GOAWAY, .. } => return Ok(()),
            // SETTINGS, WINDOW_UPDATE, RST_STREAM, HEADERS: nothing to do for an echo.
            Frame::Control { .. } => {}
        }
        writer.flush().await?;
    }
    Ok(())
}
