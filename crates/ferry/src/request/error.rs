//! Why a request failed: [`RequestError`], the same for every engine. It names no backend: a
//! backend's own failure travels as a [`BackendError`] (the backend's error, kept whole), and
//! each backend adds its conversions and accessors beside its own error types (the CUDA
//! engine's `RequestError::driver_error`).

use std::sync::Arc;
use thiserror::Error;

/// Why one request failed. Other requests are not affected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RequestError {
    /// A custom operator returned an error.
    #[error("operator `{op}` failed: {msg}")]
    Operator {
        /// The operator's name.
        op: String,
        /// Its message.
        msg: String,
    },
    /// A custom operator (or other user code run by the engine) panicked. The engine stays
    /// usable.
    #[error("operator `{op}` panicked: {msg}")]
    Panicked {
        /// The operator's name.
        op: String,
        /// The panic message.
        msg: String,
    },
    /// The backend failed: a driver call (the driver's own code kept: match out-of-memory
    /// with `driver_error()`, which the CUDA engine adds to this type), a helper the request
    /// needed and could not make (a staging ring's pinned memory, a thread), a collective.
    /// The backend's own error is kept whole ([`BackendError::downcast_ref`]).
    #[error(transparent)]
    Backend(BackendError),
    /// A request this one depends on failed, so this one did not run.
    #[error("dependency failed: {0}")]
    Dependency(Box<RequestError>),
    /// The engine shut down or lost the worker before the request ran.
    #[error("engine stopped before the request completed: {0}")]
    Aborted(String),
    /// File I/O failed.
    #[error("I/O error: {0}")]
    Io(String),
    /// The work did not complete in time and the engine gave up on it (the NCCL engine aborts
    /// its communicator: later requests on it fail too).
    #[error("timed out after {after:?}: {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The limit.
        after: std::time::Duration,
    },
}

/// A backend's own error, kept whole behind the backend-neutral [`RequestError`] and
/// [`SubmitError`](crate::SubmitError): a CUDA [`DriverError`](crate::cuda::DriverError) or
/// [`CudaError`](crate::cuda::CudaError), an NCCL error, and so on. [`BackendError::downcast_ref`]
/// reaches the backend's type; its `Display` and `source` are the backend error's.
///
/// Two are equal when their `Debug` forms are: the backend types derive `Debug`, which names
/// the type and every field.
#[derive(Clone)]
pub struct BackendError(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl BackendError {
    /// Keeps `e` whole.
    pub fn new<E: std::error::Error + Send + Sync + 'static>(e: E) -> BackendError {
        BackendError(Arc::new(e))
    }

    /// The backend's error as its own type, if it is one.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }

    /// The backend's error.
    pub fn get(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl std::fmt::Debug for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&*self.0, f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for BackendError {
    fn eq(&self, other: &BackendError) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

impl Eq for BackendError {}

#[cfg(test)]
mod tests {
    use super::{BackendError, RequestError};

    #[derive(Debug, thiserror::Error)]
    #[error("backend failed: {0}")]
    struct Mine(u32);

    #[test]
    fn a_backend_error_is_kept_whole() {
        let e = RequestError::Backend(BackendError::new(Mine(7)));
        assert_eq!(e.to_string(), "backend failed: 7");
        let RequestError::Backend(b) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(b.downcast_ref::<Mine>().map(|m| m.0), Some(7));
        assert!(b.downcast_ref::<std::io::Error>().is_none());
        // Equal when the backend's error is the same; a clone is equal to its original.
        assert_eq!(e, RequestError::Backend(BackendError::new(Mine(7))));
        assert_eq!(e, e.clone());
        assert_ne!(e, RequestError::Backend(BackendError::new(Mine(8))));
        let other = BackendError::new(std::io::Error::other("backend failed: 7"));
        assert_ne!(e, RequestError::Backend(other));
    }
}
