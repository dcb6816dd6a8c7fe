//! The reverse tunnel: generated types and the frame-order state machine.
//!
//! One tunnel (one `Connect` stream) carries one request at a time; a tunnel whose Descriptor
//! says `reusable` may carry the next one after an exchange ended cleanly
//! ([`FrameOrder::is_finished`]), each exchange checked by a fresh [`FrameOrder`]:
//!
//! ```text
//! agentk -> kas:  Descriptor  ...............  Header  Message*  (Trailer | Error)
//! kas -> agentk:               RequestInfo  Message*  CloseSend
//! ```
//!
//! `WindowUpdate` (response credit, see [`crate::flow`]) may come from kas at any point after
//! `RequestInfo`, also after `CloseSend`.
//!
//! kas may only send `RequestInfo` after the `Descriptor`; agentk may only answer after
//! `RequestInfo`; `Error` may replace the header or end the body. Both sides feed every frame they
//! send and receive through one [`FrameOrder`], so a violation is detected the same way on both
//! ends and becomes `INVALID_ARGUMENT` for that tunnel, never a panic.

use std::fmt;

/// Generated code for `kas.tunnel.v1`.
pub use crate::pb::kas::tunnel::v1 as pb;

use pb::{connect_request, connect_response};

/// Frames kas sends to agentk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestFrame {
    RequestInfo,
    Message,
    CloseSend,
    WindowUpdate,
}

/// Frames agentk sends to kas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFrame {
    Descriptor,
    Header,
    Message,
    Trailer,
    Error,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum RequestState {
    #[default]
    AwaitInfo,
    Body,
    Closed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum ResponseState {
    #[default]
    AwaitDescriptor,
    Idle,
    AwaitHeader,
    Body,
    Done,
}

impl ResponseState {
    fn describe(self) -> &'static str {
        match self {
            Self::AwaitDescriptor => "before the Descriptor",
            Self::Idle => "before the request was sent",
            Self::AwaitHeader => "before the Header",
            Self::Body => "after the Header",
            Self::Done => "after the response ended",
        }
    }
}

impl RequestState {
    fn describe(self) -> &'static str {
        match self {
            Self::AwaitInfo => "before RequestInfo",
            Self::Body => "after RequestInfo",
            Self::Closed => "after CloseSend",
        }
    }
}

/// A frame that arrived (or was about to be sent) out of order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tunnel protocol violation: unexpected {frame} frame {state}")]
pub struct FrameOrderError {
    pub frame: &'static str,
    pub state: &'static str,
}

impl From<FrameOrderError> for tonic::Status {
    fn from(e: FrameOrderError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// The frame order of one tunnel, in both directions.
#[derive(Debug, Default, Clone)]
pub struct FrameOrder {
    request: RequestState,
    response: ResponseState,
}

impl FrameOrder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A tunnel whose Descriptor was consumed elsewhere (the gateway kas, for a forwarded one).
    pub fn after_descriptor() -> Self {
        Self { request: RequestState::AwaitInfo, response: ResponseState::Idle }
    }

    /// Records a kas -> agentk frame.
    pub fn request(&mut self, frame: RequestFrame) -> Result<(), FrameOrderError> {
        use RequestFrame as F;
        use RequestState as S;
        let next = match (self.request, frame) {
            (S::AwaitInfo, F::RequestInfo) if self.response == ResponseState::Idle => {
                self.response = ResponseState::AwaitHeader;
                S::Body
            }
            (S::AwaitInfo, F::RequestInfo) => {
                return Err(FrameOrderError { frame: "RequestInfo", state: self.response.describe() });
            }
            (S::Body, F::Message) => S::Body,
            (S::Body, F::CloseSend) => S::Closed,
            (state @ (S::Body | S::Closed), F::WindowUpdate) => state,
            (state, frame) => {
                return Err(FrameOrderError { frame: request_name(frame), state: state.describe() });
            }
        };
        self.request = next;
        Ok(())
    }

    /// Records an agentk -> kas frame.
    pub fn response(&mut self, frame: ResponseFrame) -> Result<(), FrameOrderError> {
        use ResponseFrame as F;
        use ResponseState as S;
        let next = match (self.response, frame) {
            (S::AwaitDescriptor, F::Descriptor) => S::Idle,
            (S::AwaitHeader, F::Header) => S::Body,
            (S::Body, F::Message) => S::Body,
            (S::Body, F::Trailer) => S::Done,
            (S::AwaitHeader | S::Body, F::Error) => S::Done,
            (state, frame) => {
                return Err(FrameOrderError { frame: response_name(frame), state: state.describe() });
            }
        };
        self.response = next;
        Ok(())
    }

    /// The Descriptor has been seen and no request has been sent yet.
    pub fn is_idle(&self) -> bool {
        self.response == ResponseState::Idle
    }

    /// CloseSend has been sent: the request is complete.
    pub fn is_request_closed(&self) -> bool {
        self.request == RequestState::Closed
    }

    /// The request went out and no response frame has come yet.
    pub fn is_awaiting_header(&self) -> bool {
        self.response == ResponseState::AwaitHeader
    }

    /// The response has ended (Trailer or Error).
    pub fn is_done(&self) -> bool {
        self.response == ResponseState::Done
    }

    /// The exchange ended cleanly in both directions (CloseSend and Trailer or Error): a
    /// reusable tunnel may carry the next one, with a fresh [`FrameOrder::after_descriptor`].
    pub fn is_finished(&self) -> bool {
        self.response == ResponseState::Done && self.request == RequestState::Closed
    }
}

fn request_name(f: RequestFrame) -> &'static str {
    match f {
        RequestFrame::RequestInfo => "RequestInfo",
        RequestFrame::Message => "Message",
        RequestFrame::CloseSend => "CloseSend",
        RequestFrame::WindowUpdate => "WindowUpdate",
    }
}

