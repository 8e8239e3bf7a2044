//! A fault-injecting TCP proxy between the daemon and PostgreSQL. It speaks just enough of the
//! wire protocol to find one statement: it frames the client's messages (the startup packet,
//! then type byte + length) and the server's, and acts once on the first client message whose
//! text contains a needle (the finish's `Parse`):
//!
//! - [`Fault::DropBeforeSend`]: the message never reaches the server; both sockets close.
//! - [`Fault::DropAfterReply`]: the message and what follows it go to the server, which runs
//!   and commits it; its reply, up to `ReadyForQuery`, is swallowed and both sockets close.
//!   The server committed; the client cannot know.
//! - [`Fault::HalfOpen`]: from that message on nothing passes either way, and both sockets
//!   stay open, as with a peer that vanished without a reset.
//!
//! Every other connection, and everything after the fault, is forwarded untouched.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    DropBeforeSend,
    DropAfterReply,
    HalfOpen,
}

/// What one connection is doing about the fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Forwarding,
    /// The needle went to the server: swallow replies until ReadyForQuery, then close.
    SwallowingReply,
    /// Pass nothing, close nothing.
    Held,
    Closed,
}

pub struct Proxy {
    pub port: u16,
    triggered: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `target`, with `fault` armed for the
    /// first client message containing `needle`.
    pub async fn start(target: SocketAddr, fault: Fault, needle: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(true));
        let triggered = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let triggered = Arc::clone(&triggered);
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    let Ok(server) = TcpStream::connect(target).await else {
                        continue;
                    };
                    let (armed, triggered) = (Arc::clone(&armed), Arc::clone(&triggered));
                    tokio::spawn(connection(client, server, fault, needle, armed, triggered));
                }
            }
        });
        Proxy {
            port,
            triggered,
            task,
        }
    }

    /// Whether the fault has happened.
    pub fn triggered(&self) -> bool {
        self.triggered.load(Ordering::SeqCst)
    }

    /// A key=value connection string through this proxy.
    pub fn conninfo(&self, user: &str, dbname: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname={dbname} sslmode=disable",
            self.port
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn connection(
    client: TcpStream,
    server: TcpStream,
    fault: Fault,
    needle: &'static str,
    armed: Arc<AtomicBool>,
    triggered: Arc<AtomicBool>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (phase_tx, phase_rx) = watch::channel(Phase::Forwarding);
    let phase_tx = Arc::new(phase_tx);
    let upstream = tokio::spawn(client_to_server(
        client_read,
        server_write,
        fault,
        needle,
        armed,
        triggered,
        Arc::clone(&phase_tx),
    ));
    let downstream = tokio::spawn(server_to_client(
        server_read,
        client_write,
        phase_tx,
        phase_rx,
    ));
    let _ = upstream.await;
    let _ = downstream.await;
}

/// Read one whole message: `typed` ones start with a type byte; the length includes itself.
async fn read_message(reader: &mut OwnedReadHalf, typed: bool) -> Option<Vec<u8>> {
    let mut message = Vec::new();
    if typed {
        message.push(reader.read_u8().await.ok()?);
    }
    let length = reader.read_u32().await.ok()?;
    message.extend_from_slice(&length.to_be_bytes());
    let mut body = vec![0; (length as usize).checked_sub(4)?];
    reader.read_exact(&mut body).await.ok()?;
    message.extend_from_slice(&body);
    Some(message)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn client_to_server(
    mut client: OwnedReadHalf,
    mut server: OwnedWriteHalf,
    fault: Fault,
    needle: &'static str,
    armed: Arc<AtomicBool>,
    triggered: Arc<AtomicBool>,
    phase: Arc<watch::Sender<Phase>>,
) {
    let mut typed = false;
    while let Some(message) = read_message(&mut client, typed).await {
        typed = true;
        let current = *phase.borrow();
        match current {
            Phase::Closed => return,
            Phase::Held => continue,
            Phase::Forwarding | Phase::SwallowingReply => {}
        }
        let hit = current == Phase::Forwarding
            && contains(&message, needle.as_bytes())
            && armed.swap(false, Ordering::SeqCst);
        if hit {
            triggered.store(true, Ordering::SeqCst);
            match fault {
                Fault::DropBeforeSend => {
                    phase.send_replace(Phase::Closed);
                    return;
                }
                Fault::HalfOpen => {
                    phase.send_replace(Phase::Held);
                    continue;
                }
                Fault::DropAfterReply => {
                    phase.send_replace(Phase::SwallowingReply);
                }
            }
        }
        if server.write_all(&message).await.is_err() {
            phase.send_replace(Phase::Closed);
            return;
        }
    }
    // The client went away: so does the server connection (unless the fault holds it open).
    if *phase.borrow() != Phase::Held {
        phase.send_replace(Phase::Closed);
    } else {
        std::future::pending::<()>().await;
    }
}

async fn server_to_client(
    mut server: OwnedReadHalf,
    mut client: OwnedWriteHalf,
    phase_tx: Arc<watch::Sender<Phase>>,
    mut phase: watch::Receiver<Phase>,
) {
    loop {
        let message = tokio::select! {
            message = read_message(&mut server, true) => message,
            _ = phase.wait_for(|p| *p == Phase::Closed) => None,
        };
        let Some(message) = message else {
            if *phase.borrow() == Phase::Held {
                // Keep the client's socket open, passing nothing.
                std::future::pending::<()>().await;
            }
            phase_tx.send_replace(Phase::Closed);
            return; // dropping the write half closes the client's side
        };
        let current = *phase.borrow();
        match current {
            Phase::Forwarding => {
                if client.write_all(&message).await.is_err() {
                    phase_tx.send_replace(Phase::Closed);
                    return;
                }
            }
            Phase::SwallowingReply => {
                if message[0] == b'Z' {
                    // The server has answered the statement and committed it.
                    phase_tx.send_replace(Phase::Closed);
                    return;
                }
            }
            Phase::Held => {}
            Phase::Closed => return,
        }
    }
}
