//! How a request is known done: its completion event ([`event`]: the request's shared state,
//! the event pool, the waiter thread), when that event is recorded ([`mark`]: the one place
//! that decides eager, lazy or stamped marking), completion words ([`stamp`]) and how a thread
//! waits ([`wait`]: the expected-end schedule). The policy between the plain and the tuned
//! machinery is [`CompletionPolicy`](super::CompletionPolicy) in the engine's config.

pub(crate) mod event;
pub(crate) mod mark;
pub(crate) mod stamp;
pub(crate) mod wait;
