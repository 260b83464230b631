//! Which TCP connections the gRPC server takes, and for how long: at most
//! a number at once, at most a share of them from one address, and none
//! that sends nothing. Connections cost the server buffers and a file
//! descriptor each whatever they do, so a client that opens many and
//! sends nothing (or stops sending) must not lock others out.
//!
//! - A connection past the limit, or past its address's share, is closed
//!   as it arrives.
//! - One that sends no byte within [`PREFACE_TIMEOUT`] (an HTTP/2 client
//!   sends its preface at once) is closed, and so is one from which
//!   nothing arrives for [`IDLE_TIMEOUT`] (a client with calls open sends
//!   HTTP/2 pings; the worker and cluster nodes do).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::ReadBuf;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::TcpListenerStream;

/// How long a new connection may take to send its first byte.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may send nothing at all before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Connections from one address at most, as a share of the limit: the
/// rest stays for others. A small limit is not split below
/// [`ADDRESS_FLOOR`], since one host may run several workers.
const ADDRESS_SHARE: usize = 4;
const ADDRESS_FLOOR: usize = 16;

/// Connections held per address, so that one address gets at most its
/// share.
#[derive(Debug, Default)]
struct PerAddress {
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    fn take(self: &Arc<Self>, address: IpAddr, limit: usize) -> Option<AddressPermit> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(address).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(AddressPermit {
            of: Arc::clone(self),
            address,
        })
    }
}

/// One connection counted against its address until dropped.
#[derive(Debug)]
struct AddressPermit {
    of: Arc<PerAddress>,
    address: IpAddr,
}

impl Drop for AddressPermit {
    fn drop(&mut self) {
        let mut held = self.of.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.address);
            }
        }
    }
}

/// Accepted connections with Nagle's algorithm off (calls are small
/// request/answer exchanges, and Nagle's wait for an ACK, which the peer
/// delays, would add tens of milliseconds to each one), at most `limit`
/// at once and a quarter of that (at least 16, at most `limit`) from one
/// address.
pub(crate) fn incoming(
    listener: TcpListener,
    limit: usize,
) -> impl futures::Stream<Item = std::io::Result<Admitted>> {
    use futures::StreamExt;
    static REFUSED: crate::throttle::Throttle =
        crate::throttle::Throttle::new(Duration::from_secs(10));
    let slots = Arc::new(tokio::sync::Semaphore::new(limit));
    let per_address = Arc::new(PerAddress::default());
    let address_limit = (limit / ADDRESS_SHARE).max(ADDRESS_FLOOR).min(limit);
    TcpListenerStream::new(listener).filter_map(move |accepted| {
        let admitted = match accepted {
            Ok(stream) => {
                let address = stream.peer_addr().ok().map(|peer| peer.ip());
                let from_address =
                    address.and_then(|address| per_address.take(address, address_limit));
                let slot = Arc::clone(&slots).try_acquire_owned().ok();
                match (slot, from_address) {
                    (Some(slot), Some(from_address)) => {
                        let _ = stream.set_nodelay(true);
                        Some(Ok(Admitted::new(stream, slot, from_address)))
                    }
                    (slot, _) => {
                        if let Some(suppressed) = REFUSED.admit() {
                            let why = if slot.is_none() {
                                "too many connections"
                            } else {
                                "too many connections from one address"
                            };
                            tracing::warn!(
                                limit,
                                address_limit,
                                ?address,
                                suppressed,
                                "{why}; closing a new one"
                            );
                        }
                        None
                    }
                }
            }
            Err(error) => Some(Err(error)),
        };
        std::future::ready(admitted)
    })
}

/// An accepted connection, its place among those served at once, and the
/// clock that closes it when it sends nothing.
pub(crate) struct Admitted {
    stream: TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
    _from_address: AddressPermit,
    // When a byte last arrived, and whether one ever did.
    last_read: Instant,
    heard: bool,
    // Fires when the connection may have been quiet too long; reset to
    // the new limit when it was not (reads only note the time).
    quiet: Pin<Box<Sleep>>,
}

impl Admitted {
    fn new(
        stream: TcpStream,
        slot: tokio::sync::OwnedSemaphorePermit,
        from_address: AddressPermit,
    ) -> Self {
        let now = Instant::now();
        Self {
            stream,
            _slot: slot,
            _from_address: from_address,
            last_read: now,
            heard: false,
            quiet: Box::pin(tokio::time::sleep_until(now + PREFACE_TIMEOUT)),
        }
    }

    /// Ready with an error once the connection was quiet past its limit.
    fn poll_quiet(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        loop {
            if self.quiet.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let limit = if self.heard {
                IDLE_TIMEOUT
            } else {
                PREFACE_TIMEOUT
            };
            let until = self.last_read + limit;
            if Instant::now() >= until {
                let what = if self.heard {
                    "nothing arrived"
                } else {
                    "no HTTP/2 preface arrived"
                };
                tracing::debug!(?limit, "{what}; closing the connection");
                return Poll::Ready(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{what} within {limit:?}"),
                ));
            }
            self.quiet.as_mut().reset(until);
        }
    }
}

impl tonic::transport::server::Connected for Admitted {
    type ConnectInfo = <TcpStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl tokio::io::AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last_read = Instant::now();
                    self.heard = true;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => self.poll_quiet(cx).map(Err),
            failed @ Poll::Ready(Err(_)) => failed,
        }
    }
}

impl tokio::io::AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_gets_its_share_and_a_connection_gone_frees_its_place() {
        let per_address = Arc::new(PerAddress::default());
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = per_address.take(a, 2).unwrap();
        let _second = per_address.take(a, 2).unwrap();
        assert!(per_address.take(a, 2).is_none(), "a third from one address");
        let _other = per_address.take(b, 2).expect("room for another address");
        drop(first);
        assert!(per_address.take(a, 2).is_some(), "a place freed");
    }
}