fn response_name(f: ResponseFrame) -> &'static str {
    match f {
        ResponseFrame::Descriptor => "Descriptor",
        ResponseFrame::Header => "Header",
        ResponseFrame::Message => "Message",
        ResponseFrame::Trailer => "Trailer",
        ResponseFrame::Error => "Error",
    }
}

impl pb::ConnectRequest {
    /// The frame kind, or an error for a frame with no content.
    pub fn kind(&self) -> Result<ResponseFrame, FrameOrderError> {
        use connect_request::Msg;
        match &self.msg {
            Some(Msg::Descriptor(_)) => Ok(ResponseFrame::Descriptor),
            Some(Msg::Header(_)) => Ok(ResponseFrame::Header),
            Some(Msg::Message(_)) => Ok(ResponseFrame::Message),
            Some(Msg::Trailer(_)) => Ok(ResponseFrame::Trailer),
            Some(Msg::Error(_)) => Ok(ResponseFrame::Error),
            None => Err(FrameOrderError { frame: "empty", state: "(frames must carry a message)" }),
        }
    }

    pub fn descriptor(d: pb::Descriptor) -> Self {
        Self { msg: Some(connect_request::Msg::Descriptor(d)) }
    }
    pub fn header(h: pb::Header) -> Self {
        Self { msg: Some(connect_request::Msg::Header(h)) }
    }
    pub fn message(data: bytes::Bytes) -> Self {
        Self { msg: Some(connect_request::Msg::Message(pb::Message { data })) }
    }
    pub fn trailer(t: pb::Trailer) -> Self {
        Self { msg: Some(connect_request::Msg::Trailer(t)) }
    }
    pub fn error(status: &tonic::Status) -> Self {
        Self {
            msg: Some(connect_request::Msg::Error(pb::Error {
                code: status.code() as i32,
                message: status.message().to_owned(),
            })),
        }
    }
}

impl pb::ConnectResponse {
    /// The frame kind, or an error for a frame with no content.
    pub fn kind(&self) -> Result<RequestFrame, FrameOrderError> {
        use connect_response::Msg;
        match &self.msg {
            Some(Msg::RequestInfo(_)) => Ok(RequestFrame::RequestInfo),
            Some(Msg::Message(_)) => Ok(RequestFrame::Message),
            Some(Msg::CloseSend(_)) => Ok(RequestFrame::CloseSend),
            Some(Msg::WindowUpdate(_)) => Ok(RequestFrame::WindowUpdate),
            None => Err(FrameOrderError { frame: "empty", state: "(frames must carry a message)" }),
        }
    }

    pub fn request_info(info: pb::RequestInfo) -> Self {
        Self { msg: Some(connect_response::Msg::RequestInfo(info)) }
    }
    pub fn message(data: bytes::Bytes) -> Self {
        Self { msg: Some(connect_response::Msg::Message(pb::Message { data })) }
    }
    pub fn close_send() -> Self {
        Self { msg: Some(connect_response::Msg::CloseSend(pb::CloseSend {})) }
    }
    pub fn window_update(bytes: u32) -> Self {
        Self { msg: Some(connect_response::Msg::WindowUpdate(pb::WindowUpdate { bytes })) }
    }
}

impl From<pb::Error> for tonic::Status {
    fn from(e: pb::Error) -> Self {
        tonic::Status::new(tonic::Code::from_i32(e.code), e.message)
    }
}

impl fmt::Display for RequestFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(request_name(*self))
    }
}

impl fmt::Display for ResponseFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(response_name(*self))
    }
}

#[cfg(test)]
mod tests {
    use super::RequestFrame as Q;
    use super::ResponseFrame as R;
    use super::*;

    fn idle() -> FrameOrder {
        let mut o = FrameOrder::new();
        o.response(R::Descriptor).unwrap();
        o
    }

