//! The cap on open HTTP connections (`http.max_connections`), used by [`super::server`]'s
//! accept loop.
//!
//! Each connection holds a [`Ticket`] while it is open. At the cap, a new connection takes the
//! place of the oldest one that is not handling a request (still reading its headers, idle
//! between requests, or waiting for the client to send more of a request's body): that one is
//! told to close. Slow clients thus cannot keep a prompt one
//! out (it is the newest, and it is busy once its headers are in), and the server never holds
//! many more descriptors than the cap. When every connection is busy, or too many evicted ones
//! are still closing, the new connection is refused: the caller closes it at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

/// Evicted connections not yet closed past which new connections are refused instead, so
/// that a flood of connections cannot outrun the closing of the old ones.
const MAX_CLOSING: usize = 32;

/// How often [`Connections::admit_within`] looks again for a connection whose request ended.
const BUSY_RECHECK: std::time::Duration = std::time::Duration::from_millis(5);

/// The open connections, oldest first.
pub struct Connections {
    max: usize,
    registry: Mutex<Registry>,
    /// Told when an evicted connection has closed.
    closed: tokio::sync::Notify,
}

#[derive(Default)]
struct Registry {
    open: BTreeMap<u64, Slot>,
    next: u64,
    /// Evicted, not yet closed.
    closing: usize,
}

struct Slot {
    busy: Arc<AtomicUsize>,
    /// Of the busy requests, those waiting for the client to send more of their body: as
    /// idle as a connection reading its headers.
    waiting: Arc<AtomicUsize>,
    evict: CancellationToken,
}

impl Slot {
    /// Not answering anything: no request, or only requests that wait for their client.
    fn idle(&self) -> bool {
        self.busy.load(Ordering::Acquire) <= self.waiting.load(Ordering::Acquire)
    }
}

/// What [`Connections::admit`] decided.
pub enum Admission {
    /// Room was free.
    Admitted(Ticket),
    /// The oldest idle connection was told to close to make room.
    Evicted(Ticket),
    /// No room: close the new connection.
    Refused(Full),
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Every connection is answering a request.
    Busy,
    /// [`MAX_CLOSING`] evicted connections are still closing.
    Closing,
}

impl Connections {
    pub fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max: max.max(1),
            registry: Mutex::new(Registry::default()),
            closed: tokio::sync::Notify::new(),
        })
    }

    /// [`Connections::admit`], waiting up to `bound` for room: for evicted connections to
    /// close (a flood of reconnecting slow clients evicts faster than a loaded machine runs
    /// the evicted connections' tasks), or for a busy one to end its request (a flood of
    /// requests answered at once fills the places kept from waiting requests). A prompt
    /// client (a probe) refused then would fail. The listener's backlog holds the next
    /// connections meanwhile.
    pub async fn admit_within(self: &Arc<Self>, bound: std::time::Duration) -> Admission {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            let full = match self.admit() {
                Admission::Refused(full) => full,
                admission => return admission,
            };
            if tokio::time::Instant::now() >= deadline {
                return Admission::Refused(full);
            }
            // A request ending is not told: looked at again every few milliseconds.
            let again = tokio::time::Instant::now() + BUSY_RECHECK;
            let _ = tokio::time::timeout_at(again.min(deadline), closed).await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Make room for a new connection, if there is or can be some.
    pub fn admit(self: &Arc<Self>) -> Admission {
        let mut registry = self.lock();
        let mut evicted = false;
        if registry.open.len() >= self.max {
            if registry.closing >= MAX_CLOSING {
                return Admission::Refused(Full::Closing);
            }
            let oldest_idle = registry
                .open
                .iter()
                .find(|(_, slot)| slot.idle())
                .map(|(id, _)| *id);
            let Some(id) = oldest_idle else {
                return Admission::Refused(Full::Busy);
            };
            if let Some(slot) = registry.open.remove(&id) {
                slot.evict.cancel();
                registry.closing += 1;
                evicted = true;
            }
        }
        let id = registry.next;
        registry.next += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let waiting = Arc::new(AtomicUsize::new(0));
        let evict = CancellationToken::new();
        registry.open.insert(
            id,
            Slot {
                busy: Arc::clone(&busy),
                waiting: Arc::clone(&waiting),
                evict: evict.clone(),
            },
        );
        let ticket = Ticket {
            connections: Arc::clone(self),
            id,
            busy,
            waiting,
            evict,
        };
        if evicted {
            Admission::Evicted(ticket)
        } else {
            Admission::Admitted(ticket)
        }
    }
}

/// One open connection's place; dropping it frees the place.
pub struct Ticket {
    connections: Arc<Connections>,
    id: u64,
    busy: Arc<AtomicUsize>,
    waiting: Arc<AtomicUsize>,
    evict: CancellationToken,
}

impl Ticket {
    /// Cancelled when a newer connection took this one's place.
    pub fn eviction(&self) -> CancellationToken {
        self.evict.clone()
    }

