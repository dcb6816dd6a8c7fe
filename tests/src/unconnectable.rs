//! [`Unconnectable`]: an address where a TCP connect hangs, as to a host that is down or
//! firewalled, rather than being refused.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// A loopback listener whose accept queue is full: the kernel drops further SYNs, so a connect
/// to [`Unconnectable::address`] hangs. The listener is never accepted from; the connections
/// held here keep its queue full for as long as this value lives.
pub struct Unconnectable {
    address: SocketAddr,
    _listener: TcpListener,
    _held: Vec<TcpStream>,
}

impl Unconnectable {
    pub async fn bind() -> Self {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
        let address = socket.local_addr().expect("address");
        let listener = socket.listen(0).expect("listen");
        let mut held = Vec::new();
        // The queue holds backlog + 1 connections; the first connect that does not complete
        // within a second (slack for a loaded machine) shows it is full.
        loop {
            match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(address)).await {
                Ok(Ok(s)) => held.push(s),
                Ok(Err(e)) => panic!("connect: {e}"),
                Err(_) => break,
            }
            assert!(held.len() < 64, "the accept queue never filled");
        }
        Self { address, _listener: listener, _held: held }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }
}