    #[test]
    fn full_exchange_is_accepted() {
        let mut o = idle();
        assert!(o.is_idle());
        o.request(Q::RequestInfo).unwrap();
        o.request(Q::Message).unwrap();
        o.response(R::Header).unwrap();
        o.request(Q::Message).unwrap();
        o.response(R::Message).unwrap();
        o.request(Q::CloseSend).unwrap();
        o.response(R::Message).unwrap();
        o.response(R::Trailer).unwrap();
        assert!(o.is_done());
    }

    #[test]
    fn error_may_replace_header_or_end_body() {
        let mut o = idle();
        o.request(Q::RequestInfo).unwrap();
        o.response(R::Error).unwrap();
        assert!(o.is_done());

        let mut o = idle();
        o.request(Q::RequestInfo).unwrap();
        o.response(R::Header).unwrap();
        o.response(R::Message).unwrap();
        o.response(R::Error).unwrap();
        assert!(o.is_done());
    }

    #[test]
    fn violations_are_reported() {
        // Anything but a Descriptor first.
        for f in [R::Header, R::Message, R::Trailer, R::Error] {
            let err = FrameOrder::new().response(f).unwrap_err();
            assert_eq!(err.state, "before the Descriptor");
        }
        // A second Descriptor.
        assert!(idle().response(R::Descriptor).is_err());
        // A response before the request.
        assert!(idle().response(R::Header).is_err());
        // A request before the Descriptor.
        assert!(FrameOrder::new().request(Q::RequestInfo).is_err());
        // Body before the Header.
        let mut o = idle();
        o.request(Q::RequestInfo).unwrap();
        let err = o.response(R::Message).unwrap_err();
        assert_eq!(err.to_string(), "tunnel protocol violation: unexpected Message frame before the Header");
        // Anything after the Trailer.
        let mut o = idle();
        o.request(Q::RequestInfo).unwrap();
        o.response(R::Header).unwrap();
        o.response(R::Trailer).unwrap();
        for f in [R::Header, R::Message, R::Trailer, R::Error, R::Descriptor] {
            assert!(o.clone().response(f).is_err());
        }
        // Request frames after CloseSend, and a second RequestInfo.
        let mut o = idle();
        o.request(Q::RequestInfo).unwrap();
        assert!(o.clone().request(Q::RequestInfo).is_err());
        o.request(Q::CloseSend).unwrap();
        assert!(o.clone().request(Q::Message).is_err());
        assert!(o.request(Q::CloseSend).is_err());
    }

    #[test]
    fn window_updates_follow_request_info_also_after_close_send() {
        assert!(idle().request(Q::WindowUpdate).is_err());
        let mut o = idle();
        o.request(Q::RequestInfo).unwrap();
        o.request(Q::WindowUpdate).unwrap();
        o.request(Q::CloseSend).unwrap();
        o.request(Q::WindowUpdate).unwrap();
        o.response(R::Header).unwrap();
        o.response(R::Trailer).unwrap();
        o.request(Q::WindowUpdate).unwrap();
        assert!(o.is_done());
    }

    #[test]
    fn empty_frames_are_rejected() {
        assert!(pb::ConnectRequest { msg: None }.kind().is_err());
        assert!(pb::ConnectResponse { msg: None }.kind().is_err());
    }

    #[test]
    fn violation_maps_to_invalid_argument() {
        let s: tonic::Status = FrameOrder::new().response(R::Header).unwrap_err().into();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
    }
}

/// Arbitrary frame sequences against a reference model written from the grammar in the module
/// documentation (not from the state machine above).
#[cfg(test)]
mod proptests {
    use proptest::prelude::*;
    use prost::Message;

    use super::RequestFrame as Q;
    use super::ResponseFrame as R;
    use super::*;