    /// `future`, with this connection counted as busy until it ends (or is dropped).
    pub fn busy_while<F: Future + Send + 'static>(
        &self,
        future: F,
    ) -> Pin<Box<dyn Future<Output = F::Output> + Send>> {
        let busy = Busy::enter(&self.busy);
        Box::pin(async move {
            let _busy = busy;
            future.await
        })
    }
}

impl Ticket {
    /// What a request's body counts itself in while it waits for the client to send more.
    pub fn waiting(&self) -> Waiting {
        Waiting(Arc::clone(&self.waiting))
    }
}

/// The count of a connection's requests waiting for their client; see [`Waiting::enter`].
#[derive(Clone)]
pub struct Waiting(Arc<AtomicUsize>);

impl Waiting {
    /// Counted as waiting for the client until the guard is dropped.
    pub fn enter(&self) -> WaitingGuard {
        WaitingGuard {
            _busy: Busy::enter(&self.0),
        }
    }
}

/// One request waiting for its client.
pub struct WaitingGuard {
    _busy: Busy,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut registry = self.connections.lock();
        if registry.open.remove(&self.id).is_none() {
            registry.closing = registry.closing.saturating_sub(1);
            drop(registry);
            self.connections.closed.notify_waiters();
        }
    }
}

/// One request in progress on a connection.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(busy: &Arc<AtomicUsize>) -> Busy {
        busy.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(busy))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(admission: Admission) -> Ticket {
        match admission {
            Admission::Admitted(ticket) | Admission::Evicted(ticket) => ticket,
            Admission::Refused(_) => panic!("refused"),
        }
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room_and_busy_ones_stay() {
        let connections = Connections::new(2);
        let first = ticket(connections.admit());
        let second = ticket(connections.admit());
        let _request = Busy::enter(&first.busy);
        let third = match connections.admit() {
            Admission::Evicted(ticket) => ticket,
            _ => panic!("expected an eviction"),
        };
        assert!(!first.evict.is_cancelled(), "a busy connection was evicted");
        assert!(second.evict.is_cancelled(), "the oldest idle one stayed");
        let _also_busy = Busy::enter(&third.busy);
        drop(second);
        assert!(matches!(connections.admit(), Admission::Refused(_)));
    }

    #[test]
    fn a_request_waiting_for_its_body_leaves_its_connection_evictable() {
        let connections = Connections::new(1);
        let only = ticket(connections.admit());
        let _request = Busy::enter(&only.busy);
        let waiting = only.waiting();
        let guard = waiting.enter();
        assert!(matches!(connections.admit(), Admission::Evicted(_)));
        assert!(only.evict.is_cancelled());

        let connections = Connections::new(1);
        let only = ticket(connections.admit());
        let _request = Busy::enter(&only.busy);
        drop(guard);
        assert!(
            matches!(connections.admit(), Admission::Refused(_)),
            "a request being answered keeps its connection"
        );
    }

    #[test]
    fn a_closed_connection_frees_its_place() {
        let connections = Connections::new(1);
        let only = ticket(connections.admit());
        let busy = Busy::enter(&only.busy);
        assert!(matches!(connections.admit(), Admission::Refused(_)));
        drop(busy);
        drop(only);
        assert!(matches!(connections.admit(), Admission::Admitted(_)));
    }

    #[test]
    fn too_many_evicted_connections_still_closing_refuse_new_ones() {
        let connections = Connections::new(1);
        let mut held = vec![ticket(connections.admit())];
        for _ in 0..MAX_CLOSING {
            held.push(ticket(connections.admit()));
        }
        assert!(matches!(
            connections.admit(),
            Admission::Refused(Full::Closing)
        ));
        held.remove(0);
        assert!(matches!(connections.admit(), Admission::Evicted(_)));
    }

    #[tokio::test]
    async fn a_connection_waits_for_a_busy_one_to_end_its_request_rather_than_be_refused() {
        let connections = Connections::new(1);
        let only = ticket(connections.admit());
        let busy = Busy::enter(&only.busy);
        let ending = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(busy);
        });
        let admission = connections
            .admit_within(std::time::Duration::from_secs(5))
            .await;
        assert!(matches!(admission, Admission::Evicted(_)));
        ending.await.unwrap();
    }

    #[tokio::test]
    async fn a_connection_waits_for_an_evicted_one_to_close_rather_than_be_refused() {
        let connections = Connections::new(1);
        let mut held = vec![ticket(connections.admit())];
        for _ in 0..MAX_CLOSING {
            held.push(ticket(connections.admit()));
        }
        let closing = held.remove(0);
        let closer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(closing);
        });
        let admission = connections
            .admit_within(std::time::Duration::from_secs(5))
            .await;
        assert!(matches!(admission, Admission::Evicted(_)));
        closer.await.unwrap();
        let refused = connections
            .admit_within(std::time::Duration::from_millis(20))
            .await;
        assert!(matches!(refused, Admission::Refused(Full::Closing)));
    }
}
