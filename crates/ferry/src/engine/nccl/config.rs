//! [`NcclConfig`]: which rank on which GPU, the shared id and the timeouts; set in code or read
//! from `FERRY_NCCL_*`.

use super::error::NcclError;
use super::id::NcclId;
use std::time::Duration;

/// Settings of an [`NcclEngine`](super::NcclEngine): plain struct, `NcclConfig::new(..)` then
/// chained setters, or [`NcclConfig::from_env`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclConfig {
    /// The GPU this rank uses (an ordinal of this host).
    pub ordinal: u32,
    /// This rank, `0..nranks`.
    pub rank: u32,
    /// Ranks in the communicator.
    pub nranks: u32,
    /// The id shared by every rank.
    pub id: NcclId,
    /// How long joining the communicator may take (every rank must arrive) before it is
    /// aborted.
    pub init_timeout: Duration,
    /// How long a submit or a request may take before the communicator is aborted.
    pub timeout: Duration,
    /// A blocking communicator (default false: non-blocking). Non-blocking, NCCL runs each
    /// group's set-up on a thread of its own (one `pthread_create` per group) and every wait
    /// can time out. Blocking saves that per-group cost, but joining and a first exchange
    /// with a peer block inside NCCL until the peers arrive: only the wait for a request's
    /// completion keeps its timeout (and aborts as before).
    pub blocking: bool,
}

/// Default [`NcclConfig::timeout`].
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

impl NcclConfig {
    /// Rank `rank` of `nranks` on GPU `ordinal`, with the shared `id`; both timeouts 120 s.
    pub fn new(ordinal: u32, rank: u32, nranks: u32, id: NcclId) -> NcclConfig {
        NcclConfig {
            ordinal,
            rank,
            nranks,
            id,
            init_timeout: DEFAULT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            blocking: false,
        }
    }
    /// Sets the `blocking` field: a blocking communicator.
    pub fn blocking(mut self, on: bool) -> NcclConfig {
        self.blocking = on;
        self
    }
    /// Sets both timeouts (joining, and each submit and request).
    pub fn timeout(mut self, t: Duration) -> NcclConfig {
        self.init_timeout = t;
        self.timeout = t;
        self
    }
    /// Sets the timeout of joining the communicator only.
    pub fn init_timeout(mut self, t: Duration) -> NcclConfig {
        self.init_timeout = t;
        self
    }
    /// Sets the timeout of each submit and request only.
    pub fn op_timeout(mut self, t: Duration) -> NcclConfig {
        self.timeout = t;
        self
    }
    /// Checks what can be checked without NCCL: at least one rank, the rank below the count,
    /// a counts that fits NCCL's `int`, a non-zero timeout.
    ///
    /// ```
    /// use ferry::engine::nccl::{NcclConfig, NcclId};
    /// let id = NcclId::from_bytes([0; 128]);
    /// assert!(NcclConfig::new(0, 1, 2, id).validate().is_ok());
    /// assert!(NcclConfig::new(0, 2, 2, id).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), NcclError> {
        let bad = |m: String| Err(NcclError::InvalidConfig(m));
        if self.nranks == 0 {
            return bad("the communicator needs at least one rank".into());
        }
        if self.nranks > i32::MAX as u32 {
            return bad(format!("{} ranks is more than NCCL takes", self.nranks));
        }
        if self.rank >= self.nranks {
            return bad(format!(
                "rank {} is not below the number of ranks ({})",
                self.rank, self.nranks
            ));
        }
        if self.timeout.is_zero() || self.init_timeout.is_zero() {
            return bad("the timeouts must be above zero".into());
        }
        Ok(())
    }

    /// The set-up from the environment (see the [module documentation](super)):
    /// `FERRY_NCCL_RANK`, `FERRY_NCCL_NRANKS`, `FERRY_NCCL_DEVICE`, `FERRY_NCCL_ID` or
    /// `FERRY_NCCL_ID_FILE`, `FERRY_NCCL_TIMEOUT_S`, `FERRY_NCCL_INIT_TIMEOUT_S`. With an id file, rank 0 makes the id and
    /// writes it, the others wait for it (up to the timeout).
    pub fn from_env() -> Result<NcclConfig, NcclError> {
        NcclConfig::from_lookup(&|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) over any lookup (tests, config files).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<NcclConfig, NcclError> {
        let num = |k: &str| -> Result<Option<u64>, NcclError> {
            match get(k) {
                None => Ok(None),
                Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                    NcclError::InvalidConfig(format!("${k}={v:?} is not a whole number"))
                }),
            }
        };
        let need = |k: &str| -> Result<u64, NcclError> {
            num(k)?.ok_or_else(|| NcclError::InvalidConfig(format!("${k} is not set")))
        };
        let small = |k: &str, v: u64| -> Result<u32, NcclError> {
            u32::try_from(v).map_err(|_| NcclError::InvalidConfig(format!("${k}={v} is too large")))
        };
        let rank = small("FERRY_NCCL_RANK", need("FERRY_NCCL_RANK")?)?;
        let nranks = small("FERRY_NCCL_NRANKS", need("FERRY_NCCL_NRANKS")?)?;
        let secs = |k: &str| -> Result<Duration, NcclError> {
            Ok(num(k)?.map_or(DEFAULT_TIMEOUT, Duration::from_secs))
        };
        let timeout = secs("FERRY_NCCL_TIMEOUT_S")?;
        let init_timeout = match get("FERRY_NCCL_INIT_TIMEOUT_S") {
            Some(_) => secs("FERRY_NCCL_INIT_TIMEOUT_S")?,
            None => timeout,
        };
        let placeholder = NcclConfig::new(0, rank, nranks, NcclId::from_bytes([0; 128]));
        placeholder.timeout(timeout).validate()?;
        let ordinal = match num("FERRY_NCCL_DEVICE")? {
            Some(d) => small("FERRY_NCCL_DEVICE", d)?,
            None => {
                let gpus = crate::engine::cuda::probe().devices.len().max(1) as u32;
                rank % gpus
            }
        };
        let id = match (get("FERRY_NCCL_ID"), get("FERRY_NCCL_ID_FILE")) {
            (Some(hex), _) => NcclId::from_hex(&hex)
                .map_err(|e| NcclError::BadId(format!("$FERRY_NCCL_ID: {e}")))?,
            (None, Some(path)) => NcclId::exchange_file(path.as_ref(), rank, timeout)?,
            (None, None) => {
                return Err(NcclError::InvalidConfig(
                    "set $FERRY_NCCL_ID (hex) or $FERRY_NCCL_ID_FILE (a path)".into(),
                ))
            }
        };
        Ok(NcclConfig::new(ordinal, rank, nranks, id)
            .op_timeout(timeout)
            .init_timeout(init_timeout))
    }
}