    #[derive(Clone, Copy, Debug)]
    enum Event {
        /// kas -> agentk.
        Request(Q),
        /// agentk -> kas.
        Response(R),
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            prop_oneof![Just(Q::RequestInfo), Just(Q::Message), Just(Q::CloseSend), Just(Q::WindowUpdate)]
                .prop_map(Event::Request),
            prop_oneof![Just(R::Descriptor), Just(R::Header), Just(R::Message), Just(R::Trailer), Just(R::Error)]
                .prop_map(Event::Response),
        ]
    }

    /// What has been seen so far, as the grammar talks about it:
    /// `agentk: Descriptor ... Header Message* (Trailer | Error)` (Error may replace the Header),
    /// `kas: RequestInfo Message* CloseSend`, RequestInfo only after the Descriptor, the answer
    /// only after RequestInfo, WindowUpdate anywhere after RequestInfo.
    #[derive(Clone, Copy, Debug, Default)]
    struct Model {
        descriptor: bool,
        request_info: bool,
        close_send: bool,
        header: bool,
        ended: bool,
    }

    impl Model {
        /// `Err((frame, state))`: the documented error text parts.
        fn request(&mut self, f: Q) -> Result<(), (&'static str, &'static str)> {
            match f {
                Q::RequestInfo => {
                    if self.request_info {
                        return Err((
                            "RequestInfo",
                            if self.close_send { "after CloseSend" } else { "after RequestInfo" },
                        ));
                    }
                    if !self.descriptor {
                        return Err(("RequestInfo", "before the Descriptor"));
                    }
                    self.request_info = true;
                }
                Q::Message | Q::CloseSend => {
                    let name = if f == Q::Message { "Message" } else { "CloseSend" };
                    if !self.request_info {
                        return Err((name, "before RequestInfo"));
                    }
                    if self.close_send {
                        return Err((name, "after CloseSend"));
                    }
                    self.close_send = f == Q::CloseSend;
                }
                Q::WindowUpdate => {
                    if !self.request_info {
                        return Err(("WindowUpdate", "before RequestInfo"));
                    }
                }
            }
            Ok(())
        }

        fn response(&mut self, f: R) -> Result<(), (&'static str, &'static str)> {
            let state = if !self.descriptor {
                "before the Descriptor"
            } else if self.ended {
                "after the response ended"
            } else if !self.request_info {
                "before the request was sent"
            } else if !self.header {
                "before the Header"
            } else {
                "after the Header"
            };
            let ok = match f {
                R::Descriptor => !self.descriptor,
                R::Header => self.request_info && !self.header && !self.ended,
                R::Message => self.header && !self.ended,
                R::Trailer => self.header && !self.ended,
                R::Error => self.request_info && !self.ended,
            };
            if !ok {
                return Err((response_name(f), state));
            }
            match f {
                R::Descriptor => self.descriptor = true,
                R::Header => self.header = true,
                R::Message => {}
                R::Trailer | R::Error => self.ended = true,
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any interleaving of frames: the machine accepts exactly what the grammar accepts,
        /// refuses the rest with the documented message, and a refused frame changes nothing
        /// (the tunnel is ended by the caller; the machine itself is not poisoned).
        #[test]
        fn frame_order_matches_the_documented_grammar(
            after_descriptor in any::<bool>(),
            events in proptest::collection::vec(event(), 0..24),
        ) {
            let (mut machine, mut model) = if after_descriptor {
                (FrameOrder::after_descriptor(), Model { descriptor: true, ..Model::default() })
            } else {
                (FrameOrder::new(), Model::default())
            };
            for e in events {
                let before = machine.clone();
                let (got, want) = match e {
                    Event::Request(f) => (machine.request(f), model.request(f)),
                    Event::Response(f) => (machine.response(f), model.response(f)),
                };
                match (&got, want) {
                    (Ok(()), Ok(())) => {}
                    (Err(err), Err((frame, state))) => {
                        prop_assert_eq!(err, &FrameOrderError { frame, state });
                        prop_assert_eq!(
                            err.to_string(),
                            format!("tunnel protocol violation: unexpected {frame} frame {state}")
                        );
                        let status: tonic::Status = err.clone().into();
                        prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
                        prop_assert_eq!(format!("{:?}", &machine), format!("{:?}", before), "a refused frame changed the state");
                    }
                    _ => prop_assert!(false, "{e:?}: machine {got:?}, grammar {want:?} (model {model:?})"),
                }
                prop_assert_eq!(machine.is_idle(), model.descriptor && !model.request_info);
                prop_assert_eq!(machine.is_done(), model.ended);
            }
        }

        /// Whatever bytes a peer sends as a tunnel frame: decoding never panics, and a decoded
        /// frame either has a kind or is refused as empty.
        #[test]
        fn arbitrary_bytes_as_tunnel_frames(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(frame) = pb::ConnectRequest::decode(data.as_slice()) {
                match frame.kind() {
                    Ok(_) => prop_assert!(frame.msg.is_some()),
                    Err(e) => {
                        prop_assert!(frame.msg.is_none());
                        prop_assert_eq!(e.frame, "empty");
                    }
                }
            }
            if let Ok(frame) = pb::ConnectResponse::decode(data.as_slice()) {
                prop_assert_eq!(frame.kind().is_ok(), frame.msg.is_some());
            }
        }

        /// Any status code and message from agentk's Error frame becomes a tonic status
        /// (unknown codes are `Unknown`), never a panic.
        #[test]
        fn arbitrary_error_frames_become_statuses(code in any::<i32>(), message in ".{0,40}") {
            let status: tonic::Status = pb::Error { code, message: message.clone() }.into();
            prop_assert_eq!(status.message(), message.as_str());
            if !(0..=16).contains(&code) {
                prop_assert_eq!(status.code(), tonic::Code::Unknown);
            }
        }
    }
}
