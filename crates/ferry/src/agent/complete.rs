//! How an agent's request completes: checked against the peer's life, and, with a
//! notification, the notification sent when the transfer lands, whether or not the caller
//! ever waits for the request.
//!
//! A request with a notification registers a waker on the engine's request (the request
//! module's completion callback: the engine's thread, or its waiter thread, wakes it when the
//! copy ends). The waker hands the request to the agent's progress thread, which sends the
//! notification over the socket (never on the engine's thread) and then completes the
//! caller's request with the result. A caller who waits or polls first finishes the request
//! itself; the message is sent once, by whichever comes first.

use super::{lock, wire, AgentError, PeerInner};
use crate::request::{BackendError, Completion, Request, RequestError, Signal};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};

fn backend(e: AgentError) -> RequestError {
    RequestError::Backend(BackendError::new(e))
}

/// The agent's request around the engine's: the engine's result, then the peer's life (a peer
/// that has exited fails the request with [`AgentError::PeerGone`]).
pub(super) fn wrap(
    progress: &Mutex<Option<Sender<Arc<Notified>>>>,
    inner: Request,
    peer: &Arc<PeerInner>,
    notify: Option<&[u8]>,
) -> Result<Request, AgentError> {
    let Some(msg) = notify else {
        return Ok(Request::new(Checked {
            inner,
            peer: Arc::clone(peer),
        }));
    };
    let tx = {
        let mut p = lock(progress);
        if p.is_none() {
            *p = Some(start_progress()?);
        }
        p.as_ref().expect("started above").clone()
    };
    let n = Arc::new(Notified {
        inner,
        peer: Arc::clone(peer),
        msg: Mutex::new(Some(msg.to_vec())),
        done: Signal::new(),
        tx,
    });
    // Landed already (a small copy run at submit): the message goes now, from this thread.
    if let Some(r) = n.inner.completion().poll_done() {
        n.finish(r);
    } else {
        n.inner
            .completion()
            .register_waker(&Waker::from(Arc::clone(&n)));
    }
    Ok(Request::new(NotifiedRequest(n)))
}

/// The agent's progress thread: sends the notifications of requests whose transfer landed.
/// Ends once every request and the agent have dropped their sender.
fn start_progress() -> Result<Sender<Arc<Notified>>, AgentError> {
    let (tx, rx) = mpsc::channel::<Arc<Notified>>();
    std::thread::Builder::new()
        .name("ferry-agent-progress".into())
        .spawn(move || {
            for n in rx {
                match n.inner.completion().poll_done() {
                    Some(r) => n.finish(r),
                    // A wake before the end (allowed of wakers): wait for the next one.
                    None => n
                        .inner
                        .completion()
                        .register_waker(&Waker::from(Arc::clone(&n))),
                }
            }
        })
        .map_err(super::io_err("start the agent's progress thread"))?;
    Ok(tx)
}

/// A request checked against its peer's life when seen complete.
struct Checked {
    inner: Request,
    peer: Arc<PeerInner>,
}

impl Checked {
    fn finish(&self, r: Result<(), RequestError>) -> Result<(), RequestError> {
        r?;
        if self.peer.gone_after_transfer() {
            return Err(backend(self.peer.gone()));
        }
        Ok(())
    }
}

impl Completion for Checked {
    fn wait(&self) -> Result<(), RequestError> {
        self.finish(self.inner.completion().wait())
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        self.inner.completion().poll_done().map(|r| self.finish(r))
    }
    fn register_waker(&self, waker: &Waker) {
        self.inner.completion().register_waker(waker)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A request whose notification goes to the peer when its transfer lands.
pub(super) struct Notified {
    inner: Request,
    peer: Arc<PeerInner>,
    /// Taken by whoever sends it (the progress thread or a waiting caller).
    msg: Mutex<Option<Vec<u8>>>,
    /// The request's result, notification included.
    done: Signal,
    tx: Sender<Arc<Notified>>,
}

impl Notified {
    /// The engine's request ended with `r`: unless another thread already did, checks the
    /// peer, sends the message and completes `done`.
    fn finish(&self, r: Result<(), RequestError>) {
        let Some(msg) = lock(&self.msg).take() else {
            return; // the other thread sends it and completes `done`
        };
        let r = r.and_then(|()| {
            if self.peer.gone_after_transfer() {
                return Err(backend(self.peer.gone()));
            }
            wire::notify(&self.peer, &msg).map_err(backend)
        });
        self.done.complete(r);
    }
}

impl Wake for Notified {
    fn wake(self: Arc<Self>) {
        let me = Arc::clone(&self);
        if let Err(mpsc::SendError(n)) = self.tx.send(me) {
            // No progress thread (it cannot end while a sender lives; kept for safety): here.
            if let Some(r) = n.inner.completion().poll_done() {
                n.finish(r);
            }
        }
    }
}

/// The caller's handle on a [`Notified`]: its result, and (as [`Checked`]) a peer that has
/// exited by the time it is seen complete fails it.
struct NotifiedRequest(Arc<Notified>);

impl NotifiedRequest {
    fn seen(&self, r: Result<(), RequestError>) -> Result<(), RequestError> {
        r?;
        if self.0.peer.gone_after_transfer() {
            return Err(backend(self.0.peer.gone()));
        }
        Ok(())
    }
}

impl Completion for NotifiedRequest {
    fn wait(&self) -> Result<(), RequestError> {
        let n = &self.0;
        if n.done.poll_done().is_none() {
            // Finish it here rather than wait for the progress thread's wake-up.
            n.finish(n.inner.completion().wait());
        }
        self.seen(n.done.wait())
    }
    fn poll_done(&self) -> Option<Result<(), RequestError>> {
        let n = &self.0;
        if n.done.poll_done().is_none() {
            n.finish(n.inner.completion().poll_done()?);
        }
        n.done.poll_done().map(|r| self.seen(r))
    }
    fn register_waker(&self, waker: &Waker) {
        self.0.done.register_waker(waker)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
